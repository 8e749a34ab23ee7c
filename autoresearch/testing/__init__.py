"""Reusable test suites for extension authors (like ``optuna.testing``)."""
