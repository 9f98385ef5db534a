"""Producing and reading messages over HTTP: every body format, every validation error, long-poll, SSE."""

from __future__ import annotations

import asyncio
import base64
import time
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from support.http import error_of
from support.wait import parked

from capella.api import create_app
from capella.api.messages import HEARTBEAT
from capella.config import ServerSettings
from capella.core.cluster import Cluster
from capella.handlers.supervisor import Supervisor

Q = "/v1/queues/q"


@pytest.fixture
async def q(api: TestClient) -> TestClient:
    assert (await api.put(Q, json={"segments": {"min": 0, "max": 100}})).status == 201
    return api


async def produce(api: TestClient, body: Any, **params: str) -> dict[str, Any]:
    resp = await api.post(f"{Q}/messages", json=body, params=params)
    assert resp.status == 200, await resp.text()
    return dict(await resp.json())


async def read(api: TestClient, **params: str) -> dict[str, Any]:
    resp = await api.get(f"{Q}/messages", params=params)
    assert resp.status == 200, await resp.text()
    return dict(await resp.json())


# --- produce ---------------------------------------------------------------------------------


async def test_batch_then_read_after(q: TestClient) -> None:
    answer = await produce(q, {"messages": [{"data": "a"}, {"data": "b"}, {"data": "c"}]})
    assert answer == {"results": [{"id": i, "duplicate": False} for i in (1, 2, 3)]}
    got = await read(q, after="1")
    assert [m["data"] for m in got["messages"]] == ["b", "c"]
    assert got["last_id"] == 3
    first = got["messages"][0]
    assert set(first) == {
        "id",
        "time",
        "source",
        "external_id",
        "external_time",
        "segment",
        "headers",
        "data",
    }
    assert (first["id"], first["source"], first["external_id"], first["segment"]) == (2, "test", 2, 0)
    assert first["headers"] == {}
    assert first["external_time"] == first["time"]


async def test_single_object_with_every_field(q: TestClient) -> None:
    body = {
        "data": "hello",
        "source": "dc1",
        "external_id": -7,
        "external_time": "2024-05-01T12:00:00.5Z",
        "segment": 42,
        "headers": {"k": "v"},
    }
    assert (await produce(q, body))["results"] == [{"id": 1, "duplicate": False}]
    (m,) = (await read(q))["messages"]
    assert m["source"] == "dc1" and m["external_id"] == -7 and m["segment"] == 42
    assert m["external_time"] == 1714564800.5
    assert m["headers"] == {"k": "v"}


async def test_external_time_as_number_and_with_offset(q: TestClient) -> None:
    await produce(
        q,
        {
            "messages": [
                {"data": "a", "external_time": 1700000000.25},
                {"data": "b", "external_time": "2024-05-01T14:00:00+02:00"},
            ]
        },
    )
    times = [m["external_time"] for m in (await read(q))["messages"]]
    assert times == [1700000000.25, 1714564800.0]


async def test_binary_payloads_come_back_as_data_b64(q: TestClient) -> None:
    raw = bytes(range(256))
    await produce(
        q,
        {
            "messages": [
                {"data_b64": base64.b64encode(raw).decode()},
                {"data_b64": base64.b64encode(b"text").decode()},
            ]
        },
    )
    first, second = (await read(q))["messages"]
    assert "data" not in first and base64.b64decode(first["data_b64"]) == raw
    assert second["data"] == "text" and "data_b64" not in second


async def test_dedup_answers_the_existing_id(q: TestClient) -> None:
    body = {
        "messages": [
            {"data": "a", "source": "s", "external_id": 10},
            {"data": "b", "source": "s", "external_id": 11},
        ]
    }
    assert (await produce(q, body))["results"] == [
        {"id": 1, "duplicate": False},
        {"id": 2, "duplicate": False},
    ]
    again = {
        "messages": [
            {"data": "b", "source": "s", "external_id": 11},
            {"data": "c", "source": "s", "external_id": 12},
            {"data": "a", "source": "other", "external_id": 10},
        ]
    }
    assert (await produce(q, again))["results"] == [
        {"id": 2, "duplicate": True},
        {"id": 3, "duplicate": False},
        {"id": 4, "duplicate": False},
    ]
    assert len((await read(q))["messages"]) == 4


async def test_ndjson_in(q: TestClient) -> None:
    body = b'{"data": "a"}\n\n{"data": "b", "segment": 3}\n{"data_b64": "/w=="}'
    resp = await q.post(f"{Q}/messages", data=body, headers={"Content-Type": "application/x-ndjson"})
    assert resp.status == 200
    assert [r["id"] for r in (await resp.json())["results"]] == [1, 2, 3]
    messages = (await read(q))["messages"]
    assert messages[1]["segment"] == 3 and messages[2]["data_b64"] == "/w=="


async def test_ndjson_bad_line_names_its_index(q: TestClient) -> None:
    body = b'{"data": "a"}\n{"data": \n'
    resp = await q.post(f"{Q}/messages", data=body, headers={"Content-Type": "application/x-ndjson"})
    error = await error_of(resp, 400)
    assert (error["code"], error["index"]) == ("invalid_message", 1)
    assert (await read(q))["messages"] == []


async def test_octet_stream_in(q: TestClient) -> None:
    resp = await q.post(
        f"{Q}/messages",
        data=b"\xff\x01raw",
        params={"source": "cam", "external_id": "99", "external_time": "1700000000.5", "segment": "7"},
        headers={
            "Content-Type": "application/octet-stream",
            "Capella-Header-Trace": "abc",
            "Capella-Header-Kind": "jpeg",
        },
    )
    assert resp.status == 200, await resp.text()
    (m,) = (await read(q))["messages"]
    assert base64.b64decode(m["data_b64"]) == b"\xff\x01raw"
    assert (m["source"], m["external_id"], m["external_time"], m["segment"]) == ("cam", 99, 1700000000.5, 7)
    assert {k.lower(): v for k, v in m["headers"].items()} == {"trace": "abc", "kind": "jpeg"}
    resp = await q.post(
        f"{Q}/messages",
        data=b"x",
        params={"external_time": "2024-05-01T12:00:00Z"},
        headers={"Content-Type": "application/octet-stream"},
    )
    assert resp.status == 200


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"external_id": "ten"}, "external_id"),
        ({"segment": "1.5"}, "segment"),
        ({"external_time": "yesterday"}, "external_time"),
        ({"source": ""}, "source"),
        ({"segment": "1000"}, "segment"),
    ],
)
async def test_octet_stream_bad_metadata(q: TestClient, params: dict[str, str], field: str) -> None:
    resp = await q.post(
        f"{Q}/messages", data=b"x", params=params, headers={"Content-Type": "application/octet-stream"}
    )
    error = await error_of(resp, 400)
    assert (error["code"], error["field"], error["index"]) == ("invalid_message", field, 0)


BAD_MESSAGES: list[tuple[Any, str, str]] = [
    ({"data": "a", "data_b64": "YQ=="}, "data", "not both"),
    ({}, "data", "needs data"),
    ({"source": "s"}, "data", "needs data"),
    ({"data": 5}, "data", "string"),
    ({"data_b64": "not base64!"}, "data_b64", "base64"),
    ({"data_b64": "YQ"}, "data_b64", "base64"),
    ({"data_b64": 5}, "data_b64", "base64"),
    ({"data": "a", "source": ""}, "source", "non-empty"),
    ({"data": "a", "source": 3}, "source", "string"),
    ({"data": "a", "source": "é" * 128}, "source", "255 bytes"),
    ({"data": "a", "external_id": True}, "external_id", "64-bit"),
    ({"data": "a", "external_id": 1.5}, "external_id", "64-bit"),
    ({"data": "a", "external_id": "7"}, "external_id", "64-bit"),
    ({"data": "a", "external_id": 2**63}, "external_id", "64-bit"),
    ({"data": "a", "external_time": "yesterday"}, "external_time", "RFC 3339"),
    ({"data": "a", "external_time": "2024-05-01"}, "external_time", "RFC 3339"),
    ({"data": "a", "external_time": True}, "external_time", "boolean"),
    ({"data": "a", "external_time": time.time() + 3600}, "external_time", "future"),
    ({"data": "a", "external_time": "2999-01-01T00:00:00Z"}, "external_time", "future"),
    ({"data": "a", "segment": 101}, "segment", "range"),
    ({"data": "a", "segment": -1}, "segment", "range"),
    ({"data": "a", "segment": "1"}, "segment", "64-bit"),
    ({"data": "a", "segment": False}, "segment", "64-bit"),
    ({"data": "a", "headers": {"k": 1}}, "headers", "string"),
    ({"data": "a", "headers": ["k"]}, "headers", "object"),
    ({"data": "a", "text": "typo"}, "text", "unknown"),
]


@pytest.mark.parametrize(("message", "field", "words"), BAD_MESSAGES)
async def test_a_bad_message_at_index_3_stores_nothing(
    q: TestClient, message: Any, field: str, words: str
) -> None:
    batch = [{"data": "ok"}] * 3 + [message] + [{"data": "ok"}]
    resp = await q.post(f"{Q}/messages", json={"messages": batch})
    error = await error_of(resp, 400)
    assert error["code"] == "invalid_message"
    assert error["index"] == 3
    assert error["field"] == field
    assert words.lower() in error["message"].lower()
    assert "message 3" in error["message"]
    got = await read(q)
    assert (got["messages"], got["last_id"]) == ([], 0)


async def test_not_an_object_in_a_batch(q: TestClient) -> None:
    error = await error_of(await q.post(f"{Q}/messages", json={"messages": [{"data": "a"}, "b"]}), 400)
    assert (error["code"], error["index"]) == ("invalid_message", 1)


@pytest.mark.parametrize(
    "body", [[{"data": "a"}], "text", 5, {"messages": {"data": "a"}}, {"messages": [], "extra": 1}]
)
async def test_bad_body_shapes(q: TestClient, body: Any) -> None:
    error = await error_of(await q.post(f"{Q}/messages", json=body), 400)
    assert error["code"] == "invalid_request"


async def test_invalid_json(q: TestClient) -> None:
    resp = await q.post(f"{Q}/messages", data=b'{"data": "a"', headers={"Content-Type": "application/json"})
    assert (await error_of(resp, 400))["code"] == "invalid_request"


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "zstd"])
async def test_a_body_not_in_its_content_encoding_is_400(q: TestClient, encoding: str) -> None:
    # A 500 until aiohttp's RequestPayloadError was caught.
    headers = {"Content-Type": "application/json", "Content-Encoding": encoding}
    resp = await q.post(f"{Q}/messages", data=b"this is not compressed at all", headers=headers)
    error = await error_of(resp, 400)
    assert error["code"] == "invalid_request"
    assert encoding in error["message"]


async def test_json_sent_as_curl_sends_it_is_taken_as_json(q: TestClient) -> None:
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    resp = await q.post(
        f"{Q}/messages", data=b'{"data": "pay #17", "source": "shop", "external_id": 17}', headers=form
    )
    assert resp.status == 200, await resp.text()
    assert (await resp.json())["results"][0]["duplicate"] is False
    resp = await q.post(f"{Q}/messages", data=b"data=pay+17", headers=form)
    assert resp.status == 400
    error = (await resp.json())["error"]
    assert error["code"] == "invalid_request" and "curl -d" in error["message"], error


async def test_unsupported_content_type(q: TestClient) -> None:
    resp = await q.post(f"{Q}/messages", data=b"a=b", headers={"Content-Type": "text/csv"})
    assert (await error_of(resp, 400))["code"] == "invalid_request"


async def test_empty_batch(q: TestClient) -> None:
    assert await produce(q, {"messages": []}) == {"results": []}


async def test_bad_save_mode(q: TestClient) -> None:
    resp = await q.post(f"{Q}/messages", json={"data": "a"}, params={"save": "eventually"})
    assert (await error_of(resp, 400))["code"] == "invalid_save_mode"
    for mode in ("none", "immediate", "mark", "wait", "default", "0", "4"):
        await produce(q, {"data": mode}, save=mode)
    assert (await read(q))["last_id"] == 7


async def test_message_over_max_message_size(q: TestClient, api_settings: ServerSettings) -> None:
    big = "x" * (api_settings.max_message_size + 1)
    resp = await q.post(f"{Q}/messages", json={"messages": [{"data": "a"}, {"data": big}]})
    error = await error_of(resp, 413)
    assert (error["code"], error["index"]) == ("payload_too_large", 1)
    resp = await q.post(
        f"{Q}/messages", data=big.encode(), headers={"Content-Type": "application/octet-stream"}
    )
    assert (await error_of(resp, 413))["code"] == "payload_too_large"
    assert (await read(q))["last_id"] == 0


async def test_batch_over_max_batch(q: TestClient, api_settings: ServerSettings) -> None:
    batch = [{"data": "a"}] * (api_settings.max_batch + 1)
    error = await error_of(await q.post(f"{Q}/messages", json={"messages": batch}), 413)
    assert error["code"] == "payload_too_large"
    ndjson = b"\n".join(orjson.dumps(m) for m in batch)
    resp = await q.post(f"{Q}/messages", data=ndjson, headers={"Content-Type": "application/x-ndjson"})
    assert (await error_of(resp, 413))["code"] == "payload_too_large"
    assert len((await produce(q, {"messages": batch[:-1]}))["results"]) == api_settings.max_batch


# --- read ------------------------------------------------------------------------------------


async def test_limit_and_paging(q: TestClient) -> None:
    await produce(q, {"messages": [{"data": str(i)} for i in range(10)]})
    page = await read(q, after="0", limit="4")
    assert [m["id"] for m in page["messages"]] == [1, 2, 3, 4] and page["last_id"] == 4
    page = await read(q, after=str(page["last_id"]), limit="100")
    assert [m["id"] for m in page["messages"]] == [5, 6, 7, 8, 9, 10]
    page = await read(q, after="10")
    assert page == {"messages": [], "last_id": 10}


async def test_limit_is_capped_at_max_limit(
    aiohttp_client: Any, cluster: Cluster, supervisor: Supervisor
) -> None:
    client = await aiohttp_client(create_app(cluster, ServerSettings(max_limit=3), supervisor))
    await client.put(Q, json={})
    await client.post(f"{Q}/messages", json={"messages": [{"data": "x"}] * 5})
    resp = await client.get(f"{Q}/messages", params={"limit": "1000"})
    assert len((await resp.json())["messages"]) == 3


async def test_segment_filter_moves_last_id_past_skipped_messages(q: TestClient) -> None:
    await produce(q, {"messages": [{"data": str(s), "segment": s} for s in (1, 15, 2, 25, 40)]})
    got = await read(q, segments="0-9,20-29")
    assert [m["segment"] for m in got["messages"]] == [1, 2, 25]
    got = await read(q, after="4", segments="0-9,20-29")
    assert got == {"messages": [], "last_id": 5}
    got = await read(q, segments="40")
    assert [m["segment"] for m in got["messages"]] == [40]


async def test_a_read_filters_by_source_header_and_json_field(q: TestClient) -> None:
    await produce(
        q,
        {
            "messages": [
                {"data": '{"customer": {"id": 42}, "total": 10}', "source": "shop", "segment": 1},
                {"data": '{"customer": {"id": 7}}', "source": "shop", "headers": {"kind": "refund"}},
                {"data": "not json", "source": "till", "headers": {"kind": "refund"}},
                {"data": '{"customer": {"id": 42}}', "source": "till", "segment": 3},
                {"data": '{"customer": {"id": "42"}}', "source": "shop"},
            ]
        },
    )
    assert ids(await read(q, source="shop")) == [1, 2, 5]
    assert ids(await read(q, **{"header.kind": "refund"})) == [2, 3]
    # A JSON value compares as JSON: 42 the number, "42" the string.
    assert ids(await read(q, **{"json.customer.id": "42"})) == [1, 4]
    assert ids(await read(q, **{"json.customer.id": '"42"'})) == [5]
    # Every filter must match, segments included; last_id says how far the read looked.
    got = await read(q, source="till", segments="3", **{"json.customer.id": "42"})
    assert (ids(got), got["last_id"]) == ([4], 5)
    got = await read(q, after="1", limit="1", source="shop")
    assert (ids(got), got["last_id"]) == ([2], 2)
    assert await read(q, after="2", source="nobody") == {"messages": [], "last_id": 5}


async def test_a_long_poll_with_a_filter_waits_for_a_message_that_matches(q: TestClient) -> None:
    async def later() -> None:
        # The long poll is waiting before each message comes.
        await parked("Queue.wait_for")
        await produce(q, {"data": "other", "headers": {"kind": "refund"}})
        await parked("Queue.wait_for")
        await produce(q, {"data": "mine", "headers": {"kind": "order"}})

    task = asyncio.create_task(later())
    got = await read(q, wait="5", **{"header.kind": "order"})
    await task
    assert [m["data"] for m in got["messages"]] == ["mine"]


def ids(got: dict[str, Any]) -> list[int]:
    return [m["id"] for m in got["messages"]]


async def test_an_unknown_read_parameter_is_named(q: TestClient) -> None:
    resp = await q.get(f"{Q}/messages", params={"after": "0", "sauce": "shop"})
    assert resp.status == 400
    assert (await resp.json())["error"]["parameter"] == "sauce"


@pytest.mark.parametrize(
    "params",
    [
        {"after": "x"},
        {"after": "-1"},
        {"after": "1.5"},
        {"limit": "0"},
        {"limit": "many"},
        {"segments": "a-b"},
        {"segments": "5-1"},
        {"segments": "1-2-3"},
        {"segments": "1,,2"},
        {"wait": "soon"},
        {"wait": "-1"},
        {"wait": "nan"},
        {"wait": "inf"},
        {"wait": "1e999"},
    ],
)
async def test_bad_read_parameters(q: TestClient, params: dict[str, str]) -> None:
    error = await error_of(await q.get(f"{Q}/messages", params=params), 400)
    assert error["code"] == "invalid_request"
    assert error["parameter"] == next(iter(params))


async def test_ndjson_out(q: TestClient) -> None:
    await produce(q, {"messages": [{"data": "a"}, {"data_b64": "/w=="}]})
    resp = await q.get(f"{Q}/messages", headers={"Accept": "application/x-ndjson"})
    assert resp.status == 200
    assert resp.content_type == "application/x-ndjson"
    assert resp.headers["Capella-Last-Id"] == "2"
    lines = (await resp.read()).split(b"\n")
    assert lines[-1] == b""
    assert [orjson.loads(line)["id"] for line in lines[:-1]] == [1, 2]
    resp = await q.get(f"{Q}/messages", params={"after": "2"}, headers={"Accept": "application/x-ndjson"})
    assert (await resp.read(), resp.headers["Capella-Last-Id"]) == (b"", "2")


async def test_long_poll_returns_when_a_message_arrives(q: TestClient) -> None:
    async def later() -> None:
        await asyncio.sleep(0.2)  # the delay the long poll must wait out (measured below)
        await produce(q, {"data": "late"})

    started = time.monotonic()
    task = asyncio.create_task(later())
    got = await read(q, after="0", wait="10")
    elapsed = time.monotonic() - started
    await task
    assert [m["data"] for m in got["messages"]] == ["late"]
    assert 0.15 <= elapsed < 1.5


async def test_long_poll_times_out_empty_and_wait_is_capped(
    aiohttp_client: Any, cluster: Cluster, supervisor: Supervisor
) -> None:
    client = await aiohttp_client(create_app(cluster, ServerSettings(max_wait=0.3), supervisor))
    await client.put(Q, json={})
    started = time.monotonic()
    resp = await client.get(f"{Q}/messages", params={"wait": "60s"})
    elapsed = time.monotonic() - started
    assert await resp.json() == {"messages": [], "last_id": 0}
    assert 0.25 <= elapsed < 2


async def test_long_poll_ignores_messages_outside_the_segments(q: TestClient) -> None:
    async def later() -> None:
        # The long poll is waiting before each message comes.
        await parked("Queue.wait_for")
        await produce(q, {"data": "other", "segment": 50})
        await parked("Queue.wait_for")
        await produce(q, {"data": "mine", "segment": 5})

    task = asyncio.create_task(later())
    got = await read(q, wait="5", segments="0-9")
    await task
    assert [m["data"] for m in got["messages"]] == ["mine"]
    assert got["last_id"] == 2


async def test_long_poll_ends_when_the_queue_is_dropped(q: TestClient) -> None:
    async def later() -> None:
        await parked("Queue.wait_for")  # the long poll is waiting before the queue goes
        await q.delete(Q)

    task = asyncio.create_task(later())
    started = time.monotonic()
    resp = await q.get(f"{Q}/messages", params={"wait": "2"})
    await task
    assert resp.status == 200
    assert time.monotonic() - started < 1.5


# --- stream ----------------------------------------------------------------------------------


async def next_events(resp: Any, count: int) -> list[dict[str, str]]:
    """Read ``count`` SSE events (comments are skipped)."""
    events: list[dict[str, str]] = []
    current: dict[str, str] = {}
    while len(events) < count:
        line = (await asyncio.wait_for(resp.content.readline(), 5)).decode().rstrip("\n")
        if line == "":
            if current:
                events.append(current)
                current = {}
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(": ")
        current[field] = value
    return events


async def test_stream_tails_and_resumes_with_last_event_id(q: TestClient) -> None:
    await produce(q, {"messages": [{"data": "a"}, {"data": "b"}]})
    resp = await q.get(f"{Q}/stream")
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    events = await next_events(resp, 2)
    assert [e["id"] for e in events] == ["1", "2"]
    assert all(e["event"] == "message" for e in events)
    assert orjson.loads(events[1]["data"])["data"] == "b"
    await produce(q, {"data": "c"})
    (event,) = await next_events(resp, 1)
    assert orjson.loads(event["data"])["id"] == 3
    resp.close()

    await produce(q, {"messages": [{"data": "d"}, {"data": "e"}]})
    resp = await q.get(f"{Q}/stream", params={"after": "0"}, headers={"Last-Event-ID": "3"})
    assert [e["id"] for e in await next_events(resp, 2)] == ["4", "5"]
    resp.close()
    resp = await q.get(f"{Q}/stream", params={"after": "4"})
    assert [e["id"] for e in await next_events(resp, 1)] == ["5"]
    resp.close()


async def test_stream_bad_parameters(q: TestClient) -> None:
    assert (await q.get(f"{Q}/stream", params={"after": "x"})).status == 400
    assert (await q.get(f"{Q}/stream", headers={"Last-Event-ID": "abc"})).status == 400
    assert (await q.get(f"{Q}/stream", params={"segments": "z"})).status == 400


async def stream_app(
    aiohttp_client: Any, cluster: Cluster, supervisor: Supervisor
) -> tuple[TestClient, web.Application]:
    app = create_app(cluster, ServerSettings(), supervisor)
    app[HEARTBEAT] = 0.05
    client = await aiohttp_client(app)
    await client.put(Q, json={})
    return client, app


async def test_stream_heartbeat_and_stop_on_shutdown(
    aiohttp_client: Any, cluster: Cluster, supervisor: Supervisor
) -> None:
    client, app = await stream_app(aiohttp_client, cluster, supervisor)
    resp = await client.get(f"{Q}/stream")
    comments = 0
    while comments < 3:
        line = await asyncio.wait_for(resp.content.readline(), 5)
        comments += line.startswith(b":")
    await app.shutdown()
    # The server ends the stream: the body reaches its end instead of hanging.
    rest = await asyncio.wait_for(resp.content.read(), 5)
    assert b"event:" not in rest


async def test_stream_ends_when_the_queue_is_dropped(
    aiohttp_client: Any, cluster: Cluster, supervisor: Supervisor
) -> None:
    client, _ = await stream_app(aiohttp_client, cluster, supervisor)
    resp = await client.get(f"{Q}/stream")
    await asyncio.wait_for(resp.content.readline(), 5)
    assert (await client.delete(Q)).status == 204
    await asyncio.wait_for(resp.content.read(), 5)


async def test_stream_survives_a_client_going_away(
    aiohttp_client: Any, cluster: Cluster, supervisor: Supervisor
) -> None:
    client, _ = await stream_app(aiohttp_client, cluster, supervisor)
    for _ in range(3):
        resp = await client.get(f"{Q}/stream")
        await asyncio.wait_for(resp.content.readline(), 5)
        resp.close()
    await asyncio.sleep(0.2)  # a few heartbeats hit the closed connections
    await client.post(f"{Q}/messages", json={"data": "still here"})
    resp = await client.get(f"{Q}/stream")
    (event,) = await next_events(resp, 1)
    assert orjson.loads(event["data"])["data"] == "still here"
    resp.close()
