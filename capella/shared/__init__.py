"""Shared queues: queues whose bytes live in S3 objects and whose order lives in PostgreSQL.

Any number of nodes configured with the same ``[shared]`` table write and read a shared queue;
none keeps state of its own for it, only caches. A node buffers the batches of every shared
queue for ``flush_interval`` (or ``flush_bytes``), PUTs one object, then one PostgreSQL
transaction gives the batches their ids and rejects duplicates (docs/shared.md). Imported only
by ``capella.server``, and only when ``[shared]`` is configured.
"""
