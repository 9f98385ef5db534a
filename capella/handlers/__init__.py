"""Background jobs: one module per handler type, and the supervisor that runs them.

A handler type implements one pass (``run_once``); the supervisor owns the timing, the
status and the persisted definitions.
"""
