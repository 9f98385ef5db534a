"""No silent death: the one backoff rule, the supervised loop, and each background task restarting.

The loop tests drive the failure path tens of thousands of times with an injected clock and
sleep: the delays stay bounded and finite, nothing overflows, and the loop keeps going. The
queue tests inject failures no real disk produces (a ``RuntimeError`` from a storage call)
through ``FlakyStorage`` and check that each task is restarted, counted and reported.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from support.clock import Clock
from support.configs import file_config
from support.faults import FlakyStorage
from support.supervisor import launched
from support.wait import parked, until

from capella.backoff import backoff
from capella.config import Config, parse_config
from capella.core.cluster import Cluster
from capella.core.loops import TaskFailures, keep_running
from capella.core.message import Draft, SaveMode
from capella.core.work.retry import RetrySettings, retry_delay
from capella.errors import CapellaError, StorageUnavailable
from capella.storage import Storage
from capella.storage.memory import MemoryStorage

FAILURES = 50_000


def test_backoff_doubles_from_base_to_cap_and_stays_there_at_any_count() -> None:
    assert backoff(0, 0.1, 2.0) == 0.0
    assert [backoff(n, 0.1, 2.0) for n in range(1, 7)] == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0]
    previous = 0.0
    for failures in range(FAILURES):
        delay = backoff(failures, 0.1, 30.0)
        assert previous <= delay <= 30.0
        previous = delay
    for huge in (1023, 1024, 1025, 10**6, 2**70, 10**100):
        assert backoff(huge, 0.1, 30.0) == 30.0
        assert backoff(huge, 1.0, 3600.0) == 3600.0
    assert backoff(-5, 0.1, 2.0) == 0.0


def test_work_queue_retry_delays_use_the_same_rule_at_any_count() -> None:
    policy = RetrySettings(delay=1.0, max_delay=300.0, jitter=0.0)
    assert [retry_delay(policy, n, 0.5) for n in (1, 2, 3)] == [1.0, 2.0, 4.0]
    for failures in (0, 59, 60, 61, 1024, 10**9):
        assert 0.0 < retry_delay(policy, failures, 0.99) <= 300.0


async def test_a_supervised_loop_that_keeps_failing_keeps_restarting_with_bounded_delays() -> None:
    calls = 0
    delays: list[float] = []
    reports: list[str] = []
    failures = TaskFailures()

    async def body() -> None:
        nonlocal calls
        calls += 1
        if calls <= FAILURES:
            raise RuntimeError(f"boom {calls}") if calls % 2 else StorageUnavailable("disk full")

    async def sleep(seconds: float) -> None:
        delays.append(seconds)

    await keep_running(
        "flush:q", body, failures=failures, report=reports.append, sleep=sleep, clock=lambda: 0.0, cap=2.0
    )
    assert calls == FAILURES + 1
    assert failures.counts == {"flush:q": FAILURES}
    assert len(reports) == FAILURES and reports[-1] == "disk full"
    assert reports[0] == "flush:q crashed: RuntimeError('boom 1')"
    assert all(math.isfinite(d) and 0.1 <= d <= 2.0 for d in delays)
    assert delays[:5] == [0.1, 0.2, 0.4, 0.8, 1.6] and delays[-1] == 2.0


async def test_a_loop_that_ran_a_while_before_failing_starts_a_new_streak() -> None:
    now = 0.0
    calls = 0
    delays: list[float] = []

    async def body() -> None:
        nonlocal calls, now
        calls += 1
        now += 10.0  # each run lasts longer than the cap
        if calls <= 100:
            raise RuntimeError("again")

    async def sleep(seconds: float) -> None:
        delays.append(seconds)

    await keep_running("tick", body, failures=TaskFailures(), sleep=sleep, clock=lambda: now, cap=2.0)
    assert delays == [0.1] * 100


async def test_cancelling_a_supervised_loop_ends_it() -> None:
    async def body() -> None:
        await asyncio.Event().wait()

    task = asyncio.create_task(keep_running("x", body, failures=TaskFailures()))
    # The loop is inside its body when it is cancelled.
    await parked("test_cancelling_a_supervised_loop_ends_it.<locals>.body")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


# --- each background task of a queue, on a storage that fails on purpose --------------------


@pytest.fixture
def flaky() -> FlakyStorage:
    return FlakyStorage(MemoryStorage())


@pytest.fixture
def cluster_config(tmp_path: Path) -> Config:
    return file_config(tmp_path, block={"max_messages": 10})


# ``cluster`` runs on ``clock``, which the tests move by hand.
pytestmark = pytest.mark.hand_clock


@pytest.fixture
def cluster_mounts(flaky: FlakyStorage) -> dict[str, Storage]:
    return {"default": flaky}


def drafts(n: int) -> list[Draft]:
    return [Draft(payload=f"m{i}".encode()) for i in range(n)]


# Where a queue's cursor changes go before a snapshot (capella.core.subscription_store).
CURSOR_LOG = "subscriptions/log/00000000000000000000.log"


async def until_stored(storage: FlakyStorage, key: str, text: bytes) -> None:
    async def stored() -> bool:
        return bool(await storage.list(key)) and text in await storage.get(key)

    await until(stored, 5.0, f"{key} to hold {text!r}")


async def test_a_pass_that_raises_a_plain_python_error_shows_the_code_internal(
    cluster: Cluster, flaky: FlakyStorage, api: TestClient[web.Request, web.Application]
) -> None:
    q, _ = await cluster.put_queue("q", {})
    await q.append(drafts(20), SaveMode.WAIT)
    await until(lambda: q.stats()["blocks"]["by_state"]["sealed"] == 2, 5.0)
    flaky.fail(".blk", RuntimeError("bug in a provider"))
    expire = {"type": "expire", "queues": ["q"], "params": {"max_messages": 10}, "started": False}
    assert (await api.put("/v1/handlers/trim", json=expire)).status == 201
    ran = await (await api.post("/v1/handlers/trim/run")).json()
    error = ran["status"]["last_error"]
    assert error["message"] == "internal error: RuntimeError('bug in a provider')"
    assert error["code"] == "internal"
    assert ran["pass"]["ok"] is False and ran["pass"]["error"] == error["message"]


async def test_a_crashing_flush_fails_its_writers_then_the_flusher_restarts(
    cluster: Cluster, flaky: FlakyStorage
) -> None:
    q, _ = await cluster.put_queue("q", {})
    flaky.fail("/journal/", RuntimeError("bug in a provider"))
    with pytest.raises(CapellaError) as caught:
        await q.append(drafts(3), SaveMode.WAIT)
    assert caught.value.code == "internal"
    assert "bug in a provider" in caught.value.message
    # The flush that failed answered its writers; the flusher reports it to the supervisor next.
    await until(lambda: cluster.task_failures.counts == {"flush:q": 1}, 5.0)
    assert q.last_error == "flush:q crashed: RuntimeError('bug in a provider')"
    # The restarted flusher saved the pending batch by itself; new writes are answered.
    await until(lambda: not q.faults, 5.0)
    assert [a.id for a in await q.append(drafts(2), SaveMode.WAIT)] == [4, 5]
    assert [m.id for m in (await q.read_after(0, 100)).messages] == [1, 2, 3, 4, 5]


async def test_a_failing_flush_answers_each_writer_then_resumes_by_itself(
    cluster: Cluster, flaky: FlakyStorage
) -> None:
    q, _ = await cluster.put_queue("q", {})
    flaky.fail("/journal/", StorageUnavailable("file: cannot append: No space left on device"), times=10**6)
    for _ in range(3):
        with pytest.raises(StorageUnavailable, match="No space left"):
            await asyncio.wait_for(q.append(drafts(1), SaveMode.WAIT), 1.0)
    stats = q.stats()
    assert not stats["writable"]
    assert [(f["step"], f["error"]) for f in stats["faults"]] == [
        ("journal", "file: cannot append: No space left on device")
    ]
    flaky.heal()
    await until(lambda: not q.faults, 5.0)  # no new write needed: the flusher retries (2 s apart at most)
    assert [a.id for a in await q.append(drafts(1), SaveMode.WAIT)] == [4]
    assert cluster.task_failures.counts["flush:q"] >= 3


async def test_a_crashing_seal_is_retried_and_the_block_sealed(cluster: Cluster, flaky: FlakyStorage) -> None:
    q, _ = await cluster.put_queue("q", {})
    flaky.fail("/blocks/", RuntimeError("bug while sealing"), times=2)
    await q.append(drafts(10), SaveMode.WAIT)  # a full block
    await until(lambda: q.stats()["blocks"]["by_state"]["sealed"] == 1, 5.0)
    assert cluster.task_failures.counts == {"seal:q": 2}
    assert q.last_error == "seal:q crashed: RuntimeError('bug while sealing')"
    assert not q.faults
    assert len((await q.read_after(0, 100)).messages) == 10


async def test_a_crashing_release_of_delayed_messages_is_retried(
    cluster: Cluster, flaky: FlakyStorage, clock: Clock
) -> None:
    q, _ = await cluster.put_queue("q", {})
    await q.append([Draft(payload=b"later", deliver_at=clock.now + 60)], SaveMode.WAIT)
    flaky.fail("/journal/", RuntimeError("bug while releasing"))
    clock.now += 61
    q.schedule.changed.set()
    await until(lambda: q.last_id == 2, 5.0)  # the sid took id 1; the delivered message gets 2
    # The flusher crashed under the release, and the release failed with it: both restarted.
    assert cluster.task_failures.counts["flush:q"] == 1
    assert cluster.task_failures.counts["release:q"] == 1
    assert q.last_error is not None
    assert [m.payload for m in (await q.read_after(0, 10)).messages] == [b"later"]


async def test_the_periodic_tick_survives_a_crash_in_one_queue(tmp_path: Path, clock: Clock) -> None:
    flaky = FlakyStorage(MemoryStorage())
    config = parse_config(
        {"cluster": {"name": "edge", "data_dir": str(tmp_path)}, "storage": {"flush_interval": "10ms"}},
        {},
        base=tmp_path,
    )
    cluster = Cluster(config, {"default": flaky}, clock)
    await cluster.start()
    try:
        a, _ = await cluster.put_queue("a", {})
        b, _ = await cluster.put_queue("b", {})
        flaky.fail("a/subscriptions", RuntimeError("bug in a tick"))
        await a.commit("s", 5, save=SaveMode.MARK)
        await until(lambda: cluster.task_failures.counts.get("tick:a") == 1, 5.0)
        assert a.last_error == "periodic pass crashed: RuntimeError('bug in a tick')"
        # The tick goes on, for the other queue and for this one.
        await b.commit("s", 7, save=SaveMode.MARK)
        await a.commit("s", 9, save=SaveMode.MARK)
        await until_stored(flaky, f"b/{CURSOR_LOG}", b'"last_id":7')
        await until_stored(flaky, f"a/{CURSOR_LOG}", b'"last_id":9')
    finally:
        await cluster.close()


async def test_a_failing_handler_is_counted_retried_with_backoff_and_recovers(
    tmp_path: Path, clock: Clock
) -> None:
    config = parse_config(
        {
            "cluster": {"name": "edge", "data_dir": str(tmp_path / "data")},
            "storage": {"flush_interval": "1h"},
            "mounts": {"default": {"provider": "file"}, "warm": {"provider": "file", "path": "warm"}},
            "queue_defaults": {
                "block": {"max_messages": 10},
                "mounts": {"marks": {"0": "default", "1": "warm"}},
            },
        },
        {},
        base=tmp_path,
    )
    cluster = await Cluster.open(config, clock=clock)
    supervisor = await launched(cluster, clock=clock)
    warm = tmp_path / "data" / "warm"
    try:
        q, _ = await cluster.put_queue("q", {})
        await q.append(drafts(20), SaveMode.WAIT)
        await until(lambda: q.stats()["blocks"]["by_state"]["sealed"] == 2, 5.0)
        warm.write_text("a file where the tier's directory should be")
        move = {"type": "archive", "queues": ["q"], "params": {"interval": "1s", "conditions": [{"mark": 1}]}}
        await supervisor.put("move", move)
        await until(lambda: cluster.task_failures.counts.get("handler:move", 0) >= 2, 5.0)
        state = supervisor.handler("move")
        assert state.last_error is not None and "warm" in state.last_error.message
        assert state.next_run is not None and 2.0 <= state.next_run - clock.now <= 60.0
        warm.unlink()
        await until(lambda: state.last_error is None, 10.0)  # the next retry, 4 s at most
        assert q.stats()["blocks"]["by_mark"] == {"1": 2}
    finally:
        await supervisor.close()
        await cluster.close()
