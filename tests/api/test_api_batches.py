"""Record batches on the wire: the binary produce body and the binary read page (docs/format.md).

A batch body answers exactly what the JSON body of the same messages answers and stores the
same messages; a body that does not parse is a 400 ``invalid_batch`` and stores nothing; a
batch page decodes to the messages the JSON answer holds. Every test runs the real app on
loopback over a real cluster, on a clock that stands still so two queues' messages compare
equal field by field.
"""

from __future__ import annotations

import asyncio
import struct
import zlib
from typing import Any

import msgspec
import orjson
import pytest
from aiohttp.test_utils import TestClient
from support import shapes
from support.clock import Clock
from support.shapes import NOT_UTF8
from support.wait import parked, sealed

from capella.client import AsyncClient, Client
from capella.client.message import to_batch
from capella.config import ServerSettings
from capella.core.cluster import Cluster
from capella.records import record_batch
from capella.wire import batch_page
from capella.wire.messages import Messages

# The hand-moved clock, never moved here: two queues' messages get the same times.
pytestmark = pytest.mark.hand_clock
NOW = Clock().now
BATCH = {"Content-Type": batch_page.BATCH_MEDIA_TYPE}
PAGE = {"Accept": batch_page.PAGE_MEDIA_TYPE}
# The shapes every read test meets, and two whose external id and source are given as defaults.
SHAPES: list[dict[str, Any]] = [
    *shapes.SHAPES,
    {"data": "own id, default time", "external_id": 0},
    {"data": "explicit source", "source": "test"},
]
COUNT = 27  # two sealed blocks of 10, seven in the open block


def shape(i: int) -> dict[str, Any]:
    message = SHAPES[i % len(SHAPES)]
    return {**message, "external_id": 1000 + i} if "external_id" in message else message


def body_of(messages: list[dict[str, Any]]) -> bytes:
    body = to_batch(messages)
    assert body is not None
    return body


async def make_queue(api: TestClient, name: str, **definition: Any) -> str:
    assert (await api.put(f"/v1/queues/{name}", json=definition)).status == 201
    return f"/v1/queues/{name}/messages"


async def post(api: TestClient, path: str, body: bytes, **params: str) -> tuple[int, Any]:
    resp = await api.post(path, data=body, headers=BATCH, params=params)
    return resp.status, await resp.json()


async def stored(api: TestClient, path: str) -> list[dict[str, Any]]:
    resp = await api.get(path, params={"limit": "1000"})
    assert resp.status == 200
    messages: list[dict[str, Any]] = (await resp.json())["messages"]
    return messages


# --- produce -----------------------------------------------------------------------------------


async def test_a_batch_body_answers_and_stores_what_the_json_body_does(api: TestClient) -> None:
    messages = [shape(i) for i in range(COUNT)]
    as_json = await make_queue(api, "j")
    as_batch = await make_queue(api, "b")
    resp = await api.post(as_json, json={"messages": messages}, params={"save": "wait"})
    assert resp.status == 200
    json_answer = await resp.json()
    status, batch_answer = await post(api, as_batch, body_of(messages), save="wait")
    assert status == 200
    assert batch_answer == json_answer
    assert await stored(api, as_batch) == await stored(api, as_json)
    # Again: every identity is now a duplicate, answered with the first id, in both forms.
    again = await api.post(as_json, json={"messages": messages})
    status, batch_again = await post(api, as_batch, body_of(messages))
    assert (status, batch_again) == (200, await again.json())
    assert [r["duplicate"] for r in batch_again["results"]] == ["external_id" in m for m in messages]


async def test_several_batches_in_one_body_are_one_request_in_order(api: TestClient) -> None:
    path = await make_queue(api, "several")
    first = record_batch.encode([b"a", b"b"])
    second = record_batch.encode([b"c"], sources=["dc2"], external_ids=[7])
    status, answer = await post(api, path, first + second)
    assert status == 200
    assert answer == {"results": [{"id": i, "duplicate": False} for i in (1, 2, 3)]}
    got = await stored(api, path)
    assert [m["data"] for m in got] == ["a", "b", "c"]
    assert (got[2]["source"], got[2]["external_id"], got[0]["source"]) == ("dc2", 7, "test")


async def test_an_empty_batch_body_answers_an_empty_result(api: TestClient) -> None:
    path = await make_queue(api, "empty")
    assert await post(api, path, b"") == (200, {"results": []})


async def test_a_duplicate_inside_one_batch_is_stored_once(api: TestClient) -> None:
    path = await make_queue(api, "dups")
    body = record_batch.encode([b"x", b"y", b"z"], sources=["s", "s", "s"], external_ids=[5, 5, 6])
    status, answer = await post(api, path, body)
    assert status == 200
    assert answer["results"] == [
        {"id": 1, "duplicate": False},
        {"id": 1, "duplicate": True},
        {"id": 2, "duplicate": False},
    ]
    assert [m["data"] for m in await stored(api, path)] == ["x", "z"]


def _with_body_crc(batch: bytes, body: bytes) -> bytes:
    """``batch`` with its body replaced by ``body`` and both checksums made right again."""
    head = bytearray(batch[: record_batch.HEAD.size])
    struct.pack_into("<I", head, 0, len(head) - 4 + len(body))
    struct.pack_into("<I", head, 32, zlib.crc32(body))
    struct.pack_into("<I", head, 4, zlib.crc32(bytes(head[8:])))
    return bytes(head) + body


def _with_head(batch: bytes, offset: int, fmt: str, value: int) -> bytes:
    """``batch`` with one head field changed and the head CRC made right again."""
    data = bytearray(batch)
    struct.pack_into(fmt, data, offset, value)
    struct.pack_into("<I", data, 4, zlib.crc32(bytes(data[8 : record_batch.HEAD.size])))
    return bytes(data)


GOOD = record_batch.encode([b"one", b"two"], segments=[1, 2])
CORRUPT = {
    "body checksum": GOOD[:-1] + bytes([GOOD[-1] ^ 1]),
    "head checksum": GOOD[:5] + bytes([GOOD[5] ^ 1]) + GOOD[6:],
    "truncated": GOOD[:-3],
    "shorter than a head": GOOD[:20],
    "length past the end": _with_head(GOOD, 0, "<I", 1 << 20),
    "huge count": _with_head(GOOD, 12, "<I", 0xFFFFFFFF),
    "count the body does not hold": _with_head(GOOD, 12, "<I", 1 << 24),
    "unknown flag": _with_head(GOOD, 10, "<H", 0x80),
    "flag without its column": _with_head(GOOD, 10, "<H", record_batch.FLAG_HEADERS),
    "version": _with_head(GOOD, 8, "<B", 3),
    "payload lengths past the body": _with_body_crc(GOOD, struct.pack("<II", 100, 100) + b"x" * 8),
    "a good batch then garbage": GOOD + b"\x00garbage",
    "a source in the head": record_batch.encode([b"x"], source="someone-else"),
}


@pytest.mark.parametrize("name", sorted(CORRUPT))
async def test_a_body_that_does_not_parse_is_invalid_batch_and_stores_nothing(
    api: TestClient, name: str
) -> None:
    path = await make_queue(api, "corrupt")
    status, answer = await post(api, path, GOOD + CORRUPT[name])
    assert status == 400, answer
    assert answer["error"]["code"] == "invalid_batch"
    assert await stored(api, path) == []


async def test_every_check_of_json_produce_holds_for_batches(
    api: TestClient, api_settings: ServerSettings
) -> None:
    path = await make_queue(api, "limits", segments={"min": 0, "max": 9})

    async def refused(
        messages: list[dict[str, Any]], status: int, code: str, **params: str
    ) -> dict[str, Any]:
        got, answer = await post(api, path, body_of(messages), **params)
        assert (got, answer["error"]["code"]) == (status, code), answer
        json_answer = await api.post(path, json={"messages": messages}, params=params)
        assert json_answer.status == status and (await json_answer.json())["error"] == answer["error"]
        error: dict[str, Any] = answer["error"]
        return error

    ok = {"data": "ok"}
    big = "x" * (api_settings.max_message_size + 1)
    error = await refused([ok, {"data": big}], 413, "payload_too_large")
    assert error["index"] == 1
    many = {f"h{i}": "v" for i in range(api_settings.max_message_headers + 1)}
    error = await refused([ok, ok, {"data": "h", "headers": many}], 400, "message_headers_too_large")
    assert (error["index"], error["field"]) == (2, "headers")
    wide = {"h": "v" * (api_settings.max_message_headers_size + 1)}
    await refused([{"data": "h", "headers": wide}], 400, "message_headers_too_large")
    error = await refused([ok, {"data": "s", "segment": 10}], 400, "invalid_message")
    assert (error["index"], error["field"]) == (1, "segment")
    error = await refused([{"data": "t", "external_time": NOW + 3600}], 400, "invalid_message")
    assert error["field"] == "external_time"
    await refused([ok] * (api_settings.max_batch + 1), 413, "payload_too_large")
    assert await stored(api, path) == []


async def test_what_the_client_cannot_send_as_a_batch_is_still_checked_by_the_server(api: TestClient) -> None:
    path = await make_queue(api, "raw")
    long_source = record_batch.encode([b"x"], sources=["s" * 256])
    status, answer = await post(api, path, long_source)
    assert (status, answer["error"]["code"], answer["error"]["field"]) == (400, "invalid_message", "source")
    status, answer = await post(api, path, record_batch.encode([b"x"], external_times=[float("inf")]))
    assert (status, answer["error"]["field"]) == (400, "external_time")
    status, answer = await post(api, path, GOOD, delay="10s")
    assert (status, answer["error"]["code"]) == (400, "invalid_request")
    assert "JSON" in answer["error"]["message"]
    assert await stored(api, path) == []


# --- read ------------------------------------------------------------------------------------

READS = [
    {"after": "0", "limit": "100"},
    {"after": "0", "limit": "1"},
    {"after": "4", "limit": "3"},
    {"after": "7", "limit": "9"},
    {"after": "15", "limit": "100"},
    {"after": "22", "limit": "2"},
    {"after": str(COUNT), "limit": "10"},
    {"after": "500", "limit": "10"},
    {"segments": "3-7"},
    {"source": "dc1"},
    {"header.x": "2"},
    {"json.order.id": "42"},
]


@pytest.fixture
async def filled(api: TestClient, cluster: Cluster) -> TestClient:
    path = await make_queue(api, "r", block={"max_messages": 10})
    # Two batch requests and a JSON one: the blocks hold runs of each.
    messages = [shape(i) for i in range(COUNT)]
    assert (await post(api, path, body_of(messages[:12]), save="wait"))[0] == 200
    assert (await api.post(path, json={"messages": messages[12:20]}, params={"save": "wait"})).status == 200
    assert (await post(api, path, body_of(messages[20:]), save="wait"))[0] == 200
    await sealed(cluster.queue("r"), 2, 5)
    return api


@pytest.mark.parametrize("params", READS)
async def test_a_batch_page_decodes_to_the_json_answers_messages(
    filled: TestClient, params: dict[str, str]
) -> None:
    for _ in range(2):  # and again, from the cached record batches
        resp = await filled.get("/v1/queues/r/messages", params=params, headers=PAGE)
        assert resp.status == 200
        assert resp.content_type == batch_page.PAGE_MEDIA_TYPE
        body = await resp.read()
        messages, last_id = batch_page.decode_page(body)
        as_json = await filled.get("/v1/queues/r/messages", params=params)
        page = msgspec.json.decode(await as_json.read(), type=Messages)
        assert messages == page.messages
        assert last_id == page.last_id == int(resp.headers["Capella-Last-Id"])
        magic, version, flags, count, head_last = batch_page.PAGE_HEAD.unpack_from(body)
        assert (magic, version, flags, count, head_last) == (b"CPP2", 2, 0, len(messages), last_id)


async def test_a_whole_batch_is_served_as_the_bytes_it_was_stored_as(filled: TestClient) -> None:
    resp = await filled.get("/v1/queues/r/messages", params={"after": "22", "limit": "100"}, headers=PAGE)
    body = await resp.read()
    batches = record_batch.read_all(body, batch_page.PAGE_HEAD.size)
    assert [(b.base_id, b.count, b.base_time) for b in batches] == [(23, COUNT - 22, NOW)]
    assert batches[0].source == "test"


async def test_a_subscription_reads_batch_pages_and_long_polls(filled: TestClient) -> None:
    path = "/v1/queues/r/subscriptions/s/messages"
    resp = await filled.get(path, params={"limit": "5"}, headers=PAGE)
    messages, last_id = batch_page.decode_page(await resp.read())
    assert ([m.id for m in messages], last_id) == ([1, 2, 3, 4, 5], 5)
    waiting = asyncio.ensure_future(
        filled.get("/v1/queues/r/messages", params={"after": str(COUNT), "wait": "5"}, headers=PAGE)
    )
    await parked("Queue.wait_for")
    assert (await post(filled, "/v1/queues/r/messages", body_of([{"data": "late"}])))[0] == 200
    resp = await waiting
    messages, last_id = batch_page.decode_page(await resp.read())
    assert [(m.id, m.data) for m in messages] == [(COUNT + 1, "late")] and last_id == COUNT + 1


# --- the client ------------------------------------------------------------------------------


async def test_the_client_produces_and_reads_batches_by_default_with_the_json_results(
    filled: TestClient,
) -> None:
    async with AsyncClient(str(filled.make_url("")).rstrip("/")) as client:
        await client.put_queue("c1")
        await client.put_queue("c2")
        messages: list[Any] = [shape(i) for i in range(COUNT)] + ["a str", b"\xffbytes"]
        assert await client.produce("c1", messages) == await client.produce("c2", messages, binary=False)
        assert await client.read("c1", limit=100) == await client.read("c2", limit=100, binary=False)
        for after in (0, 9, COUNT):
            binary = await client.read("r", after=after, limit=100)
            assert binary == await client.read("r", after=after, limit=100, binary=False)
        # What a batch cannot carry goes as JSON, and the server answers as it always has.
        scheduled = await client.schedule("c1", ["later"], delay="1h")
        assert scheduled[0].scheduled_id
        with pytest.raises(Exception) as refused:
            await client.produce("c1", [{"data": "x", "nonsense": 1}])
        assert getattr(refused.value, "code", None) == "invalid_message"


def test_to_batch_leaves_to_json_what_it_cannot_carry() -> None:
    assert to_batch([]) is None
    assert to_batch([{"data": "x", "delay": "1s"}]) is None
    assert to_batch([{"data": "x", "data_b64": "eA=="}]) is None
    assert to_batch([{"data_b64": "not base64!"}]) is None
    assert to_batch([{"data": "x", "source": ""}]) is None
    assert to_batch([{"data": "x", "external_id": 1 << 63}]) is None
    assert to_batch([{"data": "x", "headers": {"a": 1}}]) is None
    body = to_batch(["t", b"b", {"data": "x", "external_time": "2024-05-01T12:00:00Z", "source": None}])
    assert body is not None
    fields = record_batch.read(body).fields()
    assert fields.payloads == [b"t", b"b", b"x"]
    assert fields.external_times[2] == 1714564800.0
    assert orjson.loads(orjson.dumps(fields.sources)) == ["", "", ""]


def test_the_blocking_client_gives_the_same_results_in_both_forms(blocking_client: Client) -> None:
    blocking_client.put_queue("parity-batch")
    blocking_client.put_queue("parity-json")
    messages: list[Any] = [shape(i) for i in range(len(SHAPES))] + ["text", NOT_UTF8, b""]
    as_batch = blocking_client.produce("parity-batch", messages)
    assert as_batch == blocking_client.produce("parity-json", messages, binary=False)
    batch_page_read = blocking_client.read("parity-batch", limit=100)
    json_read = blocking_client.read("parity-json", limit=100, binary=False)
    # Two queues, two receive times: everything else is equal.
    assert [msgspec.structs.replace(m, time=0.0, external_time=0.0) for m in batch_page_read.messages] == [
        msgspec.structs.replace(m, time=0.0, external_time=0.0) for m in json_read.messages
    ]
    assert [m.external_time for m in batch_page_read.messages][5] == 1.7e9
    assert batch_page_read.last_id == json_read.last_id
