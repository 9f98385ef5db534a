"""Shared queues: the object format, the object cache, the node-cluster rig (tests/support/shared.py)."""
