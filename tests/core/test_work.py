"""Ack-mode subscriptions in the core: leases, acks, retries with backoff, dead letters, recovery."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from support.clock import Clock
from support.configs import file_config

from capella.config import Config
from capella.core.cluster import Cluster
from capella.core.message import Draft, SaveMode
from capella.core.queue import Queue
from capella.core.work import work_queue as work_module
from capella.core.work.retry import RetrySettings, exhausted, parse_policy, retry_delay
from capella.core.work.work_queue import WorkQueue, parse_receipt
from capella.errors import (
    InvalidRequest,
    LeaseLost,
    SubscriptionNotFound,
    UnknownReceipt,
    WrongSubscriptionMode,
)

FIXED = RetrySettings(lease=30.0, max_attempts=3, backoff="fixed", delay=10.0, max_delay=60.0, jitter=0.0)


@pytest.fixture
def cluster_config(tmp_path: Path) -> Config:
    return file_config(tmp_path)


# ``cluster`` runs on ``clock``, which the tests move by hand.
pytestmark = pytest.mark.hand_clock


async def jobs(cluster: Cluster, n: int, policy: RetrySettings = FIXED) -> tuple[Queue, WorkQueue]:
    q, _ = await cluster.put_queue("jobs", {})
    if n:
        await q.append([Draft(f"job{i}".encode()) for i in range(n)])
    await q.define_work("workers", policy)
    return q, q.work("workers")


def receipts(claimed: list[tuple[object, work_module.Entry]]) -> list[tuple[int, int]]:
    return [parse_receipt(e.receipt) for _, e in claimed]


# --- the pure rules ------------------------------------------------------------------------


def test_fixed_backoff_waits_the_same_every_time() -> None:
    assert [retry_delay(FIXED, n, 0.5) for n in (1, 2, 5)] == [10.0, 10.0, 10.0]


def test_exponential_backoff_doubles_up_to_its_cap() -> None:
    policy = RetrySettings(backoff="exponential", delay=1.0, max_delay=20.0, jitter=0.0)
    assert [retry_delay(policy, n, 0.0) for n in (1, 2, 3, 4, 5, 6, 1000)] == [1, 2, 4, 8, 16, 20, 20]


def test_jitter_spreads_the_delay_and_never_passes_the_cap() -> None:
    policy = RetrySettings(backoff="fixed", delay=10.0, max_delay=10.5, jitter=0.2)
    assert retry_delay(policy, 1, 0.0) == pytest.approx(8.0)
    assert retry_delay(policy, 1, 0.5) == pytest.approx(10.0)
    assert retry_delay(policy, 1, 0.999) == pytest.approx(10.5)


def test_attempts_are_exhausted_at_max_attempts_unless_unlimited() -> None:
    assert not exhausted(FIXED, 2) and exhausted(FIXED, 3)
    assert not exhausted(RetrySettings(max_attempts=0), 10**6)


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"lease": 0}, "policy.lease"),
        ({"lease": "2d"}, "policy.lease"),
        ({"max_attempts": -1}, "policy.max_attempts"),
        ({"max_attempts": 2.5}, "policy.max_attempts"),
        ({"backoff": "random"}, "policy.backoff"),
        ({"delay": "soon"}, "policy.delay"),
        ({"delay": "10m", "max_delay": "1m"}, "policy.delay"),
        ({"jitter": 2}, "policy.jitter"),
        ({"dead_letter": ".x"}, "policy.dead_letter"),
        ({"retries": 3}, "policy.retries"),
    ],
)
def test_bad_policies_name_their_field(data: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_policy(data, RetrySettings())
    assert caught.value.details["field"] == field


def test_receipts_parse_or_are_refused() -> None:
    assert parse_receipt("12.3") == (12, 3)
    for bad in ("12", "a.b", "1.2.3", 12, "-1.2"):
        with pytest.raises(InvalidRequest):
            parse_receipt(bad)


# --- claims and acks -----------------------------------------------------------------------


async def test_claims_hand_each_message_to_one_worker_in_id_order(cluster: Cluster, clock: Clock) -> None:
    q, work = await jobs(cluster, 10)
    first = await work.claim(4, None, SaveMode.WAIT)
    second = await work.claim(4, 5.0, SaveMode.WAIT)
    assert [m.id for m, _ in first] == [1, 2, 3, 4] and [m.id for m, _ in second] == [5, 6, 7, 8]
    assert [e.receipt for _, e in first] == ["1.1", "2.1", "3.1", "4.1"]
    assert first[0][1].until == clock.now + 30 and second[0][1].until == clock.now + 5
    assert q.subscription("workers").last_id == 0
    outcomes = await work.ack([(1, 1), (2, 1), (4, 1)], SaveMode.WAIT)
    assert [o.error for o in outcomes] == [None, None, None]
    assert q.subscription("workers").last_id == 2  # 3 is still out
    assert work.status(3, clock.now) == "in_flight" and work.status(4, clock.now) == "done"
    assert work.status(9, clock.now) == "pending"
    # Acking again is harmless; a receipt never handed out is not.
    again = await work.ack([(1, 1), (10, 1)], SaveMode.WAIT)
    assert again[0].error is None and isinstance(again[1].error, UnknownReceipt)
    twice = await work.ack([(3, 1), (3, 1)], SaveMode.WAIT)
    assert twice[0].error is None and isinstance(twice[1].error, InvalidRequest)
    rest = await work.claim(100, None, SaveMode.WAIT)
    assert [m.id for m, _ in rest] == [9, 10]
    records = work._log.records_since_checkpoint
    assert await work.claim(100, None, SaveMode.WAIT) == []
    assert work._log.records_since_checkpoint == records  # idle polling costs no write
    await work.ack(receipts(second + rest), SaveMode.WAIT)
    assert q.subscription("workers").last_id == 10 and not work.state.entries


async def test_concurrent_workers_get_every_message_exactly_once(cluster: Cluster) -> None:
    q, work = await jobs(cluster, 0)
    await q.append([Draft(str(i).encode()) for i in range(2000)])
    seen: list[int] = []

    async def worker() -> None:
        while claimed := await work.claim(37, None, SaveMode.NONE):
            seen.extend(m.id for m, _ in claimed)
            await asyncio.sleep(0)  # let the other workers claim between a claim and its ack
            await work.ack(receipts(claimed), SaveMode.NONE)

    await asyncio.gather(*(worker() for _ in range(6)))
    assert sorted(seen) == list(range(1, 2001))
    assert q.subscription("workers").last_id == 2000 and not work.state.entries


async def test_a_lease_that_runs_out_is_a_failure_retried_after_the_backoff(
    cluster: Cluster, clock: Clock
) -> None:
    _, work = await jobs(cluster, 2)
    assert len(await work.claim(2, None, SaveMode.WAIT)) == 2
    clock.now += 31
    # The holder of 2 was slow but finished before anyone else took it: its ack still counts.
    assert (await work.ack([(2, 1)], SaveMode.WAIT))[0].error is None
    assert await work.claim(5, None, SaveMode.WAIT) == []  # 1 waits out its 10 s backoff
    entry = work.state.entries[1]
    assert (entry.state, entry.until, entry.error) == ("failed", clock.now - 1 + 10, "the lease ran out")
    assert work.status(1, clock.now) == "failed"
    clock.now += 9
    (again,) = await work.claim(5, None, SaveMode.WAIT)
    assert (again[0].id, again[1].receipt, again[1].attempts) == (1, "1.2", 2)
    (late,) = await work.ack([(1, 1)], SaveMode.WAIT)
    assert isinstance(late.error, LeaseLost)
    (extended,) = await work.extend([(1, 2)], 100.0, SaveMode.WAIT)
    assert extended.entry is not None and extended.entry.until == clock.now + 100
    clock.now += 50
    assert await work.expire() == 0


async def test_nack_retries_after_its_delay_or_the_backoff_then_dead_letters(
    cluster: Cluster, clock: Clock
) -> None:
    dead_q, _ = await cluster.put_queue("jobs.dead", {})
    q, work = await jobs(cluster, 1, RetrySettings(**{**FIXED.to_dict(), "dead_letter": "jobs.dead"}))
    (claimed,) = await work.claim(1, None, SaveMode.WAIT)
    (outcome,) = await work.nack([parse_receipt(claimed[1].receipt)], 2.0, "boom 1", SaveMode.WAIT)
    assert outcome.entry is not None and (outcome.entry.until, outcome.entry.error) == (
        clock.now + 2,
        "boom 1",
    )
    clock.now += 2
    (claimed,) = await work.claim(1, None, SaveMode.WAIT)
    await work.nack([parse_receipt(claimed[1].receipt)], None, "boom 2", SaveMode.WAIT)
    assert work.state.entries[1].until == clock.now + 10  # the policy's fixed backoff
    clock.now += 10
    (claimed,) = await work.claim(1, None, SaveMode.WAIT)
    assert claimed[1].attempts == 3
    (outcome,) = await work.nack([parse_receipt(claimed[1].receipt)], None, "boom 3", SaveMode.WAIT)
    assert work.status(1, clock.now) == "dead" and not work.state.entries
    dead = work.state.dead[1]
    assert (dead.attempts, dead.error, dead.died) == (3, "boom 3", clock.now)
    assert q.subscription("workers").last_id == 1
    (copy,) = (await dead_q.read_after(0, 10)).messages
    assert copy.payload == b"job0"
    assert copy.headers == {
        "capella-dead-queue": "jobs",
        "capella-dead-subscription": "workers",
        "capella-dead-id": "1",
        "capella-attempts": "3",
        "capella-last-error": "boom 3",
    }
    assert work.counters.dead_lettered == 1

    # Moved back: a fresh count of attempts, claimable at once.
    assert await work.retry([1], None, SaveMode.WAIT) == [1]
    (claimed,) = await work.claim(1, None, SaveMode.WAIT)
    assert (claimed[1].attempts, claimed[1].receipt, claimed[1].error) == (1, "1.4", "boom 3")


async def test_operators_delete_and_retry_by_id(cluster: Cluster, clock: Clock) -> None:
    _, work = await jobs(cluster, 6)
    claimed = await work.claim(3, None, SaveMode.WAIT)
    await work.nack(receipts(claimed[:1]), 3600.0, "later", SaveMode.WAIT)
    assert await work.retry([1, 2, 5], clock.now + 5, SaveMode.WAIT) == [1]  # only failed or dead
    assert work.state.entries[1].until == clock.now + 5
    assert sorted(await work.delete([2, 5, 6, 99], SaveMode.WAIT)) == [2, 5, 6]  # 99 does not exist
    assert work.status(5, clock.now) == "deleted"
    (late,) = await work.ack([(2, 1)], SaveMode.WAIT)
    assert late.error is None  # it was deleted: finished either way
    rest = await work.claim(10, None, SaveMode.WAIT)
    assert [m.id for m, _ in rest] == [4]  # 5 and 6 skipped, 1 waits until +5 s
    assert work.state.skipped == set()


async def test_the_state_survives_a_restart_and_stays_bounded(
    cluster: Cluster, tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(work_module, "CHECKPOINT_RECORDS", 50)
    q, work = await jobs(cluster, 500)
    for _ in range(49):
        claimed = await work.claim(10, None, SaveMode.NONE)
        await work.ack(receipts(claimed), SaveMode.NONE)
    held = await work.claim(3, None, SaveMode.WAIT)
    await work.nack(receipts(held[:1]), 60.0, "retry me", SaveMode.WAIT)
    await work.tick()  # the log outgrew the window: a snapshot replaces it
    assert work._log.records_since_checkpoint == 0
    await cluster.close()

    cluster = await Cluster.open(file_config(tmp_path), clock=clock)
    q = cluster.queue("jobs")
    work = q.work("workers")
    assert work.state.high == 493 and q.subscription("workers").last_id == 490
    assert {i: e.state for i, e in work.state.entries.items()} == {
        491: "failed",
        492: "in_flight",
        493: "in_flight",
    }
    assert work.state.entries[491].error == "retry me"
    assert work.policy == FIXED
    claimed = await work.claim(100, None, SaveMode.WAIT)
    assert [m.id for m, _ in claimed] == list(range(494, 501))
    await cluster.close()


async def test_modes_do_not_mix(cluster: Cluster) -> None:
    q, work = await jobs(cluster, 1)
    with pytest.raises(WrongSubscriptionMode):
        await q.commit("workers", 1)
    await q.commit("cursor", 1)
    with pytest.raises(WrongSubscriptionMode):
        await q.define_work("cursor", FIXED)
    with pytest.raises(WrongSubscriptionMode):
        q.work("cursor")
    with pytest.raises(SubscriptionNotFound):
        q.work("nobody")
    with pytest.raises(InvalidRequest):
        await q.define_work("w2", RetrySettings(dead_letter="jobs"))
    with pytest.raises(InvalidRequest):
        await q.define_work("w2", RetrySettings(dead_letter="missing"))
    _, created = await q.define_work("workers", RetrySettings(max_attempts=9))
    assert not created and q.work("workers") is work and work.policy.max_attempts == 9
    await q.delete_subscription("workers")
    await q.define_work("workers", FIXED)
    assert q.work("workers").state.high == 0  # a new subscription starts from the beginning


async def test_a_lost_dead_record_copies_to_the_dead_letters_once(
    cluster: Cluster, tmp_path: Path, clock: Clock
) -> None:
    dead_q, _ = await cluster.put_queue("jobs.dead", {})
    _, work = await jobs(cluster, 1, RetrySettings(max_attempts=1, dead_letter="jobs.dead"))
    (claimed,) = await work.claim(1, None, SaveMode.WAIT)
    await work.nack([parse_receipt(claimed[1].receipt)], None, "boom", SaveMode.WAIT)
    assert len((await dead_q.read_after(0, 10)).messages) == 1
    await cluster.close()
    # A crash after the copy but before the dead record: cut that record off the log.
    (log_file,) = (tmp_path / "data" / "queues" / "jobs" / "work" / "workers" / "log").iterdir()
    data = log_file.read_bytes()
    pos = last = 0
    while pos < len(data):
        last = pos
        pos += 8 + int.from_bytes(data[pos : pos + 4], "little")
    assert data[last + 8 : last + 12] == b'["D"'
    log_file.write_bytes(data[:last])

    cluster = await Cluster.open(file_config(tmp_path), clock=clock)
    work = cluster.queue("jobs").work("workers")
    assert work.status(1, clock.now) == "in_flight"
    clock.now += 31
    assert await work.expire() == 1
    assert work.status(1, clock.now) == "dead"
    (copy,) = (await cluster.queue("jobs.dead").read_after(0, 10)).messages
    assert copy.headers["capella-last-error"] == "boom"
    await cluster.close()


async def test_a_work_queue_being_defined_is_not_found_yet_rather_than_a_crash(cluster: Cluster) -> None:
    # define_work records the subscription, then opens its work state on the mount: a push
    # handler's status read in between (its lag, at start) once answered 500 (a KeyError).
    q, _ = await cluster.put_queue("jobs", {})
    defining = asyncio.create_task(q.define_work("workers", FIXED))
    seen: list[str] = []
    for _ in range(1000):
        await asyncio.sleep(0)
        if defining.done():
            break
        if any(s.name == "workers" for s in q.subscriptions()):
            try:
                q.work("workers")
            except SubscriptionNotFound as exc:
                assert "still being defined" in str(exc)
                seen.append("defining")
            # else its work state is open and define_work is still saving the change
    await defining
    assert seen, "the definition never showed before its work state was open"
    assert q.work("workers").policy == FIXED
