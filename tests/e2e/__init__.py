"""Whole servers end to end: relays, scenarios, the original's tools, deployment, the docs, the console."""
