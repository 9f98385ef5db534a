"""In-process shared nodes for the upkeep tests: a real ``SharedNode`` (real PostgreSQL, real
moto S3) per node, built from the rig's configuration as ``capella serve`` builds it, so a test
can call one compaction or janitor pass and look at PostgreSQL and the bucket in between."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from capella.auth.secret import Secrets
from capella.config import load_config
from capella.core.base_queue import BaseQueue
from capella.core.definition import QueueSettings, SealLimits
from capella.core.message import Draft, LogMessage, SaveMode, stored_message
from capella.shared.database import Pool, open_pool, target_of
from capella.shared.node import SharedNode
from capella.storage import Storage, open_storage
from support.shared import CLUSTER, MOUNT, SharedRig, Value

# The background passes stay out of the way: each test runs the passes it means.
QUIET: dict[str, Value] = {"compact_interval": "1h", "compact_after": "10ms"}


@asynccontextmanager
async def shared_node(
    rig: SharedRig,
    i: int,
    clock: Callable[[], float] | None = None,
    wrap: Callable[[Storage], Storage] | None = None,
    **shared: Value,
) -> AsyncIterator[tuple[SharedNode, Storage]]:
    """Node ``i`` of ``rig``, in this process, started; its S3 storage beside it (``wrap``:
    a test's storage around the real one)."""
    path = rig.write_config(i, rig.config_text(i, shared={**QUIET, **shared}))
    config = load_config(path)
    assert config.shared is not None
    mount = config.mounts[MOUNT]
    storage = open_storage(mount.provider, mount.options)
    if wrap is not None:
        storage = wrap(storage)
    options: dict[str, Any] = {} if clock is None else {"clock": clock}
    node = SharedNode(config, config.shared, {MOUNT: storage}, Secrets(config.secrets), **options)
    await node.start(CLUSTER, QueueSettings(storage="shared"), set(config.mounts))
    try:
        yield node, storage
    finally:
        await node.close()
        await storage.close()


@asynccontextmanager
async def database(rig: SharedRig) -> AsyncIterator[Pool]:
    """A pool on the rig's database, to look at its rows."""
    config = load_config(rig.write_config(99, rig.config_text(99)))
    assert config.shared is not None
    pool = await open_pool(target_of(config.shared, Secrets(config.secrets)))
    try:
        yield pool
    finally:
        await pool.close()


async def create(node: SharedNode, name: str, *, max_messages: int = 10_000) -> BaseQueue:
    queue, created = await node.create(
        name, QueueSettings(storage="shared", block=SealLimits(max_messages=max_messages))
    )
    assert created
    return queue


def drafts(first: int, count: int, source: str | None = None) -> list[Draft]:
    """Small messages, some with headers, an external time, a source and an external id."""
    out = []
    for n in range(first, first + count):
        out.append(
            Draft(
                f"m{n}".encode(),
                source=source,
                external_id=None if source is None else n,
                external_time=None if n % 3 else 1_700_000_000.0 + n,
                headers={"k": str(n)} if n % 5 == 0 else {},
                segment=n % 4,
            )
        )
    return out


async def produce(queue: BaseQueue, batch: list[Draft], save: SaveMode = SaveMode.WAIT) -> list[int]:
    return [a.id for a in await queue.append(batch, save)]


async def read_all(
    queue: BaseQueue, after: int = 0, page: int = 1000, limit: int = 10**9
) -> list[LogMessage]:
    """Every message past ``after`` (at most ``limit``), page by page (bounded)."""
    out: list[LogMessage] = []
    for _ in range(10_000):
        found = (await queue.read_page(after, min(page, limit - len(out)))).messages()
        if not found:
            return out
        out += found
        after = found[-1].id
        if len(out) >= limit:
            return out
    raise AssertionError("read_all did not finish")


def rendered(messages: list[LogMessage]) -> list[dict[str, Any]]:
    return [stored_message(m) for m in messages]


async def rows(pool: Pool, queue: str) -> list[tuple[int, int, str]]:
    found = await pool.fetch(
        "select s.first_id, s.last_id, o.key from capella_segments s "
        "join capella_objects o using (object_id) where s.queue = $1 order by s.first_id",
        queue,
    )
    return [(r[0], r[1], r[2]) for r in found]


async def live_objects(pool: Pool) -> int:
    return int(await pool.fetchval("select count(*) from capella_objects where state = 'live'"))


async def all_keys(storage: Storage) -> list[str]:
    return await storage.list("")
