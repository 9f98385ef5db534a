"""The Python client against real servers on loopback.

``AsyncClient`` talks to the real aiohttp app (in the test's loop) in front of a real
Cluster on the memory provider; the blocking ``Client`` talks to a real ``capella serve``
process, since its requests run in a thread of their own.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from support.servers import ServerProcess, free_port
from support.wait import parked

from capella.api import create_app
from capella.client import AsyncClient, Client, error_from_answer
from capella.client.answers import decode_answer, error_codes
from capella.client.events import EventParser
from capella.config import ServerSettings
from capella.core.cluster import Cluster
from capella.errors import (
    AlreadyExists,
    CapellaError,
    HandlerNotFound,
    InvalidMessage,
    InvalidRequest,
    InvalidSaveMode,
    NameTaken,
    QueueNotFound,
    SubscriptionNotFound,
    TopicNotFound,
    Unreachable,
)
from capella.handlers.supervisor import Supervisor
from capella.wire.answers import Status
from capella.wire.messages import ProduceResult, StoredMessage

ServerFactory = Callable[[web.Application], Awaitable[TestServer]]


# --- queues ------------------------------------------------------------------------------


async def test_a_queue_is_created_listed_shown_and_dropped(async_client: AsyncClient) -> None:
    info = await async_client.put_queue("orders", block={"max_messages": 10}, save="mark")

    assert info.name == "orders"
    assert info.definition.block.max_messages == 10
    assert [q.name for q in await async_client.queues()] == ["orders"]
    assert (await async_client.queue("orders")).definition.save == "mark"

    await async_client.drop_queue("orders")

    assert await async_client.queues() == []
    with pytest.raises(QueueNotFound) as caught:
        await async_client.queue("orders")
    assert caught.value.code == "queue_not_found"
    assert "orders" in caught.value.message


async def test_putting_a_queue_again_updates_it(async_client: AsyncClient) -> None:
    await async_client.put_queue("q")
    info = await async_client.put_queue("q", save="immediate")

    assert info.definition.save == "immediate"


async def test_a_save_says_whether_it_created_or_updated(async_client: AsyncClient) -> None:
    created = await async_client.save_queue("saved")
    updated = await async_client.save_queue("saved", save="wait")
    sub_created = await async_client.save_subscription(
        "saved", "jobs", mode="ack", policy={"max_attempts": 2}
    )
    sub_updated = await async_client.save_subscription("saved", "jobs", policy={"max_attempts": 3})

    assert (created.created, updated.created) == (True, False)
    assert updated.value.definition.save == "wait"
    assert (sub_created.created, sub_updated.created) == (True, False)
    info, was_created = sub_updated
    assert not was_created and info.policy.max_attempts == 3


async def test_a_printed_answer_shows_only_the_fields_that_are_set(async_client: AsyncClient) -> None:
    await async_client.put_queue("printed")

    [stored] = await async_client.produce("printed", ["now"])
    [delayed] = await async_client.schedule("printed", ["later"], delay="1h")

    assert repr(stored) == "ProduceResult(id=1, duplicate=False)"
    assert "UNSET" not in repr(delayed)
    assert repr(delayed).startswith(f"ProduceResult(scheduled_id={delayed.scheduled_id}, deliver_at=")
    assert "UNSET" not in repr(await async_client.queue("printed"))


async def test_a_bad_definition_raises_the_servers_error_class(async_client: AsyncClient) -> None:
    with pytest.raises(InvalidSaveMode):
        await async_client.put_queue("q", save="sometimes")


# --- produce and read --------------------------------------------------------------------


async def test_text_bytes_and_wire_dicts_come_back_with_their_payload(async_client: AsyncClient) -> None:
    await async_client.put_queue("q")
    binary = b"\x00\xff\xfe binary"

    results = await async_client.produce("q", ["text", binary, {"data": "dict", "segment": 3, "source": "s"}])

    assert [r.id for r in results] == [1, 2, 3]
    assert not any(r.duplicate for r in results)
    page = await async_client.read("q")
    assert [m.payload for m in page.messages] == [b"text", binary, b"dict"]
    assert page.messages[0].data == "text"
    assert page.messages[1].data_b64 is not msgspec.UNSET
    assert (page.messages[2].segment, page.messages[2].source) == (3, "s")
    assert page.last_id == 3


# --- topics ------------------------------------------------------------------------------


async def test_a_topic_is_defined_grown_listed_shown_and_dropped(async_client: AsyncClient) -> None:
    info, created = await async_client.define_topic("orders", 2, queue={"save": "mark"})
    assert created and info.queues == ["orders~0", "orders~1"] and info.definition.save == "mark"
    info, created = await async_client.define_topic("orders", 3)
    assert not created and info.partitions == 3
    assert [t.name for t in await async_client.topics()] == ["orders"]
    assert (await async_client.topic("orders")).queues == ["orders~0", "orders~1", "orders~2"]

    # A partition is a queue: produce to it and read it back by its name.
    await async_client.produce("orders~2", ["hello"])
    assert [m.payload for m in (await async_client.read("orders~2")).messages] == [b"hello"]

    with pytest.raises(NameTaken):
        await async_client.put_queue("orders")
    with pytest.raises(InvalidRequest, match="never removed"):
        await async_client.define_topic("orders", 1)
    await async_client.drop_topic("orders")
    assert await async_client.topics() == [] and await async_client.queues() == []
    with pytest.raises(TopicNotFound):
        await async_client.topic("orders")


async def test_read_pages_with_after_and_limit(async_client: AsyncClient) -> None:
    await async_client.put_queue("q")
    await async_client.produce("q", [str(i) for i in range(10)])

    first = await async_client.read("q", limit=4)
    second = await async_client.read("q", after=first.last_id, limit=100)

    assert [m.data for m in first.messages] == ["0", "1", "2", "3"]
    assert [m.data for m in second.messages] == [str(i) for i in range(4, 10)]
    assert (await async_client.read("q", after=second.last_id)).messages == []


async def test_read_filters_by_segments(async_client: AsyncClient) -> None:
    await async_client.put_queue("q")
    await async_client.produce("q", [{"data": str(s), "segment": s} for s in range(6)])

    as_text = await async_client.read("q", segments="1-2,5")
    as_values = await async_client.read("q", segments=[(1, 2), 5])

    assert [m.segment for m in as_text.messages] == [1, 2, 5]
    assert [m.segment for m in as_values.messages] == [1, 2, 5]


async def test_read_filters_by_source_header_and_json_field(async_client: AsyncClient) -> None:
    await async_client.put_queue("filtered")
    await async_client.produce(
        "filtered",
        [
            {"data": '{"customer": {"id": 42}}', "source": "shop", "headers": {"kind": "order"}},
            {"data": '{"customer": {"id": 42}}', "source": "till", "headers": {"kind": "order"}},
            {"data": '{"customer": {"id": 7}}', "source": "shop", "headers": {"kind": "order"}},
            {"data": '{"customer": {"id": 42}}', "source": "shop", "headers": {"kind": "refund"}},
        ],
    )
    page = await async_client.read(
        "filtered", source="shop", headers={"kind": "order"}, json={"customer.id": 42}
    )
    assert ([m.id for m in page.messages], page.last_id) == ([1], 4)


async def test_a_repeated_external_id_is_answered_as_a_duplicate(async_client: AsyncClient) -> None:
    await async_client.put_queue("q")
    first = await async_client.produce("q", [{"data": "a", "source": "src", "external_id": 7}])

    again = await async_client.produce(
        "q", [{"data": "a", "source": "src", "external_id": 7}], save="immediate"
    )

    assert again == [ProduceResult(id=first[0].id, duplicate=True)]


async def test_an_invalid_message_raises_with_its_index_and_stores_nothing(async_client: AsyncClient) -> None:
    await async_client.put_queue("q")

    with pytest.raises(InvalidMessage) as caught:
        await async_client.produce("q", ["ok", {"data": 5}])

    assert caught.value.details.get("index") == 1
    assert (await async_client.read("q")).messages == []


async def test_producing_to_a_missing_queue_raises_queue_not_found(async_client: AsyncClient) -> None:
    with pytest.raises(QueueNotFound):
        await async_client.produce("nowhere", ["x"])


async def test_ndjson_lines_may_be_dicts_bytes_or_an_async_iterable(async_client: AsyncClient) -> None:
    await async_client.put_queue("q")

    async def lines() -> AsyncIterator[bytes | dict[str, Any]]:
        yield {"data": "one"}
        yield b'{"data": "two"}'
        yield b'{"data_b64": "AAE="}\n'

    from_sync = await async_client.produce_ndjson("q", [{"data": "zero"}])
    from_async = await async_client.produce_ndjson("q", lines(), save="wait")

    assert [r.id for r in from_sync + from_async] == [1, 2, 3, 4]
    page = await async_client.read("q")
    assert [m.payload for m in page.messages] == [b"zero", b"one", b"two", b"\x00\x01"]


async def test_a_long_poll_read_returns_when_a_message_arrives(async_client: AsyncClient) -> None:
    await async_client.put_queue("q")

    waiting = asyncio.create_task(async_client.read("q", wait=5.0))
    await parked("Queue.wait_for")  # the queue is empty: the answer must not come
    assert not waiting.done()
    await async_client.produce("q", ["late"])

    async with asyncio.timeout(5.0):
        page = await waiting
    assert [m.data for m in page.messages] == ["late"]


# --- subscriptions -----------------------------------------------------------------------


async def test_a_subscription_read_moves_its_cursor_by_default(async_client: AsyncClient) -> None:
    await async_client.put_queue("q")
    await async_client.produce("q", ["a", "b", "c"])

    first = await async_client.read_subscription("q", "billing", limit=2)
    second = await async_client.read_subscription("q", "billing")

    assert [m.data for m in first.messages] == ["a", "b"]
    assert [m.data for m in second.messages] == ["c"]
    assert (await async_client.subscription("q", "billing")).last_id == 3


async def test_without_auto_commit_the_cursor_moves_on_commit_only(async_client: AsyncClient) -> None:
    await async_client.put_queue("q")
    await async_client.produce("q", ["a", "b"])
    await async_client.commit("q", "s", 0)

    page = await async_client.read_subscription("q", "s", commit="none")
    assert (await async_client.subscription("q", "s")).last_id == 0
    committed = await async_client.commit("q", "s", page.last_id, save="immediate")

    assert committed.last_id == 2
    assert committed.lag == 0


async def test_a_commit_never_moves_back_unless_reset(async_client: AsyncClient) -> None:
    await async_client.put_queue("q")
    await async_client.produce("q", ["a", "b", "c"])
    await async_client.commit("q", "s", 3)

    assert (await async_client.commit("q", "s", 1)).last_id == 3
    assert (await async_client.commit("q", "s", 1, reset=True)).last_id == 1


async def test_subscriptions_are_listed_and_deleted(async_client: AsyncClient) -> None:
    await async_client.put_queue("q")
    await async_client.commit("q", "a", 0)
    await async_client.commit("q", "b", 0)

    assert sorted(s.name for s in await async_client.subscriptions("q")) == ["a", "b"]
    await async_client.delete_subscription("q", "a")

    assert [s.name for s in await async_client.subscriptions("q")] == ["b"]
    with pytest.raises(SubscriptionNotFound):
        await async_client.subscription("q", "a")


async def test_replicas_count_the_replica_subscriptions_past_an_id(async_client: AsyncClient) -> None:
    await async_client.put_queue("q")
    await async_client.produce("q", ["a", "b", "c"])
    await async_client.commit("q", "dc2", 3, replica=True)
    await async_client.commit("q", "dc3", 1, replica=True)
    await async_client.commit("q", "reader", 3)

    answer = await async_client.replicas("q", 2)

    assert answer.count == 1
    assert answer.subscriptions == ["dc2"]


# --- handlers ----------------------------------------------------------------------------


async def test_a_handler_is_defined_controlled_and_dropped(async_client: AsyncClient) -> None:
    await async_client.put_queue("orders")

    info = await async_client.put_handler(
        "trim", "expire", queues="orders", params={"max_age": "1d"}, started=False
    )

    assert (info.name, info.queues, info.started) == ("trim", ["orders"], False)
    assert info.params["max_age"] == 86400
    assert [h.name for h in await async_client.handlers()] == ["trim"]
    assert (await async_client.start_handler("trim")).started is True
    stopped = await async_client.stop_handler("trim")
    assert stopped.started is False
    assert (await async_client.run_handler("trim")).status.runs == stopped.status.runs + 1
    assert (await async_client.handler("trim")).status.last_error is None
    await async_client.drop_handler("trim")
    with pytest.raises(HandlerNotFound):
        await async_client.handler("trim")
    with pytest.raises(InvalidRequest) as caught:
        await async_client.put_handler("bad", "expire", queues=["orders", "logs-*"])
    assert caught.value.details["field"] == "params.max_age"


# --- stream ------------------------------------------------------------------------------


async def test_stream_yields_the_backlog_then_the_tail(async_client: AsyncClient) -> None:
    await async_client.put_queue("q")
    await async_client.produce("q", ["a", "b"])
    seen: list[dict[str, Any]] = []

    async with asyncio.timeout(10.0):
        stream = async_client.stream("q", after=1)
        async for message in stream:
            seen.append(message)
            if len(seen) == 1:
                await async_client.produce("q", [b"\x00c"])
            if len(seen) == 2:
                break
        await stream.aclose()

    assert [(m.id, m.payload) for m in seen] == [(2, b"b"), (3, b"\x00c")]


async def test_stream_of_a_missing_queue_raises_at_once(async_client: AsyncClient) -> None:
    with pytest.raises(QueueNotFound):
        async with asyncio.timeout(5.0):
            async for _ in async_client.stream("nowhere"):
                pass


@pytest.mark.slow
async def test_stream_resumes_after_the_server_restarts(tmp_path: Path) -> None:
    """A real server process is stopped and started again on the same port and data."""
    data_dir = tmp_path / "data"
    server = ServerProcess(data_dir)
    seen: list[int] = []
    try:
        await asyncio.to_thread(server.wait_ready)
        async with AsyncClient(server.url, timeout=5.0) as c, asyncio.timeout(60.0):
            await c.put_queue("q", save="immediate")
            await c.produce("q", ["a", "b"])
            stream = c.stream("q")
            async for message in stream:
                seen.append(message.id)
                if len(seen) == 2:
                    assert await asyncio.to_thread(server.stop) is not None
                    server = ServerProcess(data_dir, port=server.port)
                    await asyncio.to_thread(server.wait_ready)
                    await c.produce("q", ["c"])
                if len(seen) == 3:
                    break
            await stream.aclose()
    finally:
        server.stop()

    assert seen == [1, 2, 3]


def test_the_event_parser_joins_lines_split_across_chunks() -> None:
    parser = EventParser()

    assert parser.feed(b": hello\n\nid: 4\nevent: mess") == []
    events = parser.feed(b'age\r\ndata: {"a":\ndata: 1}\n\nid: 5\n')

    assert events == [{"id": "4", "event": "message", "data": '{"a":\n1}'}]
    assert parser.feed(b"data: x\n\n") == [{"id": "5", "data": "x"}]


# --- errors and operations ---------------------------------------------------------------


async def test_health_and_ready(async_client: AsyncClient) -> None:
    assert (await async_client.health()).status == "ok"
    assert await async_client.ready() is True


async def test_no_server_raises_unreachable_naming_the_url() -> None:
    url = f"http://127.0.0.1:{free_port()}"

    async with AsyncClient(url, timeout=2.0) as c:
        with pytest.raises(Unreachable) as caught:
            await c.queues()

    assert url in caught.value.message
    assert caught.value.code == "unreachable"


async def test_a_shared_session_is_left_open(
    aiohttp_server: ServerFactory, cluster: Cluster, supervisor: Supervisor
) -> None:
    import aiohttp

    server = await aiohttp_server(create_app(cluster, ServerSettings(), supervisor))
    async with aiohttp.ClientSession() as session:
        async with AsyncClient(f"http://127.0.0.1:{server.port}", session=session) as c:
            await c.health()
        assert not session.closed


def test_an_answer_that_does_not_match_its_type_raises() -> None:
    with pytest.raises(CapellaError, match="not a Status"):
        decode_answer(Status, b'{"status": 1}')
    with pytest.raises(CapellaError, match="not a Status"):
        decode_answer(Status, b"<html>bad gateway</html>")


def test_a_payload_is_the_bytes_of_data_or_data_b64() -> None:
    def stored(**payload: str) -> StoredMessage:
        return StoredMessage(1, 0.0, "s", 1, 0.0, 0, {}, **payload)

    assert stored(data="text").payload == b"text"
    assert stored(data_b64="AAE=").payload == b"\x00\x01"
    with pytest.raises(InvalidMessage):
        _ = stored(data_b64="not base64!").payload


def test_every_error_code_maps_to_its_class() -> None:
    table = error_codes()

    assert table["queue_not_found"] is QueueNotFound
    assert table["already_exists"] is AlreadyExists
    assert table["internal"] is CapellaError
    assert table["unreachable"] is Unreachable


def test_an_unknown_code_or_a_non_json_answer_still_raises_a_capella_error() -> None:
    unknown = error_from_answer(418, b'{"error": {"code": "teapot", "message": "short", "x": 1}}')
    not_json = error_from_answer(502, b"<html>bad gateway</html>")

    assert (type(unknown), unknown.code, unknown.message, unknown.details) == (
        CapellaError,
        "teapot",
        "short",
        {"x": 1},
    )
    assert not_json.code == "http_error"
    assert "502" in not_json.message


# --- the blocking client -----------------------------------------------------------------


@pytest.mark.slow
def test_the_blocking_client_produces_reads_and_streams(server_process: ServerProcess) -> None:
    with Client(server_process.url, timeout=10.0) as c:
        c.put_queue("sync-q")
        assert [r.id for r in c.produce("sync-q", ["a", b"\x00b"])] == [1, 2]
        assert [m.payload for m in c.read("sync-q").messages] == [b"a", b"\x00b"]
        assert c.produce_ndjson("sync-q", [{"data": "c"}])[0].id == 3
        assert c.read_subscription("sync-q", "s", limit=1).last_id == 1
        assert c.commit("sync-q", "s", 2).last_id == 2
        assert [s.name for s in c.subscriptions("sync-q")] == ["s"]
        assert c.subscription("sync-q", "s").lag == 1
        assert c.replicas("sync-q", 1).count == 0
        assert c.health().status == "ok"
        assert c.ready()

        stream = c.stream("sync-q", after=1)
        assert [next(stream).id, next(stream).id] == [2, 3]
        stream.close()

        c.delete_subscription("sync-q", "s")
        c.drop_queue("sync-q")
        with pytest.raises(QueueNotFound):
            c.queue("sync-q")


@pytest.mark.slow
async def test_the_blocking_client_works_while_a_loop_runs(server_process: ServerProcess) -> None:
    # As in Jupyter: this test's own loop is running, the client brings its own.
    with Client(server_process.url, timeout=10.0) as c:
        assert c.health().status == "ok"


@pytest.mark.slow
def test_the_blocking_client_defines_and_drops_topics(server_process: ServerProcess) -> None:
    with Client(server_process.url, timeout=10.0) as c:
        info, created = c.define_topic("blocking-topic", 2)
        assert created and info.queues == ["blocking-topic~0", "blocking-topic~1"]
        assert "blocking-topic" in [t.name for t in c.topics()]
        assert c.topic("blocking-topic").partitions == 2
        c.drop_topic("blocking-topic")
        assert "blocking-topic" not in [t.name for t in c.topics()]


def test_a_closed_blocking_client_refuses_calls(server_process: ServerProcess) -> None:
    c = Client(server_process.url)
    c.close()
    c.close()

    with pytest.raises(CapellaError, match="closed"):
        c.health()
