"""The client's delayed-delivery and work-queue methods, async against the app, blocking against a process."""

from __future__ import annotations

import time

import msgspec
import pytest
from support.servers import ServerProcess
from support.wait import until_blocking

from capella.client import AsyncClient, Client
from capella.errors import LeaseLost, ScheduledNotFound, UnknownReceipt
from capella.wire.messages import CancelledScheduled


async def test_schedule_list_reschedule_and_cancel(async_client: AsyncClient) -> None:
    await async_client.put_queue("jobs")
    answers = await async_client.schedule("jobs", ["a", b"\xffb", {"data": "c", "segment": 3}], delay="1h")
    sids = [a.scheduled_id for a in answers]
    with pytest.raises(ValueError):
        await async_client.schedule("jobs", ["x"])
    page = await async_client.scheduled("jobs", limit=2)
    assert [i.scheduled_id for i in page.scheduled] == sids[:2] and page.count == 3
    rest = await async_client.scheduled("jobs", after=page.next)
    assert [i.segment for i in rest.scheduled] == [3] and rest.next is None
    assert (await async_client.scheduled_message("jobs", sids[1])).data_b64 == "/2I="
    moved = await async_client.reschedule("jobs", sids[2], deliver_at=time.time() - 1, save="wait")
    assert moved.scheduled_id == sids[2]
    page = await async_client.read("jobs", wait=5)
    assert [m.payload for m in page.messages] == [b"c"]
    await async_client.cancel_scheduled("jobs", sids[0])
    with pytest.raises(ScheduledNotFound):
        await async_client.cancel_scheduled("jobs", sids[0])
    cancelled = await async_client.cancel_scheduled_many("jobs", sids)
    assert cancelled == CancelledScheduled(cancelled=[sids[1]], not_cancelled=sids[::2])


@pytest.mark.slow
def test_the_blocking_client_schedules(server_process: ServerProcess) -> None:
    with Client(server_process.url, timeout=10.0) as c:
        c.put_queue("sync-delayed")
        (first,) = c.schedule("sync-delayed", ["later"], deliver_at=time.time() + 3600)
        sid = first.scheduled_id
        assert c.scheduled("sync-delayed").count == 1
        assert c.scheduled_message("sync-delayed", sid).data == "later"
        c.reschedule("sync-delayed", sid, delay=0)
        until_blocking(lambda: c.read("sync-delayed").messages, what="the rescheduled message", every=0.02)
        assert [m.payload for m in c.read("sync-delayed").messages] == [b"later"]
        (again,) = c.schedule("sync-delayed", ["x"], delay=60)
        assert c.cancel_scheduled_many("sync-delayed", [again.scheduled_id]).cancelled
        c.drop_queue("sync-delayed")


async def test_a_worker_claims_acks_nacks_and_extends(async_client: AsyncClient) -> None:
    await async_client.put_queue("tasks")
    await async_client.put_queue("tasks.dead")
    info = await async_client.put_work("tasks", "workers", max_attempts=2, delay=0, dead_letter="tasks.dead")
    assert info.mode == "ack" and info.policy.max_attempts == 2
    await async_client.produce("tasks", ["a", "b", b"\xffc"])
    claimed = await async_client.claim("tasks", "workers", limit=2, lease="1m")
    assert [(m.payload, m.attempt) for m in claimed] == [(b"a", 1), (b"b", 1)]
    results = await async_client.ack("tasks", "workers", [m.receipt for m in claimed])
    assert [r.ok for r in results] == [True, True]
    with pytest.raises(UnknownReceipt):
        await async_client.ack("tasks", "workers", "99.1")
    (third,) = await async_client.claim("tasks", "workers", wait=1)
    assert third.payload == b"\xffc"
    extended = await async_client.extend("tasks", "workers", third.receipt, lease=120)
    assert extended.lease_until > third.lease_until
    nacked = await async_client.nack("tasks", "workers", third.receipt, error="bad input", save="wait")
    assert nacked.ok and nacked.retry_at is not msgspec.UNSET
    with pytest.raises(LeaseLost):
        await async_client.extend("tasks", "workers", third.receipt)
    (again,) = await async_client.claim("tasks", "workers")
    assert (again.attempt, again.last_error) == (2, "bad input")
    (dead,) = await async_client.nack("tasks", "workers", [again.receipt], error="still bad")
    assert dead.dead is True
    copies = (await async_client.read("tasks.dead")).messages
    assert [(c.payload, c.headers["capella-last-error"]) for c in copies] == [(b"\xffc", "still bad")]
    assert await async_client.claim("tasks", "workers") == []


async def test_an_operator_lists_retries_and_deletes(async_client: AsyncClient) -> None:
    await async_client.put_queue("ops")
    await async_client.put_work("ops", "w", max_attempts=1)
    await async_client.produce(
        "ops", [{"data": f'{{"n": {i}}}', "headers": {"h": str(i % 2)}} for i in range(6)]
    )
    (first,) = await async_client.claim("ops", "w")
    await async_client.nack("ops", "w", first.receipt, error="e")
    page = await async_client.work("ops", "w", status=["pending"], headers={"h": "1"}, json={"n": 3})
    assert [(m.id, m.payload) for m in page.messages] == [(4, b'{"n": 3}')]
    dead = await async_client.work_message("ops", "w", 1)
    assert (dead.status, dead.last_error) == ("dead", "e")
    assert (await async_client.retry_work("ops", "w", status=["dead"])).retried == [1]
    assert (await async_client.delete_work("ops", "w", status=["pending"], json={"n": 5})).deleted == [6]
    claimed = await async_client.claim("ops", "w", limit=10)
    assert [m.id for m in claimed] == [1, 2, 3, 4, 5]


@pytest.mark.slow
def test_the_blocking_client_runs_a_worker(server_process: ServerProcess) -> None:
    with Client(server_process.url, timeout=10.0) as c:
        c.put_queue("sync-tasks")
        c.put_work("sync-tasks", "w", lease="30s")
        c.produce("sync-tasks", ["one", "two"])
        (first,) = c.claim("sync-tasks", "w")
        assert c.extend("sync-tasks", "w", [first.receipt])[0].ok
        assert c.ack("sync-tasks", "w", first.receipt).ok
        (second,) = c.claim("sync-tasks", "w", wait=1)
        assert c.nack("sync-tasks", "w", [second.receipt], delay=0, error="x")[0].ok
        (retry,) = c.claim("sync-tasks", "w", limit=5)
        assert (retry.payload, retry.attempt) == (b"two", 2)
        assert [m.status for m in c.work("sync-tasks", "w").messages] == ["in_flight"]
        assert c.work_message("sync-tasks", "w", 1).status == "done"
        assert c.retry_work("sync-tasks", "w").retried == []
        assert c.delete_work("sync-tasks", "w", ids=[2]).deleted == [2]
        c.drop_queue("sync-tasks")
