"""Ack-mode subscriptions (work queues): claims and leases, the in-memory window, and the retry policy."""
