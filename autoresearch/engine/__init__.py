"""The engine: one reconcile + scheduling pass over the ledger and a backend (runtime), the
job operations the facade and the loop share (jobs), the pure scheduler and fair share, what
a job is (spec) and sees (isolation, grants), reading what an attempt wrote (ingest,
metrics), hearing endings (watcher, passd). It imports the stores and the backends, never
the loop, the mirror, the facade or a face (docs/architecture.md)."""
