"""Background jobs, one module per handler type."""
