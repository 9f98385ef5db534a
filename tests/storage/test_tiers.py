"""Blocks on an S3 tier (moto through the fault proxy) while S3 misbehaves."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from support.faults import FaultProxy
from support.servers import S3Server
from support.supervisor import launched
from support.wait import until

from capella.config import parse_config
from capella.core.cluster import Cluster
from capella.core.message import Draft, SaveMode
from capella.errors import StorageUnavailable
from capella.handlers.supervisor import Supervisor

pytestmark = pytest.mark.s3


@pytest.fixture
async def tiered(
    tmp_path: Path, s3_server: S3Server, s3_bucket: str, proxy: FaultProxy
) -> AsyncIterator[tuple[Cluster, Supervisor, FaultProxy]]:
    proxy.heal()
    options = s3_server.mount_options(
        s3_bucket, endpoint_url=proxy.url, connect_timeout=1, read_timeout=1, max_attempts=2
    )
    config = parse_config(
        {
            "cluster": {"name": "tiers", "data_dir": str(tmp_path / "data")},
            "mounts": {"default": {"provider": "file"}, "s3": {"provider": "s3", **options}},
            "queue_defaults": {
                "block": {"max_messages": 10},
                "mounts": {"marks": {"0": "default", "1": "s3"}},
            },
        },
        {},
        base=tmp_path,
    )
    cluster = await Cluster.open(config)
    supervisor = await launched(cluster)
    try:
        yield cluster, supervisor, proxy
    finally:
        proxy.heal()
        await supervisor.close()
        await cluster.close()


async def sealed_queue(cluster: Cluster, count: int = 30) -> None:
    q, _ = await cluster.put_queue("t", {})
    await q.append([Draft(payload=f"m{i}".encode()) for i in range(count)], SaveMode.WAIT)
    await until(lambda: q.stats()["blocks"]["by_state"]["sealing"] == 0, what="no block still sealing")


async def sealed_queue_with_archive(cluster: Cluster, supervisor: Supervisor) -> None:
    """Queue "t" with three sealed blocks on mark 0, and a stopped handler "to-s3" for mark 1."""
    await sealed_queue(cluster)
    await supervisor.put(
        "to-s3",
        {"type": "archive", "queues": ["t"], "params": {"conditions": [{"mark": 1}]}, "started": False},
    )


async def test_while_s3_is_down_archive_fails_loudly_and_blocks_stay_readable(
    tiered: tuple[Cluster, Supervisor, FaultProxy],
) -> None:
    cluster, supervisor, proxy = tiered
    await sealed_queue_with_archive(cluster, supervisor)
    proxy.fail_all(503)
    state = await supervisor.run_now("to-s3")
    assert state.last_error is not None and "SlowDown" in state.last_error.message
    assert cluster.queue("t").stats()["blocks"]["by_mark"] == {"0": 3}
    page = await cluster.queue("t").read_after(0, 100)
    assert len(page.messages) == 30
    proxy.heal()
    state = await supervisor.run_now("to-s3")
    assert state.last_error is None and state.items == 3
    assert cluster.queue("t").stats()["blocks"]["by_mark"] == {"1": 3}


async def test_a_block_only_on_s3_answers_storage_unavailable_when_s3_is_down(
    tiered: tuple[Cluster, Supervisor, FaultProxy],
) -> None:
    cluster, supervisor, proxy = tiered
    await sealed_queue_with_archive(cluster, supervisor)
    await supervisor.run_now("to-s3")
    queue = cluster.queue("t")
    queue.unload(idle=0, age=None)
    proxy.fail_all(500)
    with pytest.raises(StorageUnavailable, match="InternalError"):
        await queue.read_after(0, 100)
    proxy.heal()
    page = await queue.read_after(0, 100)
    assert [m.payload for m in page.messages] == [f"m{i}".encode() for i in range(30)]
