"""Background handlers: flush, copy, push, replication, the PostgreSQL bridges."""
