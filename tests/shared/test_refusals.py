"""What shared queues do not do in this version is refused clearly, and copies work both ways.

Bad input is answered with a status and a stable code, and stores nothing: an ack-mode
subscription, a delayed message, a push handler, and the per-node handlers (pg_inbox,
pg_outbox, flush, unload, archive) naming a shared queue are ``not_on_shared_queue`` (400);
a node without ``[shared]`` refuses a ``"storage": "shared"`` definition with
``shared_not_configured``. Copy handlers work from a shared queue into a local one and from a
local one into a shared one, on any node, and a copy sent again is absorbed by dedup.
"""

from __future__ import annotations

import asyncio
import io
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest
from support.servers import ServerProcess
from support.shared import SharedRig
from support.shared_cluster import clients, module_rig, read_all
from support.wait import until

from capella.client import AsyncClient
from capella.client.message import to_batch
from capella.config import ServerSettings
from capella.errors import QueueNotFound
from capella.wire.batch_page import BATCH_MEDIA_TYPE

pytestmark = pytest.mark.slow

NOTICE = 1.5


@pytest.fixture(scope="module")
def rig(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedRig]:
    yield from module_rig(request, tmp_path_factory)


@pytest.fixture(scope="module")
def shared_q(rig: SharedRig) -> str:
    """A shared queue "refusing" with one message, seen by every node; a local one beside it."""

    async def make() -> None:
        async with clients(rig.urls) as cs:
            await cs[0].put_queue("refusing", storage="shared")
            await cs[0].put_queue("local-here")
            await cs[0].produce("refusing", ["kept"], save="wait")

            async def everywhere() -> bool:
                for c in cs:
                    try:
                        if (await c.queue("refusing")).stats.last_id != 1:
                            return False
                    except QueueNotFound:
                        return False
                return True

            await until(everywhere, NOTICE, "refusing on every node")

    asyncio.run(make())
    return "refusing"


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


async def call(
    http: aiohttp.ClientSession, method: str, url: str, body: Any = None, **params: str
) -> tuple[int, Any]:
    async with http.request(method, url, json=body, params=params) as resp:
        return resp.status, await resp.json(content_type=None)


async def refused(
    http: aiohttp.ClientSession, method: str, url: str, body: Any = None, *, code: str, **params: str
) -> dict[str, Any]:
    status, answer = await call(http, method, url, body, **params)
    assert status == 400, answer
    assert set(answer) == {"error"}, answer
    error = dict(answer["error"])
    assert error["code"] == code, error
    assert isinstance(error["message"], str) and error["message"]
    return error


async def last_ids(cs: list[AsyncClient], name: str) -> list[int]:
    return [(await c.queue(name)).stats.last_id for c in cs]


# --- ack mode, delayed delivery -------------------------------------------------------------


@pytest.mark.parametrize("node", [0, 1])
async def test_an_ack_mode_subscription_on_a_shared_queue_is_refused(
    rig: SharedRig, shared_q: str, http: aiohttp.ClientSession, node: int
) -> None:
    base = f"{rig.urls[node]}/v1/queues/{shared_q}/subscriptions/workers"
    error = await refused(http, "PUT", base, {"mode": "ack"}, code="not_on_shared_queue")
    assert "shared" in error["message"] and "ack-mode" in error["message"]
    await refused(
        http, "PUT", base, {"mode": "ack", "policy": {"max_attempts": 3}}, code="not_on_shared_queue"
    )
    # Nor can it be reached as one: claims and the work list.
    await refused(http, "POST", f"{base}/claim", {}, code="not_on_shared_queue")
    await refused(http, "GET", f"{base}/work", code="not_on_shared_queue")
    async with clients(rig.urls) as cs:
        assert "workers" not in {s.name for s in await cs[2].subscriptions(shared_q)}


@pytest.mark.parametrize(
    "messages",
    [
        [{"data": "later", "delay": "1h"}],
        [{"data": "later", "deliver_at": time.time() + 3600}],
        [{"data": "now"}, {"data": "later", "delay": "10s"}],  # one delayed message refuses the batch
    ],
)
async def test_a_delayed_message_to_a_shared_queue_is_refused_and_nothing_is_stored(
    rig: SharedRig, shared_q: str, http: aiohttp.ClientSession, messages: list[dict[str, Any]]
) -> None:
    async with clients(rig.urls) as cs:
        before = await last_ids(cs, shared_q)
        for url in rig.urls:
            error = await refused(
                http,
                "POST",
                f"{url}/v1/queues/{shared_q}/messages",
                {"messages": messages},
                code="not_on_shared_queue",
            )
            assert "delayed delivery" in error["message"]
            assert error.get("field", "").startswith("messages[")
            await refused(
                http,
                "POST",
                f"{url}/v1/queues/{shared_q}/messages",
                {"messages": messages},
                code="not_on_shared_queue",
                save="none",
            )
        # Nothing reached a flush: every node still sees what was there.
        await asyncio.sleep(0)
        assert await last_ids(cs, shared_q) == before
        assert len(await read_all(cs[1], shared_q)) == before[0]


async def test_the_schedule_of_a_shared_queue_is_refused(
    rig: SharedRig, shared_q: str, http: aiohttp.ClientSession
) -> None:
    base = f"{rig.urls[1]}/v1/queues/{shared_q}/scheduled"
    await refused(http, "GET", base, code="not_on_shared_queue")
    await refused(http, "GET", f"{base}/1", code="not_on_shared_queue")
    await refused(http, "POST", f"{base}/cancel", {"ids": [1]}, code="not_on_shared_queue")


@pytest.fixture(scope="module")
def limited(rig: SharedRig) -> tuple[str, str]:
    """A local queue on node 0 and a shared one, both with segments 0-9."""

    async def make() -> None:
        async with clients(rig.urls) as cs:
            await cs[0].put_queue("limits-local", segments={"min": 0, "max": 9})
            await cs[0].put_queue("limits-shared", storage="shared", segments={"min": 0, "max": 9})
            await until(lambda: all_see(cs, ["limits-shared"]), NOTICE, "limits-shared on every node")

    asyncio.run(make())
    return "limits-local", "limits-shared"


OK = {"data": "ok"}
LIMITS = ServerSettings()
BAD_INPUT = {
    "too large": [OK, {"data": "x" * (LIMITS.max_message_size + 1)}],
    "too many headers": [
        OK,
        OK,
        {"data": "h", "headers": {f"h{i}": "v" for i in range(LIMITS.max_message_headers + 1)}},
    ],
    "headers too wide": [{"data": "h", "headers": {"h": "v" * (LIMITS.max_message_headers_size + 1)}}],
    "segment out of range": [OK, {"data": "s", "segment": 10}],
    "external time ahead": [{"data": "t", "external_time": time.time() + 3600}],
    "empty source": [{"data": "s", "source": ""}],
    "batch too long": [OK] * (LIMITS.max_batch + 1),
}


@pytest.mark.parametrize("case", BAD_INPUT)
@pytest.mark.parametrize("form", ["json", "batch"])
async def test_bad_messages_are_answered_on_a_shared_queue_as_on_a_local_one_and_store_nothing(
    rig: SharedRig, limited: tuple[str, str], http: aiohttp.ClientSession, case: str, form: str
) -> None:
    messages = BAD_INPUT[case]
    answers = []
    for url, queue in ((rig.urls[0], limited[0]), (rig.urls[1], limited[1])):
        target = f"{url}/v1/queues/{queue}/messages"
        if form == "json":
            body = json.dumps({"messages": messages}).encode()
            headers = {"Content-Type": "application/json"}
            request = http.post(target, data=io.BytesIO(body), headers=headers, params={"save": "wait"})
        else:
            body = to_batch(messages)
            if body is None:
                pytest.skip("the client sends this one as JSON only")
            request = http.post(
                target,
                data=io.BytesIO(body),
                headers={"Content-Type": BATCH_MEDIA_TYPE},
                params={"save": "wait"},
            )
        async with request as resp:
            answers.append((resp.status, await resp.json()))
    (local_status, local), (shared_status, shared) = answers
    assert local_status in (400, 413), local
    assert (shared_status, shared) == (local_status, local)
    async with clients(rig.urls) as cs:
        assert await last_ids(cs, limited[1]) == [0, 0, 0]


# --- handlers ---------------------------------------------------------------------------------


def per_node_handlers(rig: SharedRig, queue: str) -> list[tuple[str, dict[str, Any]]]:
    return [
        ("push", {"type": "push", "queue": queue, "params": {"url": "http://127.0.0.1:9/hook"}}),
        ("pg_inbox", {"type": "pg_inbox", "queue": queue, "params": {"dsn": rig.dsn}}),
        ("pg_outbox", {"type": "pg_outbox", "params": {"to": queue, "dsn": rig.dsn}}),
        ("flush", {"type": "flush", "queues": [queue]}),
        ("unload", {"type": "unload", "queues": [queue]}),
        ("archive", {"type": "archive", "queues": [queue], "params": {"conditions": [{"mark": 1}]}}),
    ]


@pytest.mark.parametrize("kind", ["push", "pg_inbox", "pg_outbox", "flush", "unload", "archive"])
async def test_a_per_node_handler_naming_a_shared_queue_is_refused(
    rig: SharedRig, shared_q: str, http: aiohttp.ClientSession, kind: str
) -> None:
    definition = dict(per_node_handlers(rig, shared_q))[kind]
    name = f"refused-{kind.replace('_', '-')}"
    error = await refused(
        http,
        "PUT",
        f"{rig.urls[2]}/v1/handlers/{name}",
        {**definition, "started": False},
        code="not_on_shared_queue",
    )
    assert shared_q in error["message"]
    status, _ = await call(http, "GET", f"{rig.urls[2]}/v1/handlers/{name}")
    assert status == 404
    # The same definition on the local queue beside it is not refused for being on it.
    local = dict(per_node_handlers(rig, "local-here"))[kind]
    if kind == "archive":
        local["params"] = {"conditions": [{"mark": 0}]}  # the one mark a default local queue has
    status, answer = await call(http, "PUT", f"{rig.urls[0]}/v1/handlers/{name}", {**local, "started": False})
    assert status == 201, answer
    status, _ = await call(http, "DELETE", f"{rig.urls[0]}/v1/handlers/{name}")
    assert status in (200, 204)


async def test_a_handler_whose_pattern_matches_a_shared_queue_skips_it(
    rig: SharedRig, shared_q: str, http: aiohttp.ClientSession
) -> None:
    url = f"{rig.urls[0]}/v1/handlers/every-flush"
    status, answer = await call(http, "PUT", url, {"type": "flush", "queues": ["*"], "started": False})
    assert status == 201, answer
    try:
        status, answer = await call(http, "POST", f"{url}/run")
        assert status == 200, answer
        assert answer.get("last_error") is None, answer
    finally:
        await call(http, "DELETE", url)


async def test_a_node_without_shared_refuses_a_shared_definition(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    plain = ServerProcess(tmp_path_factory.mktemp("plain") / "data")
    try:
        plain.wait_ready()
        async with aiohttp.ClientSession() as http:
            error = await refused(
                http,
                "PUT",
                f"{plain.url}/v1/queues/wanted",
                {"storage": "shared"},
                code="shared_not_configured",
            )
            assert "[shared]" in error["message"] and error.get("field") == "storage"
            status, _ = await call(http, "GET", f"{plain.url}/v1/queues/wanted")
            assert status == 404
            # A local queue of that name stays local: it cannot be turned shared either.
            status, _ = await call(http, "PUT", f"{plain.url}/v1/queues/wanted", {})
            assert status == 201
            await refused(
                http, "PUT", f"{plain.url}/v1/queues/wanted", {"storage": "shared"}, code="invalid_request"
            )
    finally:
        plain.stop()


# --- copy handlers ------------------------------------------------------------------------------


async def test_copy_handlers_from_a_shared_queue_into_a_local_one_and_back_into_a_shared_one(
    rig: SharedRig, http: aiohttp.ClientSession
) -> None:
    async with clients(rig.urls) as cs:
        await cs[0].put_queue("copy-src", storage="shared")
        await cs[0].put_queue("copy-sink", storage="shared")
        await until(lambda: all_see(cs, ["copy-src", "copy-sink"]), NOTICE, "the copy queues on every node")
        await cs[1].put_queue("copy-mid")  # node 1's own
        written = await cs[2].produce(
            "copy-src",
            [{"data": f"m{n}", "source": "orders", "external_id": n, "segment": n % 3} for n in range(1, 51)],
        )
        assert [r.id for r in written] == list(range(1, 51))

        # On node 1: shared copy-src -> local copy-mid -> shared copy-sink.
        for name, body in (
            (
                "src-to-mid",
                {"type": "copy", "queues": ["copy-src"], "params": {"to": "copy-mid", "wait": "1s"}},
            ),
            (
                "mid-to-sink",
                {"type": "copy", "queues": ["copy-mid"], "params": {"to": "copy-sink", "wait": "1s"}},
            ),
        ):
            status, answer = await call(http, "PUT", f"{rig.urls[1]}/v1/handlers/{name}", body)
            assert status == 201, answer

        async def sink_full() -> bool:
            return (await cs[0].queue("copy-sink")).stats.last_id >= 50

        await until(sink_full, 20.0, "50 messages copied into copy-sink")
        mid = await read_all(cs[1], "copy-mid")
        assert [(m.source, m.external_id, m.payload) for m in mid] == [
            ("orders", n, f"m{n}".encode()) for n in range(1, 51)
        ]
        # The copy's cursor on the shared source lives in PostgreSQL: every node sees it.
        for c in cs:
            await until(
                lambda c=c: cursor_at(c, "copy-src", "copy-to-copy-mid", 50),
                NOTICE,
                "the copy cursor on every node",
            )

        # A copy sent again is absorbed by dedup: reset both cursors, run again.
        for queue, sub, node in (("copy-src", "copy-to-copy-mid", 0), ("copy-mid", "copy-to-copy-sink", 1)):
            await cs[node].commit(queue, sub, 0, reset=True)
        for name in ("src-to-mid", "mid-to-sink"):
            await call(http, "POST", f"{rig.urls[1]}/v1/handlers/{name}/run")
        for queue, sub, node in (("copy-src", "copy-to-copy-mid", 1), ("copy-mid", "copy-to-copy-sink", 1)):
            await until(lambda q=queue, s=sub, n=node: cursor_at(cs[n], q, s, 50), 20.0, f"{sub} back at 50")
        for name in ("src-to-mid", "mid-to-sink"):
            status, answer = await call(http, "DELETE", f"{rig.urls[1]}/v1/handlers/{name}")
            assert status in (200, 204), answer

        assert (await cs[1].queue("copy-mid")).stats.last_id == 50
        for c in cs:
            sink = await read_all(c, "copy-sink")
            assert [(m.id, m.source, m.external_id, m.payload, m.segment) for m in sink] == [
                (n, "orders", n, f"m{n}".encode(), n % 3) for n in range(1, 51)
            ]


async def all_see(cs: list[AsyncClient], names: list[str]) -> bool:
    for c in cs:
        for name in names:
            try:
                await c.queue(name)
            except QueueNotFound:
                return False
    return True


async def cursor_at(c: AsyncClient, queue: str, sub: str, last_id: int) -> bool:
    try:
        return (await c.subscription(queue, sub)).last_id >= last_id
    except Exception:
        return False


async def test_local_queues_of_two_nodes_copied_into_one_shared_queue_keep_every_message(
    rig: SharedRig, http: aiohttp.ClientSession
) -> None:
    async with clients(rig.urls) as cs:
        await cs[0].put_queue("fan-in", storage="shared")
        await until(lambda: all_see(cs, ["fan-in"]), NOTICE, "fan-in on every node")
        for i in (1, 2):
            await cs[i].put_queue("node-buffer")  # each node's own, as an edge buffer
            await cs[i].produce("node-buffer", [f"node {i} #{k}" for k in range(3)], save="wait")
            body = {"type": "copy", "queues": ["node-buffer"], "params": {"to": "fan-in", "wait": 0}}
            status, answer = await call(
                http, "PUT", f"{rig.urls[i]}/v1/handlers/fan-in", {**body, "started": False}
            )
            assert status == 201, answer
            status, answer = await call(http, "POST", f"{rig.urls[i]}/v1/handlers/fan-in/run")
            assert status == 200 and answer["status"].get("last_error") is None, answer
            await call(http, "DELETE", f"{rig.urls[i]}/v1/handlers/fan-in")
        found = sorted(m.payload for m in await read_all(cs[0], "fan-in"))
        assert found == sorted(f"node {i} #{k}".encode() for i in (1, 2) for k in range(3))
