"""Handlers on real files: one pass at a time (``run_once``), and the supervisor's loops."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from support.clock import Clock
from support.supervisor import launched, refused, started
from support.wait import holds, until

from capella.config import Config, parse_config
from capella.core.cluster import Cluster
from capella.core.message import Draft, SaveMode
from capella.errors import HandlerNotFound
from capella.handlers.archive import ArchiveHandler
from capella.handlers.expire import ExpireHandler
from capella.handlers.flush import FlushHandler
from capella.handlers.unload import UnloadHandler
from capella.wire.params import decode_params
from capella.wire.upkeep import ArchiveParams, ExpireParams, FlushParams, UnloadParams


def make_config(tmp_path: Path) -> Config:
    return parse_config(
        {
            "cluster": {"name": "edge", "data_dir": str(tmp_path / "data")},
            "storage": {"flush_interval": "1h"},
            "mounts": {
                "default": {"provider": "file", "path": "hot"},
                "warm": {"provider": "file", "path": "warm", "compression": "zstd", "level": 3},
                "cold": {"provider": "file", "path": "cold", "compression": "zstd", "level": 19},
            },
            "queue_defaults": {
                "block": {"max_messages": 10},
                "mounts": {"marks": {"0": "default", "1": "warm", "2": "cold"}},
            },
        },
        {},
        base=tmp_path,
    )


@pytest.fixture
def cluster_config(tmp_path: Path) -> Config:
    return make_config(tmp_path)


# ``cluster`` runs on ``clock``, which the tests move by hand.
pytestmark = pytest.mark.hand_clock


async def filled(cluster: Cluster, name: str, count: int) -> Any:
    q, _ = await cluster.put_queue(name, {})
    await q.append([Draft(payload=f"m{i}".encode()) for i in range(count)], SaveMode.WAIT)
    await until(lambda: q.stats()["blocks"]["by_state"]["sealing"] == 0, what="no block still sealing")
    return q


def block_files(tmp_path: Path, mount: str, queue: str) -> list[str]:
    folder = tmp_path / "data" / mount / queue / "blocks"
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


async def test_expire_by_count_deletes_whole_blocks_from_the_oldest_end(cluster: Cluster) -> None:
    q = await filled(cluster, "ex", 45)
    handler = ExpireHandler(cluster, ["ex"], decode_params(ExpireParams, {"max_messages": 20}))
    result = await handler.run_once()
    assert result.items == 3
    assert q.stats()["first_id"] == 31
    assert q.stats()["messages"] == 15
    page = await q.read_after(0, 100)
    assert [m.id for m in page.messages] == list(range(31, 46))
    new = await q.append([Draft(payload=b"after")], SaveMode.WAIT)
    assert new[0].id == 46


async def test_expire_by_age_and_by_bytes(cluster: Cluster, clock: Clock) -> None:
    q = await filled(cluster, "aged", 30)
    aged = ExpireHandler(cluster, ["aged"], decode_params(ExpireParams, {"max_age": "1h"}))
    assert (await aged.run_once()).items == 0
    clock.now += 3601
    assert (await aged.run_once()).items == 3
    assert q.stats()["blocks"]["by_state"]["sealed"] == 0

    q2 = await filled(cluster, "big", 30)
    one_block = q2.sealed_blocks()[0].bytes
    sized = ExpireHandler(cluster, ["big"], decode_params(ExpireParams, {"max_bytes": one_block * 2}))
    await sized.run_once()
    assert q2.stats()["bytes"] <= one_block * 2


async def test_expired_ids_are_not_reused_after_a_restart(
    tmp_path: Path, clock: Clock, cluster: Cluster
) -> None:
    q = await filled(cluster, "gone", 20)
    await ExpireHandler(cluster, ["gone"], decode_params(ExpireParams, {"max_messages": 1})).run_once()
    assert q.stats()["blocks"]["by_state"]["sealed"] == 0
    await cluster.close()
    cluster2 = await Cluster.open(make_config(tmp_path), clock=clock)
    try:
        q = cluster2.queue("gone")
        assert (await q.read_after(0, 100)).messages == []
        assert (await q.append([Draft(payload=b"x")], SaveMode.WAIT))[0].id == 21
    finally:
        await cluster2.close()


async def test_unload_drops_idle_contents_and_reads_reload_them(cluster: Cluster, clock: Clock) -> None:
    q = await filled(cluster, "mem", 40)
    assert q.stats()["blocks"]["by_state"]["loaded"] == 4
    handler = UnloadHandler(cluster, ["mem"], decode_params(UnloadParams, {"idle": "30s"}))
    assert (await handler.run_once()).items == 0
    clock.now += 31
    result = await handler.run_once()
    assert result.items == 4 and result.bytes > 0
    assert q.stats()["blocks"]["by_state"]["loaded"] == 0
    page = await q.read_after(5, 3)
    assert [m.payload for m in page.messages] == [b"m5", b"m6", b"m7"]
    assert q.stats()["blocks"]["by_state"]["loaded"] >= 1


async def test_archive_moves_blocks_by_age_and_they_stay_readable(
    tmp_path: Path, cluster: Cluster, clock: Clock
) -> None:
    q = await filled(cluster, "tiers", 30)
    params = decode_params(
        ArchiveParams,
        {"conditions": [{"mark": 1, "from_age": "1h", "to_age": "1d"}, {"mark": 2, "from_age": "1d"}]},
    )
    handler = ArchiveHandler(cluster, ["tiers"], params)
    assert (await handler.run_once()).items == 0
    clock.now += 2 * 3600
    result = await handler.run_once()
    assert result.items == 3 and result.bytes > 0
    assert block_files(tmp_path, "hot", "tiers") == []
    assert len(block_files(tmp_path, "warm", "tiers")) == 3
    assert q.stats()["blocks"]["by_mark"] == {"1": 3}
    clock.now += 86400
    await handler.run_once()
    assert block_files(tmp_path, "warm", "tiers") == []
    assert len(block_files(tmp_path, "cold", "tiers")) == 3
    q.unload(idle=0, age=None)
    page = await q.read_after(0, 100)
    assert [m.payload for m in page.messages] == [f"m{i}".encode() for i in range(30)]


async def test_archive_survives_restart_and_cleans_leftovers_of_interrupted_moves(
    tmp_path: Path, cluster: Cluster, clock: Clock
) -> None:
    q = await filled(cluster, "left", 20)
    first, second = q.sealed_blocks()
    hot = tmp_path / "data" / "hot" / "left" / "blocks"
    warm = tmp_path / "data" / "warm" / "left" / "blocks"
    # Interrupted before the manifest switch: a copy on the target that nothing points at.
    warm.mkdir(parents=True)
    (warm / (hot / first.key.rsplit("/", 1)[1]).name).write_bytes(b"half a copy")
    # Interrupted after the switch: the old copy still on the source.
    await q.move_block(second.first_id, 1)
    (hot / second.key.rsplit("/", 1)[1]).write_bytes(b"stale")

    await cluster.close()
    cluster = await Cluster.open(make_config(tmp_path), clock=clock)
    try:
        q = cluster.queue("left")
        params = decode_params(ArchiveParams, {"conditions": [{"mark": 1, "from_age": "1d"}]})
        await ArchiveHandler(cluster, ["left"], params).run_once()
        assert block_files(tmp_path, "hot", "left") == [first.key.rsplit("/", 1)[1]]
        assert block_files(tmp_path, "warm", "left") == [second.key.rsplit("/", 1)[1]]
        page = await q.read_after(0, 100)
        assert [m.id for m in page.messages] == list(range(1, 21))
    finally:
        await cluster.close()


async def test_flush_handler_saves_marked_writes(tmp_path: Path, cluster: Cluster) -> None:
    q, _ = await cluster.put_queue("marked", {"save": "mark", "block": {"max_messages": 1000}})
    await q.append([Draft(payload=b"x")])
    journal = tmp_path / "data" / "hot" / "marked" / "journal"
    assert not journal.exists()
    result = await FlushHandler(
        cluster, ["mark*"], decode_params(FlushParams, {"interval": "100ms"})
    ).run_once()
    assert result.items == 1
    assert sum(p.stat().st_size for p in journal.iterdir()) > 0


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"type": "expire", "queues": ["ex"], "params": {"interval": 0, "max_age": "1d"}}, "params.interval"),
        (
            {"type": "expire", "queues": ["ex"], "params": {"interval": "-5s", "max_age": "1d"}},
            "params.interval",
        ),
        ({"type": "expire", "queues": ["ex"], "params": {}}, "params.max_age"),
        ({"type": "expire", "queues": ["nope"], "params": {"max_age": "1d"}}, "queues"),
        ({"type": "shred", "queues": ["ex"]}, "type"),
        ({"type": "unload", "queues": ["ex"], "params": {"colour": 1}}, "params.colour"),
        ({"type": "archive", "queues": ["ex"], "params": {"conditions": []}}, "params.conditions"),
        (
            {"type": "archive", "queues": ["ex"], "params": {"conditions": [{"mark": 7}]}},
            "params.conditions[0].mark",
        ),
        ({"type": "expire", "queues": ["ex"], "params": {"max_age": "1d"}, "started": "yes"}, "started"),
    ],
)
async def test_bad_definitions_are_refused_naming_the_field(
    cluster: Cluster, body: dict[str, Any], field: str
) -> None:
    await cluster.put_queue("ex", {})
    async with started(cluster) as supervisor:
        assert (await refused(supervisor, "h", body)).details.get("field") == field
        with pytest.raises(HandlerNotFound):
            supervisor.handler("h")


async def test_nanosecond_durations_from_the_original_api_are_accepted() -> None:
    params = decode_params(ExpireParams, {"max_age": 86_400_000_000_000, "interval": 30})
    assert params.max_age == 86400.0 and params.interval == 30.0


async def test_supervisor_persists_handlers_and_their_started_state(
    tmp_path: Path, cluster: Cluster, clock: Clock
) -> None:
    await filled(cluster, "ex", 30)
    supervisor = await launched(cluster, clock=clock)
    state, created = await supervisor.put(
        "trim", {"type": "expire", "queue": "ex", "params": {"max_messages": 10, "interval": "1h"}}
    )
    assert created and state.started
    await until(lambda: state.runs, what="the first pass, which runs at once")
    assert state.runs == 1 and state.items == 2 and state.last_complete == clock.now
    await supervisor.put("idle", {"type": "unload", "queues": ["*"], "started": False})
    await supervisor.close()
    await cluster.close()

    cluster = await Cluster.open(make_config(tmp_path), clock=clock)
    supervisor = await launched(cluster, clock=clock)
    try:
        by_name = {s.name: msgspec.to_builtins(s.info()) for s in supervisor.handlers()}
        assert by_name["trim"]["started"] is True and by_name["idle"]["started"] is False
        assert by_name["trim"]["params"]["max_messages"] == 10
        assert by_name["idle"]["status"]["next_run"] is None
    finally:
        await supervisor.close()
        await cluster.close()


async def test_a_failing_pass_is_recorded_backs_off_and_clears_on_success(
    tmp_path: Path, cluster: Cluster, clock: Clock
) -> None:
    q = await filled(cluster, "arch", 20)
    async with started(cluster, clock=clock) as supervisor:
        await supervisor.put(
            "move",
            {
                "type": "archive",
                "queues": ["arch"],
                "params": {"conditions": [{"mark": 1}]},
                "started": False,
            },
        )
        # Break the warm tier: its directory becomes a file.
        warm = tmp_path / "data" / "warm"
        warm.mkdir(parents=True, exist_ok=True)
        warm.rmdir()
        warm.write_text("not a directory")
        state = await supervisor.run_now("move")
        assert state.last_error is not None and "arch" in state.last_error.message
        assert state.failures == 1
        assert q.stats()["blocks"]["by_mark"] == {"0": 2}
        assert (await q.read_after(0, 100)).messages[0].id == 1  # still readable from the old tier
        warm.unlink()
        state = await supervisor.run_now("move")
        assert state.last_error is None and state.failures == 0 and state.items == 2


async def test_stop_really_stops(cluster: Cluster) -> None:
    await filled(cluster, "tick", 5)
    async with started(cluster) as supervisor:
        await supervisor.put("fast", {"type": "flush", "queues": ["tick"], "params": {"interval": "10ms"}})
        await until(lambda: supervisor.handler("fast").runs >= 2, what="two passes")
        state = await supervisor.stop_handler("fast")
        runs = state.runs
        assert runs >= 2 and not state.started
        await holds(lambda: state.runs == runs, 0.1, "a stopped handler not running")  # ten intervals
        assert state.runs == runs
        assert msgspec.to_builtins(state.info())["status"]["next_run"] is None
        await supervisor.start_handler("fast")
        await until(lambda: supervisor.handler("fast").runs > runs, what="a pass after the restart")
        await supervisor.drop("fast")
        with pytest.raises(HandlerNotFound):
            supervisor.handler("fast")


async def test_a_journal_that_outlived_an_expired_block_is_not_replayed(
    tmp_path: Path, clock: Clock, cluster: Cluster
) -> None:
    q, _ = await cluster.put_queue("outlive", {})
    await q.append([Draft(payload=b"x")] * 5, SaveMode.WAIT)
    journal_dir = tmp_path / "data" / "hot" / "outlive" / "journal"
    saved = {p.name: p.read_bytes() for p in journal_dir.iterdir()}
    await q.append([Draft(payload=b"y")] * 5, SaveMode.WAIT)
    await until(
        lambda: q.stats()["blocks"]["by_state"]["sealed"] == 1 and not any(journal_dir.iterdir()),
        what="the block sealed and its journal gone",
    )
    await ExpireHandler(cluster, ["outlive"], decode_params(ExpireParams, {"max_messages": 1})).run_once()
    await cluster.close()
    # A crash between the seal's manifest update and its journal delete leaves this behind.
    for name, data in saved.items():
        (journal_dir / name).write_bytes(data)
    cluster = await Cluster.open(make_config(tmp_path), clock=clock)
    try:
        q = cluster.queue("outlive")
        assert (await q.read_after(0, 100)).messages == []
        assert q.last_id == 10
        assert (await q.append([Draft(payload=b"z")], SaveMode.WAIT))[0].id == 11
    finally:
        await cluster.close()


async def test_a_stored_definition_that_no_longer_builds_is_kept_and_reports(
    tmp_path: Path, clock: Clock, cluster: Cluster
) -> None:
    await filled(cluster, "arc", 5)
    supervisor = await launched(cluster, clock=clock)
    await supervisor.put(
        "move",
        {"type": "archive", "queues": ["arc"], "params": {"conditions": [{"mark": 2}]}, "started": False},
    )
    await supervisor.close()
    # The queue loses its mark 2 mapping; the handler can no longer be built.
    await cluster.put_queue("arc", {"mounts": {"marks": {"0": "default", "1": "warm"}}})
    async with started(cluster, clock=clock) as supervisor:
        await supervisor.put("trim", {"type": "expire", "queues": ["arc"], "params": {"max_age": "30d"}})
        state = await supervisor.run_now("move")
        assert state.last_error is not None and "cannot be loaded" in state.last_error.message
        assert msgspec.to_builtins(state.info())["params"]["conditions"] == [
            {"mark": 2, "from_age": 0.0, "to_age": None}
        ]
    async with started(cluster, clock=clock) as supervisor:
        assert [s.name for s in supervisor.handlers()] == ["move", "trim"]
