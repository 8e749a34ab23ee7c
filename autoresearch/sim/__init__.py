"""Simulated fleets and replayed training curves."""
