"""The research loop: propose -> launch -> evaluate -> replan, with provenance."""
