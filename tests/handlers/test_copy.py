"""The copy handler between local queues: order, identity, exactly once, no loops, receipts."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest
from support.supervisor import launched, refused, started
from support.wait import holds, until

from capella.config import Config, parse_config
from capella.core.cluster import Cluster
from capella.core.message import Draft, SaveMode
from capella.errors import StorageUnavailable
from capella.handlers.copy import CopyHandler
from capella.links.registry import Links
from capella.wire.copy import CopyParams
from capella.wire.params import decode_params


@pytest.fixture
def cluster_config(tmp_path: Path) -> Config:
    return parse_config(
        {
            "cluster": {"name": "dc1", "data_dir": str(tmp_path / "data")},
            "queue_defaults": {"block": {"max_messages": 50}},
        },
        {},
        base=tmp_path,
    )


def copier(cluster: Cluster, source: str, to: str, **params: object) -> CopyHandler:
    return CopyHandler(
        cluster, [source], decode_params(CopyParams, {"to": to, "wait": 0, **params}), Links(cluster)
    )


async def all_messages(cluster: Cluster, name: str) -> list[tuple[str, int, bytes]]:
    page = await cluster.queue(name).read_after(0, 10_000)
    return [(m.source, m.external_id, m.payload) for m in page.messages]


async def test_copy_keeps_order_identity_and_metadata(cluster: Cluster) -> None:
    src, _ = await cluster.put_queue("edge", {})
    await cluster.put_queue("dc", {})
    await src.append(
        [Draft(f"m{i}".encode(), segment=i % 3, headers={"k": str(i)}) for i in range(120)], SaveMode.WAIT
    )
    await src.append([Draft(b"ext", source="sensor-7", external_id=42, external_time=1_600_000_000.0)])
    result = await copier(cluster, "edge", "dc").run_once()
    assert result.items == 121
    copied = (await cluster.queue("dc").read_after(0, 1000)).messages
    original = (await src.read_after(0, 1000)).messages
    assert [(m.source, m.external_id, m.external_time, m.segment, m.headers, m.payload) for m in copied] == [
        (m.source, m.external_id, m.external_time, m.segment, m.headers, m.payload) for m in original
    ]
    cursor = src.subscription("copy-to-dc")
    assert cursor.last_id == src.last_id and cursor.replica


async def test_a_repeated_transfer_stores_nothing_twice(cluster: Cluster) -> None:
    src, _ = await cluster.put_queue("edge", {})
    await cluster.put_queue("dc", {})
    await src.append([Draft(f"m{i}".encode()) for i in range(80)], SaveMode.WAIT)
    await copier(cluster, "edge", "dc").run_once()
    # As after a crash between the append and the cursor commit: the batch is sent again.
    await src.commit("copy-to-dc", 30, reset=True)
    result = await copier(cluster, "edge", "dc").run_once()
    assert result.items == 0
    assert cluster.queue("dc").stats()["messages"] == 80
    assert cluster.queue("dc").counters.duplicates == 50


async def test_two_copies_in_opposite_directions_converge_without_loops(cluster: Cluster) -> None:
    a, _ = await cluster.put_queue("a", {})
    b, _ = await cluster.put_queue("b", {})
    await a.append([Draft(f"a{i}".encode()) for i in range(60)], SaveMode.WAIT)
    await b.append([Draft(f"b{i}".encode(), source="dc2") for i in range(40)], SaveMode.WAIT)
    a_to_b, b_to_a = copier(cluster, "a", "b"), copier(cluster, "b", "a")
    for _ in range(3):
        await a_to_b.run_once()
        await b_to_a.run_once()
    assert sorted(await all_messages(cluster, "a")) == sorted(await all_messages(cluster, "b"))
    assert a.stats()["messages"] == b.stats()["messages"] == 100
    # Quiet: more passes change nothing.
    for _ in range(2):
        assert (await a_to_b.run_once()).items + (await b_to_a.run_once()).items == 0
    assert a.stats()["messages"] == b.stats()["messages"] == 100
    assert a_to_b.status().lag == 0


async def test_segment_filter_copies_only_those_and_still_advances(cluster: Cluster) -> None:
    src, _ = await cluster.put_queue("edge", {})
    await cluster.put_queue("alerts", {})
    await src.append([Draft(b"x", segment=s) for s in (1, 9, 2, 9, 3)], SaveMode.WAIT)
    await copier(cluster, "edge", "alerts", segments=[[9, 9]]).run_once()
    assert [m.segment for m in (await cluster.queue("alerts").read_after(0, 10)).messages] == [9, 9]
    assert src.subscription("copy-to-alerts").last_id == 5


async def test_a_missing_destination_is_a_clear_error_and_loses_nothing(cluster: Cluster) -> None:
    src, _ = await cluster.put_queue("edge", {})
    await cluster.put_queue("dc", {})
    async with started(cluster) as supervisor:
        await supervisor.put(
            "up", {"type": "copy", "params": {"from": "edge", "to": "dc", "wait": 0}, "started": False}
        )
        await src.append([Draft(b"kept")], SaveMode.WAIT)
        await cluster.drop_queue("dc")
        state = await supervisor.run_now("up")
        assert state.last_error is not None and "no queue 'dc'" in state.last_error.message
        await cluster.put_queue("dc", {})
        state = await supervisor.run_now("up")
        assert state.last_error is None and state.items == 1
        assert (await all_messages(cluster, "dc")) == [("dc1", 1, b"kept")]
        assert msgspec.to_builtins(state.info())["status"]["lag"] == 0


async def test_a_started_copy_follows_new_messages_and_serves_receipts(cluster: Cluster) -> None:
    src, _ = await cluster.put_queue("edge", {})
    await cluster.put_queue("dc", {})
    async with started(cluster) as supervisor:
        await supervisor.put("up", {"type": "copy", "queues": ["edge"], "params": {"to": "dc", "wait": "1s"}})
        answers = await src.append([Draft(b"hello")], SaveMode.WAIT)
        holders = await src.wait_replicas(answers[0].id, 1, 5.0)
        assert holders == ["copy-to-dc"]
        assert (await all_messages(cluster, "dc")) == [("dc1", 1, b"hello")]
        state = await supervisor.stop_handler("up")
        runs = state.runs
        await holds(lambda: state.runs == runs, 0.1, "a stopped copy not running")
        assert state.runs == runs


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({}, "params.to"),
        ({"to": "nowhere"}, "params.to"),
        ({"to": "dc2/orders"}, "params.to"),
        ({"to": "dc", "from": "a/b/c"}, "params.from"),
        ({"to": "dc", "batch": 0}, "params.batch"),
        ({"to": "dc", "segments": [[5, 1]]}, "params.segments"),
        ({"to": "dc", "save": "sometimes"}, None),
    ],
)
async def test_bad_copy_definitions_are_refused(
    cluster: Cluster, params: dict[str, object], field: str | None
) -> None:
    await cluster.put_queue("edge", {})
    await cluster.put_queue("dc", {})
    async with started(cluster) as supervisor:
        error = await refused(supervisor, "c", {"type": "copy", "queues": ["edge"], "params": params})
        if field is not None:
            assert error.details.get("field") == field


async def test_copying_a_queue_into_itself_fails_the_pass(cluster: Cluster) -> None:
    await cluster.put_queue("loop", {})
    with pytest.raises(StorageUnavailable, match="into itself"):
        await copier(cluster, "loop", "loop").run_once()


async def test_a_copy_waiting_for_messages_stops_replaces_and_drops_at_once(cluster: Cluster) -> None:
    await cluster.put_queue("edge", {})
    await cluster.put_queue("dc", {})
    supervisor = await launched(cluster)
    definition = {"type": "copy", "queues": ["edge"], "params": {"to": "dc", "wait": "30s"}}
    loop = asyncio.get_running_loop()
    try:
        for step in ("stop", "replace", "drop"):
            await supervisor.put("up", definition)
            state = supervisor.handler("up")
            await until(lambda s=state: s.running and s.handler.interruptible, what="the pass's long poll")
            started = loop.time()
            if step == "stop":
                await supervisor.stop_handler("up")
            elif step == "replace":
                await supervisor.put("up", {**definition, "started": False})
            else:
                await supervisor.drop("up")
            # Nothing is half done while it waits: no grace (STOP_GRACE, 10 s) to sit out.
            assert loop.time() - started < 1.0, step
    finally:
        await supervisor.close()


async def test_a_copy_stopped_in_a_backlog_ends_after_its_step_with_its_cursor_committed(
    cluster: Cluster,
) -> None:
    src, _ = await cluster.put_queue("edge", {})
    await cluster.put_queue("dc", {})
    for _ in range(40):
        await src.append([Draft(b"x" * 100) for _ in range(500)], SaveMode.NONE)
    supervisor = await launched(cluster)
    loop = asyncio.get_running_loop()
    try:
        definition = {"type": "copy", "queues": ["edge"], "params": {"to": "dc", "batch": 10}}
        await supervisor.put("up", definition)
        dc = cluster.queue("dc")
        await until(lambda: dc.last_id >= 100, what="a hundred messages copied")
        started = loop.time()
        await supervisor.stop_handler("up")
        # The pass ends after the step in progress instead of copying on for its 5 s.
        assert loop.time() - started < 1.0
        copied = dc.last_id
        assert 100 <= copied < 20_000
        assert src.subscription("copy-to-dc").last_id == copied  # each message copied once so far
    finally:
        await supervisor.close()
