"""A read answers in JSON, NDJSON or binary frames, each made from the blocks' rendered messages.

The JSON answer must be the bytes the read gave before it was assembled from slices:
``orjson.dumps`` of ``stored_message`` for every message ``Queue.read_after`` finds. Every
test runs the real app on loopback over a real cluster; the expected answers come from the
queue itself.
"""

from __future__ import annotations

import asyncio
import base64
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from support.configs import file_config
from support.shapes import NOT_UTF8, SHAPES
from support.supervisor import launched
from support.wait import parked, sealed, until

from capella.api import create_app
from capella.client import AsyncClient, Client
from capella.config import ServerSettings
from capella.core.cluster import Cluster
from capella.core.filter import MessageFilter
from capella.core.log import blocks as blocks_module
from capella.core.log.batch import Batch
from capella.core.message import LogMessage, stored_message
from capella.core.queue import Queue
from capella.errors import CorruptData
from capella.wire import batch_page, frames
from capella.wire.messages import Messages, StoredMessage

Q = "/v1/queues/r"
BINARY = {"Accept": frames.MEDIA_TYPE}
NDJSON = {"Accept": "application/x-ndjson"}
# Every kind of payload and field a reader can meet (SHAPES), spread over sealed blocks and the open one.
COUNT = 27  # two sealed blocks of 10, seven in the open block


def shape(i: int) -> dict[str, Any]:
    """The message at index ``i``: the shapes in turn, each with an identity of its own."""
    message = SHAPES[i % len(SHAPES)]
    return {**message, "external_id": -i} if "external_id" in message else message


@pytest.fixture
async def r(api: TestClient, cluster: Cluster) -> TestClient:
    assert (await api.put(Q, json={"block": {"max_messages": 10}})).status == 201
    body = {"messages": [shape(i) for i in range(COUNT)]}
    assert (await api.post(f"{Q}/messages", json=body, params={"save": "wait"})).status == 200
    assert cluster.queue("r").last_id == COUNT
    await sealed(cluster.queue("r"), 2)
    return api


async def before(queue: Queue, after: int, limit: int, match: MessageFilter | None = None) -> bytes:
    """The answer as the read rendered it before: a dict per message, one ``orjson.dumps``."""
    result = await queue.read_after(after, limit, match=match)
    shown = [stored_message(m) for m in result.messages]
    return orjson.dumps({"messages": shown, "last_id": max(result.last_id, after)})


async def body_of(api: TestClient, headers: dict[str, str] | None = None, **params: str) -> bytes:
    resp = await api.get(f"{Q}/messages", params=params, headers=headers)
    assert resp.status == 200, await resp.text()
    return await resp.read()


READS = [
    {"after": "0", "limit": "100"},
    {"after": "0", "limit": "1"},
    {"after": "4", "limit": "3"},  # from the middle of the first sealed block
    {"after": "7", "limit": "9"},  # across the end of a sealed block
    {"after": "15", "limit": "100"},  # the middle of a sealed block, then the open block
    {"after": "22", "limit": "2"},  # inside the open block
    {"after": str(COUNT), "limit": "10"},  # nothing after: an empty page
    {"after": "500", "limit": "10"},  # past the end
]
FILTERS: list[tuple[dict[str, str], MessageFilter]] = [
    ({"segments": "3-7"}, MessageFilter(segments=((3, 7),))),
    ({"source": "dc1"}, MessageFilter(source="dc1")),
    ({"header.x": "2"}, MessageFilter(headers=(("x", "2"),))),
    ({"json.order.id": "42"}, MessageFilter(fields=((("order", "id"), 42),))),
]


@pytest.mark.parametrize("params", READS)
async def test_the_json_answer_is_the_bytes_it_was(
    r: TestClient, cluster: Cluster, params: dict[str, str]
) -> None:
    expected = await before(cluster.queue("r"), int(params["after"]), int(params["limit"]))
    assert await body_of(r, **params) == expected
    # And again, now that every block it crosses has its rendered messages cached.
    assert await body_of(r, **params) == expected


@pytest.mark.parametrize(("params", "match"), FILTERS)
async def test_a_filtered_json_answer_is_the_bytes_it_was(
    r: TestClient, cluster: Cluster, params: dict[str, str], match: MessageFilter
) -> None:
    for after, limit in ((0, 100), (0, 1), (9, 2)):
        expected = await before(cluster.queue("r"), after, limit, match)
        assert await body_of(r, after=str(after), limit=str(limit), **params) == expected


async def test_json_holds_text_and_base64_payloads_and_every_field(r: TestClient) -> None:
    page = orjson.loads(await body_of(r, limit="8"))
    shown = {m["id"]: m for m in page["messages"]}
    assert shown[1]["data"] == "plain text"
    assert base64.b64decode(shown[2]["data_b64"]) == NOT_UTF8 and "data" not in shown[2]
    assert shown[3]["data"] == ""
    assert shown[4]["data"] == 'ünïcødé "quoted" \\ back\nslash\ttab \u0001'
    assert shown[6]["source"] == "dc1" and shown[6]["external_id"] == -5 and shown[6]["segment"] == 3
    assert shown[6]["external_time"] == 1.7e9
    assert shown[7]["headers"] == {"x": "2", "ünï": "çødé ✓", "empty": ""}
    assert base64.b64decode(shown[8]["data_b64"]) == bytes(range(256))


@pytest.mark.parametrize("params", [*READS, *(p for p, _ in FILTERS)])
async def test_ndjson_lines_are_the_json_answers_messages(r: TestClient, params: dict[str, str]) -> None:
    resp = await r.get(f"{Q}/messages", params=params, headers=NDJSON)
    assert resp.status == 200
    assert resp.content_type == "application/x-ndjson"
    lines = await resp.read()
    page = orjson.loads(await body_of(r, **params))
    assert [orjson.loads(line) for line in lines.splitlines()] == page["messages"]
    assert lines.endswith(b"\n") or not lines
    assert int(resp.headers["Capella-Last-Id"]) == page["last_id"]


async def test_a_large_ndjson_read_is_streamed_block_by_block(r: TestClient) -> None:
    resp = await r.get(f"{Q}/messages", params={"limit": "1000"}, headers=NDJSON)
    assert resp.status == 200
    # Written as it is rendered: chunked, not one body with a length known up front.
    assert resp.headers.get("Transfer-Encoding") == "chunked"
    assert "Content-Length" not in resp.headers
    chunks = [chunk async for chunk, _ in resp.content.iter_chunks()]
    assert b"".join(chunks).count(b"\n") == COUNT


@pytest.mark.parametrize("params", [*READS, *(p for p, _ in FILTERS)])
async def test_binary_frames_decode_to_the_json_answers_messages(
    r: TestClient, params: dict[str, str]
) -> None:
    resp = await r.get(f"{Q}/messages", params=params, headers=BINARY)
    assert resp.status == 200
    assert resp.content_type == frames.MEDIA_TYPE
    messages, last_id = frames.decode_page(await resp.read())
    page = msgspec.json.decode(await body_of(r, **params), type=Messages)
    assert messages == page.messages
    assert last_id == page.last_id == int(resp.headers["Capella-Last-Id"])


async def test_binary_frames_carry_every_field_and_payload_byte(r: TestClient) -> None:
    body = await body_of(r, BINARY, limit="8")
    magic, version, flags, count, last_id = frames.PAGE_HEAD.unpack_from(body)
    assert (magic, version, flags, count, last_id) == (b"CPM1", 1, 0, 8, 8)
    messages, _ = frames.decode_page(body)
    assert [m.payload for m in messages] == [
        b"plain text",
        NOT_UTF8,
        b"",
        'ünïcødé "quoted" \\ back\nslash\ttab \u0001'.encode(),
        b'{"order": {"id": 42, "lines": [1, 2]}}',
        b"all fields",
        b"unicode headers",
        bytes(range(256)),
    ]
    sixth = messages[5]
    assert (sixth.source, sixth.external_id, sixth.external_time, sixth.segment) == ("dc1", -5, 1.7e9, 3)
    assert messages[6].headers == {"x": "2", "ünï": "çødé ✓", "empty": ""}
    assert messages[0].headers == {} and messages[0].source == "test"
    # The first frame, byte by byte as docs/format.md says.
    head = frames.FRAME_HEAD.unpack_from(body, frames.PAGE_HEAD.size)
    length, mid, _, external_id, _, segment, slen, hlen, plen = head
    assert (mid, external_id, segment, slen, hlen, plen) == (1, 1, 0, 4, 0, 10)
    assert length == frames.FRAME_HEAD.size - 4 + slen + hlen + plen
    at = frames.PAGE_HEAD.size + frames.FRAME_HEAD.size
    assert body[at : at + slen + plen] == b"testplain text"


async def test_an_empty_read_in_every_form(r: TestClient) -> None:
    params = {"after": str(COUNT)}
    assert orjson.loads(await body_of(r, **params)) == {"messages": [], "last_id": COUNT}
    assert await body_of(r, NDJSON, **params) == b""
    assert await body_of(r, BINARY, **params) == frames.page_head(0, COUNT)
    assert frames.decode_page(frames.page_head(0, COUNT)) == ([], COUNT)


@pytest.mark.parametrize("headers", [BINARY, NDJSON, {}])
async def test_a_long_poll_answers_in_the_asked_form(r: TestClient, headers: dict[str, str]) -> None:
    waiting = asyncio.ensure_future(body_of(r, headers, after=str(COUNT), wait="2"))
    await parked("Queue.wait_for")  # nothing is there yet: the answer must not come
    assert not waiting.done()
    await r.post(f"{Q}/messages", json={"data_b64": base64.b64encode(NOT_UTF8).decode()})
    body = await waiting
    if headers is BINARY:
        messages = frames.decode_page(body)[0]
    elif headers is NDJSON:
        messages = [msgspec.json.decode(line, type=StoredMessage) for line in body.splitlines()]
    else:
        messages = msgspec.json.decode(body, type=Messages).messages
    assert [(m.id, m.payload) for m in messages] == [(COUNT + 1, NOT_UTF8)]


@pytest.mark.parametrize(
    "accept", ["text/html", "application/xml, text/plain", "application/json;q=0", "*/*; q=0.0"]
)
async def test_an_accept_naming_no_form_is_refused_with_a_stable_code(r: TestClient, accept: str) -> None:
    resp = await r.get(f"{Q}/messages", headers={"Accept": accept})
    assert resp.status == 406
    assert resp.content_type == "application/json"
    error = (await resp.json())["error"]
    assert error["code"] == "not_acceptable"
    assert error["accept"] == accept
    assert frames.MEDIA_TYPE in error["message"]


@pytest.mark.parametrize(
    ("accept", "form"),
    [
        ("*/*", "application/json"),
        ("application/*", "application/json"),
        ("text/html, application/json;q=0.9", "application/json"),
        (f"text/plain, {frames.MEDIA_TYPE}", frames.MEDIA_TYPE),
        (f"{frames.MEDIA_TYPE};q=0, application/x-ndjson", "application/x-ndjson"),
    ],
)
async def test_the_first_form_the_accept_header_lists_wins(r: TestClient, accept: str, form: str) -> None:
    resp = await r.get(f"{Q}/messages", headers={"Accept": accept})
    assert resp.status == 200
    assert resp.content_type == form


async def test_a_refused_accept_leaves_the_subscription_cursor_where_it_was(r: TestClient) -> None:
    path = f"{Q}/subscriptions/s/messages"
    assert (await r.get(path, params={"limit": "3"})).status == 200
    resp = await r.get(path, params={"limit": "3"}, headers={"Accept": "text/html"})
    assert resp.status == 406
    messages, last_id = frames.decode_page(await body_of_path(r, path, BINARY, limit="3"))
    assert [m.id for m in messages] == [4, 5, 6] and last_id == 6


async def body_of_path(api: TestClient, path: str, headers: dict[str, str], **params: str) -> bytes:
    resp = await api.get(path, params=params, headers=headers)
    assert resp.status == 200, await resp.text()
    return await resp.read()


async def test_the_async_client_decodes_both_forms_to_equal_messages(r: TestClient) -> None:
    async with AsyncClient(str(r.make_url("")).rstrip("/")) as client:
        for after in (0, 9, COUNT):
            as_json = await client.read("r", after=after, limit=100, binary=False)
            as_binary = await client.read("r", after=after, limit=100, binary=True)
            assert as_binary == as_json
        filtered = await client.read("r", headers={"x": "2"}, binary=True)
        assert filtered == await client.read("r", headers={"x": "2"}, binary=False)
        assert [m.headers["x"] for m in filtered.messages] == ["2"] * len(filtered.messages)
        everything = await client.read("r", limit=100, binary=False)
        via_subscription = await client.read_subscription("r", "b", limit=5, binary=True)
        assert via_subscription == Messages(everything.messages[:5], 5)


def test_the_blocking_client_reads_binary_like_json(blocking_client: Client) -> None:
    blocking_client.put_queue("frames")
    blocking_client.produce("frames", ["text", NOT_UTF8, b"", {"data": "h", "headers": {"ü": "✓"}}])
    assert blocking_client.read("frames", binary=True) == blocking_client.read("frames", binary=False)
    assert [m.payload for m in blocking_client.read("frames", binary=True).messages] == [
        b"text",
        NOT_UTF8,
        b"",
        b"h",
    ]


async def test_only_the_last_blocks_read_keep_their_rendered_forms(api: TestClient, cluster: Cluster) -> None:
    assert (await api.put(Q, json={"block": {"max_messages": 10}})).status == 201
    for part in range(2):  # a batch holds at most 50 here
        body = {"messages": [{"data": f"m{part}-{i}"} for i in range(30)]}
        assert (await api.post(f"{Q}/messages", json=body, params={"save": "wait"})).status == 200
    queue = cluster.queue("r")
    await sealed(queue, 5)
    after = 0
    for headers in ({}, BINARY, {}):
        while after < 60:
            raw = await body_of(api, headers, after=str(after), limit="7")
            after = orjson.loads(raw)["last_id"] if not headers else frames.decode_page(raw)[1]
            batches = list(queue._loaded.values())
            assert len(batches) <= blocks_module.LOADED_BLOCKS
            assert sum(b.rendered for b in batches) <= blocks_module.RENDERED_BLOCKS
        after = 0
    # A block whose forms were dropped renders them again, the same.
    assert await body_of(api, after="0", limit="60") == await before(queue, 0, 60)


# --- a corrupt block ------------------------------------------------------------------------


@pytest.fixture
async def file_api(
    aiohttp_client: Callable[[web.Application], Awaitable[TestClient[web.Request, web.Application]]],
    tmp_path: Path,
) -> AsyncIterator[tuple[TestClient[web.Request, web.Application], Cluster]]:
    cluster = await Cluster.open(file_config(tmp_path, block={"max_messages": 10}))
    supervisor = await launched(cluster)
    try:
        yield await aiohttp_client(create_app(cluster, ServerSettings(), supervisor)), cluster
    finally:
        await supervisor.close()
        await cluster.close()


@pytest.mark.parametrize("headers", [{}, NDJSON, BINARY])
async def test_a_corrupt_block_is_skipped_and_quarantined_in_every_form(
    file_api: tuple[TestClient, Cluster], tmp_path: Path, headers: dict[str, str]
) -> None:
    api, cluster = file_api
    assert (await api.put(Q, json={})).status == 201
    body = {"messages": [{"data": f"m{i}"} for i in range(25)]}
    assert (await api.post(f"{Q}/messages", json=body, params={"save": "wait"})).status == 200
    queue = cluster.queue("r")
    await sealed(queue, 2)
    queue.unload(idle=0, age=None)  # the next read loads the blocks from their files
    [first, *_] = sorted((tmp_path / "data" / "queues" / "r" / "blocks").iterdir())
    data = bytearray(first.read_bytes())
    data[len(data) // 2] ^= 0x01
    first.write_bytes(bytes(data))

    resp = await api.get(f"{Q}/messages", params={"limit": "100"}, headers=headers)
    assert resp.status == 200
    raw = await resp.read()
    if headers is BINARY:
        ids = [m.id for m in frames.decode_page(raw)[0]]
    elif headers is NDJSON:
        ids = [orjson.loads(line)["id"] for line in raw.splitlines()]
    else:
        ids = [m["id"] for m in orjson.loads(raw)["messages"]]
    assert ids == list(range(11, 26))
    assert queue.stats()["blocks"]["by_state"]["quarantined"] == 1


# --- the binary page, bad bytes ---------------------------------------------------------------


def good_page() -> bytes:
    one = frames.encode_frames([1], [1.5], ["s"], [1], [1.5], [0], [b"payload"], [{}])
    return frames.page_head(1, 1) + b"".join(one)


@pytest.mark.parametrize(
    ("page", "reason"),
    [
        (b"CPM1", "shorter than its"),
        (b"XXXX" + good_page()[4:], "bad magic"),
        (good_page()[:4] + struct.pack("<H", 2) + good_page()[6:], "unsupported format version 2"),
        (good_page()[:-1], "runs past its end"),
        (good_page()[:30], "does not parse"),
        (good_page() + b"\x00", "1 bytes after the last of 1 frames"),
        (frames.page_head(2, 1) + good_page()[frames.PAGE_HEAD.size :], "does not parse"),
    ],
)
def test_a_binary_page_that_does_not_parse_is_corrupt_data(page: bytes, reason: str) -> None:
    assert frames.decode_page(good_page())[0][0].payload == b"payload"
    with pytest.raises(CorruptData, match=reason):
        frames.decode_page(page)


async def test_a_page_of_the_open_block_holds_only_its_own_messages(r: TestClient, cluster: Cluster) -> None:
    queue = cluster.queue("r")
    page = await queue.read_page(21, 3)
    [(batch, start, stop)] = page.parts
    # A copy of the page's slice: rendering it renders 3 messages, not the rest of the block.
    assert (len(batch), start, stop, page.last_id) == (3, 0, 3, 24)
    assert [m.id for m in page.messages()] == [22, 23, 24]


async def test_the_next_block_is_rendered_before_the_reader_is_there(r: TestClient, cluster: Cluster) -> None:
    queue = cluster.queue("r")
    # Both sealed blocks are loaded (the writer sealed them) and nothing is rendered yet.
    assert [b.rendered for b in queue._loaded.values()] == [False, False]
    await body_of(r, BINARY, after="8", limit="1")  # near the end of the first block
    # The render runs in a worker thread.
    await until(lambda: queue._loaded[11].rendered, what="the next block rendered")
    assert queue._loaded[11].frames() == queue._loaded[11].frames()
    messages, _ = frames.decode_page(await body_of(r, BINARY, after="10", limit="10"))
    assert [m.id for m in messages] == list(range(11, 21))


async def test_a_block_that_holds_the_readers_form_is_not_rendered_ahead_again(
    r: TestClient, cluster: Cluster
) -> None:
    # A block the writer sealed holds its record batches: a reader of batch pages needs
    # nothing rendered, so reading on in the block before it starts no render in a thread.
    queue = cluster.queue("r")
    store = queue._store
    for after in range(2, 9):
        body = await body_of(r, {"Accept": batch_page.PAGE_MEDIA_TYPE}, after=str(after), limit="1")
        assert [m.id for m in batch_page.decode_page(body)[0]] == [after + 1]
        assert 11 not in store._loading
    # A JSON reader does want the next block rendered ahead, once.
    await body_of(r, after="8", limit="1")
    assert 11 in store._loading
    await until(lambda: 11 not in store._loading, what="the render ahead done")
    await body_of(r, after="9", limit="1")
    assert 11 not in store._loading


# Whole blocks of ASCII (every byte below 128, so quotes, backslashes, control characters and
# DEL), or of any bytes: the bulk render copies a block's payloads as they are only when none
# needs an escape, and must give the bytes of the per-message render either way.
PAYLOADS = st.one_of(
    st.lists(st.binary(max_size=40).map(lambda b: bytes(c & 0x7F for c in b)), min_size=1, max_size=30),
    st.lists(st.sampled_from([b"plain", b"a b/c 'd'", b"\x7f:\x7f", b"x" * 300]), min_size=1, max_size=30),
    st.lists(st.binary(max_size=20), min_size=1, max_size=30),
)


@settings(max_examples=300, deadline=None)
@given(PAYLOADS)
def test_a_block_rendered_in_bulk_is_the_bytes_of_each_message_rendered_alone(payloads: list[bytes]) -> None:
    messages = [
        LogMessage(i + 1, 1.7e9 + i, "edge", i + 1, 1.7e9 + i, 0, p, {}) for i, p in enumerate(payloads)
    ]
    assert Batch.of_messages(messages).json() == [orjson.dumps(stored_message(m)) for m in messages]


@pytest.mark.parametrize("odd_one", [None, 0, 700, 1499])
def test_a_large_block_is_checked_for_escapes_in_every_part(odd_one: int | None) -> None:
    payloads = [b"plain %d" % i for i in range(1500)]  # checked a few hundred at a time
    if odd_one is not None:
        payloads[odd_one] = b'needs "escapes"'
    messages = [LogMessage(i + 1, 1.7e9, "edge", i + 1, 1.7e9, 0, p, {}) for i, p in enumerate(payloads)]
    assert Batch.of_messages(messages).json() == [orjson.dumps(stored_message(m)) for m in messages]
