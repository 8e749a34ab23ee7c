"""The stores: the ledger (SQLite, WAL: the truth), the engine's queries (jobstore) and the
mirror's cheap side (outbox). With loop/store.py, health/store.py and tracking/_store.py, the
only places with SQL (docs/architecture.md)."""
