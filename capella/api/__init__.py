"""The HTTP API: one module per resource, assembled by ``app.create_app``."""

from __future__ import annotations

from capella.api.app import CLUSTER, SETTINGS, SUPERVISOR, create_app

__all__ = ["CLUSTER", "SETTINGS", "SUPERVISOR", "create_app"]
