"""Every read form on a shared queue, through a node that did not write it, answers what a
local queue answers for the same writes; a long poll on one node wakes when another commits.

The module's rig has three nodes. Node 0 holds a local queue and a shared queue, both given
the same messages (every kind of payload and field: tests/support/shapes.py) the same way;
node 1 reads the shared one in JSON, NDJSON, binary frames, batch pages, the SSE tail, long
polls, filtered and through subscriptions, and must answer what node 0 answers for its local
queue (times aside: each queue stamps its own). Cursors live in PostgreSQL: one committed on a
node is seen by the others, replica subscriptions there count for a receipt on another node.
D8 (design note §8): a reader long-polling on node 1 gets a message produced on node 0 within
the window plus 150 ms (p99 printed), also after its LISTEN connections were cut.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import msgspec
import orjson
import pytest
from support.shapes import SHAPES
from support.shared import SharedRig
from support.shared_cluster import clients, cut_listeners, listening, module_rig, read_all, timeless
from support.wait import until

from capella.client import AsyncClient
from capella.errors import QueueNotFound, SubscriptionNotFound
from capella.wire import batch_page, frames
from capella.wire.messages import StoredMessage

pytestmark = pytest.mark.slow

LOCAL, SHARED = "local-r", "shared-r"
WINDOW = 0.1  # the rig's flush_interval
NOTICE = 1.5  # NOTIFY takes milliseconds; the definitions poll 5 s
JSON: dict[str, str] = {}
NDJSON = {"Accept": "application/x-ndjson"}
BINARY = {"Accept": frames.MEDIA_TYPE}
BATCHES = {"Accept": batch_page.PAGE_MEDIA_TYPE}
FORMS = {"json": JSON, "ndjson": NDJSON, "binary": BINARY, "batches": BATCHES}
READS = [
    {"after": "0", "limit": "100"},
    {"after": "0", "limit": "1"},
    {"after": "4", "limit": "3"},
    {"after": "7", "limit": "9"},  # across the end of a produce call's batch
    {"after": "20", "limit": "100"},
    {"after": "500", "limit": "10"},  # past the end
    {"segments": "3-7"},
    {"segments": "0,7"},
    {"source": "dc1"},
    {"header.x": "2"},
    {"json.order.id": "42"},
]


def shapes(round_: int) -> list[dict[str, Any]]:
    """SHAPES with identities of this round's own."""
    out = []
    for message in SHAPES:
        m = dict(message)
        if "external_id" in m:
            m["external_id"] = m["external_id"] - 100 * round_
        out.append(m)
    return out


@pytest.fixture(scope="module")
def rig(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedRig]:
    yield from module_rig(request, tmp_path_factory)


@pytest.fixture(scope="module")
def filled(rig: SharedRig) -> SharedRig:
    """The local and the shared queue, given the same calls through node 0."""

    async def fill() -> None:
        async with clients(rig.urls) as cs:
            await cs[0].put_queue(LOCAL)
            await cs[0].put_queue(SHARED, storage="shared")
            for name in (LOCAL, SHARED):
                c = cs[0]
                await c.produce(name, shapes(0), save="wait")  # one record batch, sources mixed
                await c.produce(name, shapes(1), save="wait", binary=False)  # JSON
                await c.produce_ndjson(name, shapes(2), save="wait")
                for m in shapes(3):  # one message per call: a batch each
                    await c.produce(name, [m], save="wait")
            await until(lambda: shared_seen(cs[1]), NOTICE, "the shared queue on node 1")

    asyncio.run(fill())
    return rig


async def shared_seen(c: AsyncClient) -> bool:
    try:
        return (await c.queue(SHARED)).stats.last_id == 4 * len(SHAPES)
    except QueueNotFound:
        return False


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


async def get(
    http: aiohttp.ClientSession, url: str, path: str, headers: dict[str, str], **params: str
) -> tuple[bytes, dict[str, str]]:
    async with http.get(url + path, params=params, headers=headers) as resp:
        body = await resp.read()
        assert resp.status == 200, body
        return body, dict(resp.headers)


def decoded(form: str, body: bytes, headers: dict[str, str]) -> tuple[list[dict[str, Any]], int]:
    """A read's answer in any form as (messages without their times, last_id)."""
    if form == "json":
        page = orjson.loads(body)
        return [timeless(m) for m in page["messages"]], page["last_id"]
    if form == "ndjson":
        return [timeless(orjson.loads(line)) for line in body.splitlines()], int(headers["Capella-Last-Id"])
    decode = frames.decode_page if form == "binary" else batch_page.decode_page
    messages, last_id = decode(body)
    return [timeless(m) for m in messages], last_id


# --- the forms ----------------------------------------------------------------------------------


@pytest.mark.parametrize("form", FORMS)
async def test_every_read_form_of_a_node_that_did_not_write_answers_as_a_local_queue(
    filled: SharedRig, http: aiohttp.ClientSession, form: str
) -> None:
    local_url, reader_url = filled.urls[0], filled.urls[1]
    for params in READS:
        want = decoded(
            form, *await get(http, local_url, f"/v1/queues/{LOCAL}/messages", FORMS[form], **params)
        )
        got = decoded(
            form, *await get(http, reader_url, f"/v1/queues/{SHARED}/messages", FORMS[form], **params)
        )
        assert got == want, (form, params)
        if "limit" in params and params["after"] == "0" and params["limit"] == "100":
            assert len(got[0]) == 4 * len(SHAPES)


async def test_the_read_of_a_node_that_did_not_write_holds_every_field_and_byte(filled: SharedRig) -> None:
    async with clients(filled.urls) as cs:
        local = await read_all(cs[0], LOCAL)
        for c in cs:
            shared = await read_all(c, SHARED)
            assert [timeless(m) for m in shared] == [timeless(m) for m in local]
            assert [m.payload for m in shared] == [m.payload for m in local]
            sixth = shared[5]
            assert (sixth.source, sixth.external_id, sixth.external_time, sixth.segment) == (
                "dc1",
                -5,
                1.7e9,
                3,
            )
            assert shared[6].headers == {"x": "2", "ünï": "çødé ✓", "empty": ""}
            assert shared[0].source == "shared-test" and shared[0].external_id == 1


async def test_the_sse_tail_of_a_node_that_did_not_write_follows_the_other_node(filled: SharedRig) -> None:
    async with clients(filled.urls) as cs:
        local = [timeless(m) for m in await read_all(cs[0], LOCAL)]
        got: list[StoredMessage] = []
        total = len(local) + 3

        async def follow() -> None:
            async for message in cs[1].stream(SHARED, after=0, retries=0):
                got.append(message)
                if len(got) == total:
                    return

        follower = asyncio.create_task(follow())
        await until(lambda: len(got) >= len(local), 10.0, "the stored messages on the tail")
        # The tail goes on with what another node commits now.
        results = await cs[2].produce(SHARED, ["tail 1", "tail 2", "tail 3"], save="wait")
        async with asyncio.timeout(10.0):
            await follower
        assert [timeless(m) for m in got[: len(local)]] == local
        assert [(m.id, m.payload) for m in got[len(local) :]] == [
            (r.id, f"tail {k}".encode()) for k, r in enumerate(results, 1)
        ]


@pytest.mark.parametrize("form", FORMS)
async def test_a_long_poll_on_one_node_answers_a_commit_on_another_in_its_form(
    filled: SharedRig, http: aiohttp.ClientSession, form: str
) -> None:
    name = f"poll-{form}"
    async with clients(filled.urls) as cs:
        await cs[0].put_queue(name, storage="shared")
        await until(lambda: shared_exists(cs[1], name), NOTICE, f"{name} on node 1")
        reader = asyncio.create_task(
            get(http, filled.urls[1], f"/v1/queues/{name}/messages", FORMS[form], after="0", wait="10")
        )
        await parked_on(filled.urls[1], name)
        await cs[2].produce(name, [{"data": "woken", "segment": 4}], save="wait")
        async with asyncio.timeout(5.0):
            messages, last_id = decoded(form, *await reader)
        assert [m["id"] for m in messages] == [1] and last_id == 1
        assert messages[0]["segment"] == 4


async def shared_exists(c: AsyncClient, name: str) -> bool:
    try:
        await c.queue(name)
        return True
    except QueueNotFound:
        return False


def read_requests(url: str, queue: str) -> int:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10.0) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(f'capella_read_requests_total{{queue="{queue}"}} '):
                return int(float(line.rsplit(" ", 1)[1]))
    return 0


async def parked_on(url: str, queue: str, count: int = 1, since: int = 0) -> None:
    """Until ``url``'s node has read ``queue`` ``count`` more times than ``since``: a long poll
    reads once, finds nothing, then waits (no way to see the wait itself from outside)."""
    deadline = time.monotonic() + 10.0
    while read_requests(url, queue) < since + count:
        assert time.monotonic() < deadline, f"no long poll on {queue} at {url}"
        await asyncio.sleep(0.005)


# --- subscriptions ------------------------------------------------------------------------------


async def test_a_subscription_read_with_commit_auto_moves_the_cursor_every_node_sees(
    filled: SharedRig,
) -> None:
    async with clients(filled.urls) as cs:
        first = await cs[1].read_subscription(SHARED, "reader", limit=10)
        assert [m.id for m in first.messages] == list(range(1, 11)) and first.last_id == 10

        async def cursor_on(c: AsyncClient) -> int:
            try:
                return (await c.subscription(SHARED, "reader")).last_id
            except SubscriptionNotFound:
                return -1  # created through node 1 a moment ago: not heard of here yet

        deadline = time.monotonic() + NOTICE
        while any([await cursor_on(c) != 10 for c in cs]):
            assert time.monotonic() < deadline, "the cursor on every node"
            await asyncio.sleep(0.02)
        # Another node goes on from there, in another form.
        second = await cs[2].read_subscription(SHARED, "reader", limit=5, binary=False)
        assert [m.id for m in second.messages] == list(range(11, 16))
        assert await cursor_on(cs[0]) in (10, 15)  # 15 once the notice came
        # A commit never moves a cursor back, through any node; a reset does.
        assert (await cs[0].commit(SHARED, "reader", 3)).last_id == 15
        assert (await cs[1].commit(SHARED, "reader", 3, reset=True)).last_id == 3
        third = await cs[2].read_subscription(SHARED, "reader", limit=1, commit="none")
        assert [m.id for m in third.messages] == [4]
        names = {s.name for s in await cs[2].subscriptions(SHARED)}
        assert "reader" in names
        await cs[0].delete_subscription(SHARED, "reader")
        deadline = time.monotonic() + NOTICE
        while "reader" in {s.name for s in await cs[2].subscriptions(SHARED)}:
            assert time.monotonic() < deadline, "the dropped subscription gone from node 2"
            await asyncio.sleep(0.02)


async def test_a_consumer_reading_its_subscription_through_alternating_nodes_gets_each_message_once(
    filled: SharedRig,
) -> None:
    """commit=auto is at-most-once: each read after the last answer starts where that one
    ended, whichever node it goes to (a node's own copy of the cursor may be a notice behind)."""
    async with clients(filled.urls) as cs:
        await cs[0].put_queue("alternating", storage="shared")
        await until(lambda: shared_exists(cs[2], "alternating"), NOTICE, "alternating on node 2")
        await cs[0].produce("alternating", [f"m{k}" for k in range(300)], save="wait")
        await until(lambda: last_id_on(cs[2], "alternating", 300), NOTICE, "the messages' head on node 2")
        seen: list[int] = []
        for n in range(60):
            page = await cs[n % 3].read_subscription("alternating", "consumer", limit=5, binary=n % 2 == 0)
            seen.extend(m.id for m in page.messages)
        assert seen == list(range(1, 301))


async def last_id_on(c: AsyncClient, name: str, last_id: int) -> bool:
    return (await c.queue(name)).stats.last_id >= last_id


async def test_a_subscription_long_poll_wakes_on_a_commit_of_another_node(filled: SharedRig) -> None:
    async with clients(filled.urls) as cs:
        await cs[0].put_queue("sub-poll", storage="shared")
        await until(lambda: shared_exists(cs[1], "sub-poll"), NOTICE, "sub-poll on node 1")
        await cs[1].commit("sub-poll", "tail", 0)
        reader = asyncio.create_task(cs[1].read_subscription("sub-poll", "tail", wait=10))
        await parked_on(filled.urls[1], "sub-poll")
        await cs[2].produce("sub-poll", ["one"], save="wait")
        async with asyncio.timeout(5.0):
            got = await reader
        assert [m.payload for m in got.messages] == [b"one"]
        assert (await cs[1].subscription("sub-poll", "tail")).last_id == 1


async def test_a_receipt_on_one_node_counts_a_replica_committed_through_another(filled: SharedRig) -> None:
    async with clients(filled.urls) as cs:
        await cs[0].put_queue("receipts", storage="shared")
        await until(lambda: shared_exists(cs[1], "receipts"), NOTICE, "receipts on node 1")
        await cs[1].commit("receipts", "dc2", 0, replica=True)
        await cs[1].commit("receipts", "reader", 0, replica=False)

        async with aiohttp.ClientSession() as http:
            producing = asyncio.create_task(
                http.post(
                    f"{filled.urls[0]}/v1/queues/receipts/messages",
                    params={"replicas": "1", "replica_timeout": "10", "save": "wait"},
                    json={"messages": [{"data": "a"}]},
                )
            )
            # The message is committed before its receipt can come: wait for it on node 2.
            deadline = time.monotonic() + 5.0
            while (await cs[2].queue("receipts")).stats.last_id < 1:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.02)
            await cs[2].commit("receipts", "reader", 1)  # not a replica: counts for nothing
            assert not producing.done()
            await cs[2].commit("receipts", "dc2", 1)
            async with asyncio.timeout(5.0):
                resp = await producing
            body = await resp.json()
        assert resp.status == 200, body
        assert body["results"] == [{"id": 1, "duplicate": False}]
        assert body["replicas"] == {"required": 1, "count": 1, "subscriptions": ["dc2"]}
        assert (await cs[0].replicas("receipts", 1)).subscriptions == ["dc2"]


# --- save modes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("save", ["none", "mark"])
async def test_none_and_mark_answer_pending_from_the_buffer_and_appear_within_the_window(
    filled: SharedRig, save: str
) -> None:
    name = f"buffered-{save}"
    async with clients(filled.urls) as cs:
        await cs[0].put_queue(name, storage="shared")
        await until(lambda: shared_exists(cs[1], name), NOTICE, f"{name} on node 1")
        started = time.monotonic()
        results = await cs[0].produce(name, ["a", "b"], save=save)
        answered = time.monotonic() - started
        # Answered before any flush: no id yet.
        assert [msgspec.to_builtins(r) for r in results] == [
            {"id": 0, "duplicate": False, "pending": True}
        ] * 2
        deadline = time.monotonic() + WINDOW + 2.0
        while not (found := await read_all(cs[1], name)):
            assert time.monotonic() < deadline, "the buffered messages on node 1"
            await asyncio.sleep(0.01)
        seen = time.monotonic() - started
        print(
            f"\nsave={save}: answered in {answered * 1000:.1f} ms, on another node after {seen * 1000:.0f} ms"
        )
        assert [(m.id, m.payload) for m in found] == [(1, b"a"), (2, b"b")]


@pytest.mark.shared_rig(flush_interval="3s")
async def test_immediate_flushes_at_once_where_wait_waits_for_the_window(shared_rig: SharedRig) -> None:
    shared_rig.start(2)
    async with clients(shared_rig.urls) as cs:
        await cs[0].put_queue("now", storage="shared")
        await until(lambda: shared_exists(cs[1], "now"), NOTICE, "now on node 1")
        started = time.monotonic()
        (result,) = await cs[0].produce("now", ["at once"], save="immediate")
        took = time.monotonic() - started
        assert result.id == 1 and took < 1.5, took  # well inside the 3 s window
        assert [m.payload for m in (await cs[1].read("now")).messages] == [b"at once"]
        started = time.monotonic()
        (result,) = await cs[0].produce("now", ["in the window"], save="wait")
        waited = time.monotonic() - started
        assert result.id == 2 and waited >= 2.5, waited
        print(f"\nimmediate answered in {took * 1000:.0f} ms, wait in {waited * 1000:.0f} ms (window 3 s)")


# --- D8: long polls across nodes ------------------------------------------------------------


async def woken_after(
    cs: list[AsyncClient], urls: list[str], name: str, n: int, cut: SharedRig | None
) -> tuple[float, float]:
    """One trial: node 1 long-polls ``name`` after ``n - 1``; node 0 produces message ``n``.
    The seconds from sending the produce until the reader has it, and from the producer's
    answer (the commit) until then."""
    if cut is not None:  # the connections the last trial cut are back
        await until(lambda: listening(cut) >= 9, 10.0, "every node listening again")
    since = read_requests(urls[1], name)
    loop = asyncio.get_running_loop()
    reader = asyncio.create_task(cs[1].read(name, after=n - 1, wait=10))
    woken = loop.create_future()
    reader.add_done_callback(lambda _: woken.set_result(loop.time()))
    await parked_on(urls[1], name, since=since)
    if cut is not None:
        assert cut_listeners(cut) >= 9  # every node's LISTEN connections, node 1's among them
    sent = loop.time()
    await cs[0].produce(name, [f"message {n}"], save="wait")
    answered = loop.time()
    async with asyncio.timeout(10.0):
        page = await reader
        at = await woken
    assert [m.id for m in page.messages] == [n]
    return at - sent, max(0.0, at - answered)


def quantile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def figures(values: list[float]) -> str:
    shown = ", ".join(f"p{q} {quantile(values, q) * 1000:.0f}" for q in (50, 95, 99))
    return f"{shown}, max {max(values) * 1000:.0f} ms"


async def test_d8_a_long_poll_on_one_node_wakes_within_the_window_when_another_commits(
    filled: SharedRig,
) -> None:
    trials = 120
    async with clients(filled.urls) as cs:
        await cs[0].put_queue("d8", storage="shared")
        await until(lambda: shared_exists(cs[1], "d8"), NOTICE, "d8 on node 1")
        took = [await woken_after(cs, filled.urls, "d8", n, None) for n in range(1, trials + 1)]
    from_send, from_commit = [t for t, _ in took], [c for _, c in took]
    print(
        f"\nD8 long poll across nodes, {trials} trials, window {WINDOW * 1000:.0f} ms: "
        f"from the produce {figures(from_send)}; from its answer {figures(from_commit)}"
    )
    # The reader's part of the bound, the margin: from the commit to the woken answer (NOTIFY,
    # then the read), p99. The whole path's p99 (window + PUT + commit + wake) is the
    # benchmark's to hold (make bench): on a loaded two-core machine the commit stalls, not
    # the wake. The whole path's median is held here all the same.
    assert quantile(from_commit, 99) <= 0.150, figures(from_commit)
    assert quantile(from_send, 50) <= WINDOW + 0.150, figures(from_send)


async def test_d8_a_long_poll_still_wakes_after_its_listen_connection_was_cut(filled: SharedRig) -> None:
    trials = 10
    async with clients(filled.urls) as cs:
        await cs[0].put_queue("d8-cut", storage="shared")
        await until(lambda: shared_exists(cs[1], "d8-cut"), NOTICE, "d8-cut on node 1")
        took = [await woken_after(cs, filled.urls, "d8-cut", n, filled) for n in range(1, trials + 1)]
    from_send = [t for t, _ in took]
    print(f"\nD8 with LISTEN cut, {trials} trials: from the produce {figures(from_send)}")
    assert quantile(from_send, 90) <= 0.5 + WINDOW, figures(from_send)


async def test_a_definition_made_while_the_listen_connections_are_down_is_seen_at_once(
    filled: SharedRig,
) -> None:
    """What was announced while a node did not listen (cut here; or not yet up at start) is read
    as soon as it listens again, not at the next definitions poll (5 s)."""
    async with clients(filled.urls) as cs:
        for k in range(3):
            name = f"made-in-the-dark-{k}"
            await until(lambda: listening(filled) >= 9, 10.0, "every node listening again")
            assert cut_listeners(filled) >= 9
            await cs[0].put_queue(name, storage="shared")
            started = time.monotonic()
            await until(lambda name=name: shared_exists(cs[1], name), 5.0, f"{name} on node 1")
            late = time.monotonic() - started
            assert late < 1.0, late
