"""``shared_rig``: a shared cluster (tests/support/shared.py) for one test.

Function scope: each test gets a database, a bucket and nodes of its own, on the session's
PostgreSQL and moto servers (starting those is what costs). ``@pytest.mark.shared_rig(...)``
passes ``SharedRig`` options, e.g. ``flush_interval="50ms"``; ``durable=True`` gives the test a
PostgreSQL of its own with fsync and synchronous_commit on, which it may stop and restart.
Skipped, saying why, where Debian's PostgreSQL is not installed.

``s3_proxy`` and ``pg_proxy``: a ``TcpProxy`` (tests/support/tcp_proxy.py) in front of the
session's moto or PostgreSQL, for a test to cut; ``http``: an aiohttp session.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
from support.pg import PgServer, available
from support.servers import S3Server
from support.shared import SharedRig
from support.tcp_proxy import TcpProxy


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "shared_rig(**options): SharedRig options for the shared_rig fixture")


@pytest.fixture
def shared_rig(request: pytest.FixtureRequest, tmp_path: Path, s3_server: S3Server) -> Iterator[SharedRig]:
    missing = available()
    if missing is not None:
        pytest.skip(f"shared queues need PostgreSQL: {missing}")
    marker = request.node.get_closest_marker("shared_rig")
    options = dict(marker.kwargs) if marker is not None else {}
    pg: PgServer | None = None if options.get("durable") else request.getfixturevalue("pg_server")
    rig = SharedRig(tmp_path / "rig", pg=pg, s3=s3_server, **options)
    try:
        yield rig
    finally:
        rig.close()


@pytest.fixture
def s3_proxy(s3_server: S3Server) -> Iterator[TcpProxy]:
    proxy = TcpProxy(s3_server.port).start()
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture
def pg_proxy(pg_server: PgServer) -> Iterator[TcpProxy]:
    proxy = TcpProxy(pg_server.port).start()
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30.0)) as session:
        yield session
