"""One shared cluster for a whole test module, and what its tests ask of it.

Starting three ``capella serve`` nodes costs seconds, so the behaviour tests of shared queues
(tests/shared/test_nodes.py, test_reads.py, test_refusals.py, tests/security/
test_shared_attacks.py) share one ``SharedRig`` per module, each test on queues of its own name.
``module_rig`` builds it on the session's PostgreSQL and moto (skipped, saying why, where
Debian's PostgreSQL is missing); ``clients`` opens an ``AsyncClient`` per node; ``read_all``
pages through a queue; ``same_messages`` compares reads while leaving out the times, which
two queues written apart never share.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import msgspec
import pytest

from capella.client import AsyncClient
from capella.wire.messages import StoredMessage
from support.pg import available
from support.shared import CLUSTER, SharedRig

PAGE = 1000


def module_rig(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, nodes: int = 3, **options: Any
) -> Iterator[SharedRig]:
    """For a module-scoped fixture: ``yield from module_rig(request, tmp_path_factory)``."""
    missing = available()
    if missing is not None:
        pytest.skip(f"shared queues need PostgreSQL: {missing}")
    rig = SharedRig(
        tmp_path_factory.mktemp("rig"),
        pg=request.getfixturevalue("pg_server"),
        s3=request.getfixturevalue("s3_server"),
        **options,
    )
    try:
        rig.start(nodes)
        yield rig
    finally:
        rig.close()


@contextlib.asynccontextmanager
async def clients(urls: list[str], **options: Any) -> AsyncIterator[list[AsyncClient]]:
    """One client per url (``options``: ``username``, ``password``, ``timeout``...)."""
    options.setdefault("timeout", 30.0)
    opened = [AsyncClient(url, **options) for url in urls]
    try:
        yield opened
    finally:
        for client in opened:
            await client.close()


async def read_all(
    client: AsyncClient, queue: str, *, binary: bool = True, **filters: Any
) -> list[StoredMessage]:
    """Every message of ``queue`` from the start, a page at a time (bounded by its last id)."""
    found: list[StoredMessage] = []
    after = 0
    for _ in range(10_000):
        page = await client.read(queue, after=after, limit=PAGE, binary=binary, **filters)
        found.extend(page.messages)
        if page.last_id <= after:
            return found
        after = page.last_id
    raise AssertionError(f"{queue}: still reading after 10,000 pages")


def timeless(message: StoredMessage | dict[str, Any]) -> dict[str, Any]:
    """A message read back, as a dict without ``time`` (and without an ``external_time`` that
    only repeated it): what two equal writes to two queues share. The default source of a
    node's local queue (``cluster@node``) reads as the cluster's, a shared queue's."""
    shown = dict(msgspec.to_builtins(message)) if isinstance(message, StoredMessage) else dict(message)
    if isinstance(shown.get("source"), str) and shown["source"].startswith(f"{CLUSTER}@"):
        shown["source"] = CLUSTER
    if shown.get("external_time") == shown.get("time"):
        shown.pop("external_time", None)
    shown.pop("time", None)
    return shown


def listening(rig: SharedRig) -> int:
    """How many LISTEN connections the nodes hold (three per node once each listens)."""
    return int(
        rig.pg.psql(
            rig.database,
            "select count(*) from pg_stat_activity "
            "where datname = current_database() and query like 'LISTEN%'",
        ).strip()
    )


def cut_listeners(rig: SharedRig) -> int:
    """Terminate every node's LISTEN connections (as a network cut would); how many there were."""
    return int(
        rig.pg.psql(
            rig.database,
            "select count(pg_terminate_backend(pid)) from pg_stat_activity "
            "where datname = current_database() and query like 'LISTEN%'",
        ).strip()
    )
