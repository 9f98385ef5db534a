"""Capella: a block-based, replicated message broker with an HTTP API."""

__version__ = "0.1.0"
