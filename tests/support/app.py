"""The real aiohttp app in process, as a test client."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from aiohttp import web
from aiohttp.test_utils import TestClient

from capella.api import create_app
from capella.auth.authenticator import Authenticator
from capella.auth.store import AuthStore
from capella.config import AuthSettings, ServerSettings
from capella.core.cluster import Cluster
from capella.handlers.supervisor import Supervisor


@contextlib.asynccontextmanager
async def signed_in_api(
    aiohttp_client: Callable[[web.Application], Awaitable[TestClient[web.Request, web.Application]]],
    cluster: Cluster,
    tmp_path: Path,
    settings: ServerSettings,
) -> AsyncIterator[TestClient[web.Request, web.Application]]:
    """The app with authentication on and one admin user, root / root-password."""
    users = AuthStore(tmp_path / "auth")
    users.add_user("root", "root-password", admin=True)
    supervisor = Supervisor(cluster, users=users)
    await supervisor.start()
    authenticator = Authenticator(users, AuthSettings(enabled=True))
    try:
        yield await aiohttp_client(create_app(cluster, settings, supervisor, authenticator=authenticator))
    finally:
        await supervisor.close()
