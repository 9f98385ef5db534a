"""``shared_rig``: a shared cluster (tests/support/shared.py) for one test.

Function scope: each test gets a database, a bucket and nodes of its own, on the session's
PostgreSQL and moto servers (starting those is what costs). ``@pytest.mark.shared_rig(...)``
passes ``SharedRig`` options, e.g. ``flush_interval="50ms"``; ``durable=True`` gives the test a
PostgreSQL of its own with fsync and synchronous_commit on, which it may stop and restart.
Skipped, saying why, where Debian's PostgreSQL is not installed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.pg import PgServer, available
from support.servers import S3Server
from support.shared import SharedRig


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
