"""The client's delayed-delivery and work-queue methods, async against the app, blocking against a process."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from conftest import ServerProcess

from capella.api import create_app
from capella.client import AsyncClient, Client
from capella.config import ServerSettings
from capella.core.cluster import Cluster
from capella.errors import ScheduledNotFound
from capella.handlers.supervisor import Supervisor

ServerFactory = Callable[[web.Application], Awaitable[TestServer]]


@pytest.fixture
async def client(
    aiohttp_server: ServerFactory, cluster: Cluster, supervisor: Supervisor
) -> AsyncIterator[AsyncClient]:
    server = await aiohttp_server(create_app(cluster, ServerSettings(max_wait=5.0), supervisor))
    async with AsyncClient(f"http://127.0.0.1:{server.port}", timeout=10.0) as c:
        yield c


async def test_schedule_list_reschedule_and_cancel(client: AsyncClient) -> None:
    await client.put_queue("jobs")
    answers = await client.schedule("jobs", ["a", b"\xffb", {"data": "c", "segment": 3}], delay="1h")
    sids = [a["scheduled_id"] for a in answers]
    with pytest.raises(ValueError):
        await client.schedule("jobs", ["x"])
    page = await client.scheduled("jobs", limit=2)
    assert [i["scheduled_id"] for i in page["scheduled"]] == sids[:2] and page["count"] == 3
    rest = await client.scheduled("jobs", after=page["next"])
    assert [i["segment"] for i in rest["scheduled"]] == [3] and rest["next"] is None
    assert (await client.scheduled_message("jobs", sids[1]))["data_b64"] == "/2I="
    moved = await client.reschedule("jobs", sids[2], deliver_at=time.time() - 1, save="wait")
    assert moved["scheduled_id"] == sids[2]
    page = await client.read("jobs", wait=5)
    assert [m["payload"] for m in page["messages"]] == [b"c"]
    await client.cancel_scheduled("jobs", sids[0])
    with pytest.raises(ScheduledNotFound):
        await client.cancel_scheduled("jobs", sids[0])
    cancelled = await client.cancel_scheduled_many("jobs", sids)
    assert cancelled == {"cancelled": [sids[1]], "not_cancelled": sids[::2]}


@pytest.mark.slow
def test_the_blocking_client_schedules(server_process: ServerProcess) -> None:
    with Client(server_process.url, timeout=10.0) as c:
        c.put_queue("sync-delayed")
        (first,) = c.schedule("sync-delayed", ["later"], deliver_at=time.time() + 3600)
        sid = first["scheduled_id"]
        assert c.scheduled("sync-delayed")["count"] == 1
        assert c.scheduled_message("sync-delayed", sid)["data"] == "later"
        c.reschedule("sync-delayed", sid, delay=0)
        deadline = time.monotonic() + 5
        while not c.read("sync-delayed")["messages"] and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [m["payload"] for m in c.read("sync-delayed")["messages"]] == [b"later"]
        (again,) = c.schedule("sync-delayed", ["x"], delay=60)
        assert c.cancel_scheduled_many("sync-delayed", [again["scheduled_id"]])["cancelled"]
        c.drop_queue("sync-delayed")
