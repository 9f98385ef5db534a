"""Bad days for shared queues, on real processes: S3 or PostgreSQL cut off or blackholed, a node
started while PostgreSQL is down, a node restarted after ``kill -9`` reclaiming its name.

moto keeps its objects in memory and is never killed: the nodes reach it (or PostgreSQL)
through a ``TcpProxy`` the test cuts (connections reset, new ones refused) or blackholes
(accepted, never answered). What must hold each time: a write answers 503 within
``storage.write_timeout`` (short here) plus the flush window; reads of what the node has cached
keep working; ``/readyz`` answers 503 naming the part that fails; and once the proxy is
restored, ``/readyz`` is 200 again and writes go through, by themselves, with no identity
stored twice and no id skipped.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from support.pg import PgServer, available
from support.servers import S3Server
from support.shared import SharedRig
from support.tcp_proxy import TcpProxy
from support.wait import until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(available() is not None, reason=f"shared queues need PostgreSQL: {available()}"),
]

WRITE_TIMEOUT = 2.0
WINDOW = 0.05
# A failed write is answered within write_timeout past the window; this much more is the
# request's own way through the server and the client on 2 busy cores.
ANSWER_SLACK = 1.5
EXTRA = f'[storage]\nwrite_timeout = "{WRITE_TIMEOUT:g}s"\n'
RECOVER_WITHIN = 15.0
IDLE_DETECT_WITHIN = 10.0  # the lease is renewed every 3 s: an idle node notices PostgreSQL gone


@pytest.fixture
def s3_proxy(s3_server: S3Server) -> Iterator[TcpProxy]:
    proxy = TcpProxy(s3_server.port).start()
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture
def pg_proxy(pg_server: PgServer) -> Iterator[TcpProxy]:
    proxy = TcpProxy(pg_server.port).start()
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30.0)) as session:
        yield session


def make_rig(root: Path, pg: PgServer, s3: S3Server, **options: Any) -> SharedRig:
    return SharedRig(root, pg=pg, s3=s3, flush_interval=f"{int(WINDOW * 1000)}ms", extra=EXTRA, **options)


async def call(
    http: aiohttp.ClientSession, method: str, url: str, body: Any = None, **params: str
) -> tuple[int, Any, float]:
    """Status, JSON body and seconds of one request."""
    started = time.monotonic()
    async with http.request(method, url, json=body, params=params or None) as resp:
        found = await resp.json(content_type=None)
        return resp.status, found, time.monotonic() - started


def messages(source: str, first: int, count: int) -> dict[str, Any]:
    return {
        "messages": [
            {"data": f"{source}-{e}", "source": source, "external_id": e} for e in range(first, first + count)
        ]
    }


async def create_shared(http: aiohttp.ClientSession, url: str, name: str) -> None:
    status, body, _ = await call(http, "PUT", f"{url}/v1/queues/{name}", {"storage": "shared"})
    assert status in (200, 201), body


async def produce(
    http: aiohttp.ClientSession, url: str, queue: str, source: str, first: int, count: int
) -> tuple[int, Any, float]:
    body = messages(source, first, count)
    return await call(http, "POST", f"{url}/v1/queues/{queue}/messages", body, save="wait")


async def read(http: aiohttp.ClientSession, url: str, queue: str) -> tuple[int, Any]:
    status, body, _ = await call(http, "GET", f"{url}/v1/queues/{queue}/messages", after="0", limit="1000")
    return status, body


async def readiness(http: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    status, body, _ = await call(http, "GET", f"{url}/readyz")
    return status, body


async def until_ready(http: aiohttp.ClientSession, url: str, within: float = RECOVER_WITHIN) -> None:
    async def ready() -> bool:
        return (await readiness(http, url))[0] == 200

    await until(ready, within, f"{url}/readyz 200", every=0.1)


async def until_not_ready(http: aiohttp.ClientSession, url: str, part: str, within: float) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    async def faulty() -> bool:
        status, body = await readiness(http, url)
        seen.update(body)
        return status == 503 and part in body.get("shared", {}).get("parts", [])

    await until(faulty, within, f"{url}/readyz 503 naming {part}", every=0.1)
    return seen


def assert_stored_once(body: dict[str, Any], source: str, count: int) -> None:
    ids = [m["id"] for m in body["messages"]]
    assert ids == list(range(1, count + 1))
    assert [m["external_id"] for m in body["messages"]] == list(range(1, count + 1))
    assert [m["data"] for m in body["messages"]] == [f"{source}-{e}" for e in range(1, count + 1)]


@pytest.mark.parametrize("how", ["cut", "blackhole"])
async def test_s3_unreachable_writes_503_in_time_cached_reads_work_and_all_resumes(
    tmp_path: Path,
    pg_server: PgServer,
    s3_server: S3Server,
    s3_proxy: TcpProxy,
    http: aiohttp.ClientSession,
    how: str,
) -> None:
    rig = make_rig(tmp_path / "rig", pg_server, s3_server, s3_endpoint=s3_proxy.url)
    try:
        await asyncio.to_thread(rig.start, 1)
        url = rig.urls[0]
        await create_shared(http, url, "q")
        status, body, _ = await produce(http, url, "q", "s", 1, 20)
        assert status == 200, body
        status, before = await read(http, url, "q")
        assert status == 200 and len(before["messages"]) == 20

        with s3_proxy.down(how):
            status, body, seconds = await produce(http, url, "q", "s", 21, 10)
            assert status == 503, body
            assert body["error"]["code"] in ("storage_unavailable", "storage_timeout")
            assert "S3" in body["error"]["message"]
            assert seconds <= WRITE_TIMEOUT + WINDOW + ANSWER_SLACK
            # What this node read before is served from its caches: no S3, no PostgreSQL needed.
            status, during = await read(http, url, "q")
            assert status == 200 and during == before
            status, ready = await readiness(http, url)
            assert status == 503, ready
            assert ready["shared"]["parts"] == ["s3"]
            assert "S3" in ready["shared"]["reason"]
            assert ready["shared"]["since"] > 0
            assert [q["queue"] for q in ready["queues"]] == ["q"]

        # No write needed: the node probes S3 and says it is ready again.
        await until_ready(http, url)
        status, body, _ = await produce(http, url, "q", "s", 21, 10)
        assert status == 200, body
        status, after = await read(http, url, "q")
        assert_stored_once(after, "s", 30)
    finally:
        await asyncio.to_thread(rig.close)


@pytest.mark.parametrize("how", ["cut", "blackhole"])
async def test_postgres_unreachable_writes_503_in_time_cached_reads_work_and_all_resumes(
    tmp_path: Path,
    pg_server: PgServer,
    s3_server: S3Server,
    pg_proxy: TcpProxy,
    http: aiohttp.ClientSession,
    how: str,
) -> None:
    rig = make_rig(tmp_path / "rig", pg_server, s3_server, pg_port=pg_proxy.port)
    try:
        await asyncio.to_thread(rig.start, 1)
        url = rig.urls[0]
        await create_shared(http, url, "q")
        status, body, _ = await produce(http, url, "q", "s", 1, 20)
        assert status == 200, body
        status, before = await read(http, url, "q")
        assert status == 200 and len(before["messages"]) == 20

        with pg_proxy.down(how):
            # Idle, the node notices by itself (its lease renewal fails).
            seen = await until_not_ready(http, url, "postgres", IDLE_DETECT_WITHIN)
            assert "postgres" in seen["shared"]["reason"]
            status, body, seconds = await produce(http, url, "q", "s", 21, 10)
            assert status == 503, body
            assert body["error"]["code"] in ("storage_unavailable", "storage_timeout")
            assert seconds <= WRITE_TIMEOUT + WINDOW + ANSWER_SLACK
            status, during = await read(http, url, "q")
            assert status == 200 and during == before

        await until_ready(http, url)
        # The flush whose commit got no answer is committed again under its object's key, by
        # itself; the producer's retry of the same identities then finds them stored, once.
        await until(
            lambda: "shared commit answered on retry" in rig.node(0).log(), 10.0, "the retried commit"
        )
        status, body, _ = await produce(http, url, "q", "s", 21, 10)
        assert status == 200, body
        assert [r["id"] for r in body["results"]] == list(range(21, 31))
        assert all(r["duplicate"] for r in body["results"])
        status, after = await read(http, url, "q")
        assert_stored_once(after, "s", 30)
    finally:
        await asyncio.to_thread(rig.close)


async def test_a_node_started_while_postgres_is_down_serves_local_queues_and_comes_up_by_itself(
    tmp_path: Path,
    pg_server: PgServer,
    s3_server: S3Server,
    pg_proxy: TcpProxy,
    http: aiohttp.ClientSession,
) -> None:
    rig = make_rig(tmp_path / "rig", pg_server, s3_server)
    # Node 0 reaches PostgreSQL directly; node 1 through the proxy, cut before it starts.
    proxied = rig.node_dsn.replace(f":{pg_server.port}/", f":{pg_proxy.port}/")
    rig.write_config(1, rig.config_text(1, shared={"dsn": proxied}))
    try:
        await asyncio.to_thread(rig.start, 1)
        first = rig.urls[0]
        await create_shared(http, first, "q")
        assert (await produce(http, first, "q", "s", 1, 5))[0] == 200

        pg_proxy.cut()
        node = await asyncio.to_thread(rig.launch, 1)

        async def alive() -> bool:
            try:
                return (await call(http, "GET", f"{node.url}/healthz"))[0] == 200
            except aiohttp.ClientError:
                return False

        await until(alive, 30.0, "node 1 serving", every=0.1)
        assert node.process.poll() is None
        seen = await until_not_ready(http, node.url, "postgres", 5.0)
        assert "not started" in seen["shared"]["reason"]
        # Local queues work meanwhile.
        status, body, _ = await call(http, "PUT", f"{node.url}/v1/queues/local", {})
        assert status == 201, body
        status, body, _ = await call(
            http, "POST", f"{node.url}/v1/queues/local/messages", {"messages": [{"data": "x"}]}, save="wait"
        )
        assert status == 200, body
        # Shared ones answer 503, not "no such queue": this node cannot know yet.
        status, body, seconds = await produce(http, node.url, "q", "s", 6, 5)
        assert status == 503 and body["error"]["code"] == "storage_unavailable", body
        assert seconds < 1.0
        status, body, _ = await call(http, "PUT", f"{node.url}/v1/queues/other", {"storage": "shared"})
        assert status == 503 and body["error"]["code"] == "storage_unavailable", body

        pg_proxy.restore()
        await until_ready(http, node.url)
        status, body, _ = await produce(http, node.url, "q", "s", 6, 5)
        assert status == 200, body
        status, after = await read(http, node.url, "q")
        assert_stored_once(after, "s", 10)
        assert "shared node not started, retrying in the background" in node.log()
    finally:
        await asyncio.to_thread(rig.close)


def test_a_node_killed_reclaims_its_name_at_once_and_another_process_with_it_is_refused(
    tmp_path: Path, pg_server: PgServer, s3_server: S3Server
) -> None:
    rig = make_rig(tmp_path / "rig", pg_server, s3_server)
    try:
        rig.start(1)
        token = (rig.data_dir(0) / "shared-node.token").read_text()
        rig.kill(0)
        started = time.monotonic()
        rig.restart(0)
        # The lease is 10 s: a node that had to wait for its own old lease took that long.
        assert time.monotonic() - started < 6.0
        assert (rig.data_dir(0) / "shared-node.token").read_text() == token

        # Node 0 runs. The same name from another data dir, and from node 0's own data dir
        # (its token file locked by the running process): both refused, after the lease.
        other = rig.config_text(5, shared={"node": rig.node_name(0)})
        same = rig.config_text(6, shared={"node": rig.node_name(0)})
        with ThreadPoolExecutor(2) as pool:
            refusals = list(
                pool.map(
                    lambda args: rig.refusal(*args[:2], data_dir=args[2]),
                    [(5, other, None), (6, same, rig.data_dir(0))],
                )
            )
        for code, output in refusals:
            assert code == 2, output
            assert "shared.node 'node-0' is the name of a node that is running" in output
        assert rig.running(0)
    finally:
        rig.close()


async def test_readyz_names_postgres_down_also_with_no_shared_queue_defined(
    tmp_path: Path,
    pg_server: PgServer,
    s3_server: S3Server,
    pg_proxy: TcpProxy,
    http: aiohttp.ClientSession,
) -> None:
    rig = make_rig(tmp_path / "rig", pg_server, s3_server, pg_port=pg_proxy.port)
    try:
        await asyncio.to_thread(rig.start, 1)
        url = rig.urls[0]
        assert (await readiness(http, url))[0] == 200
        with pg_proxy.down("cut"):
            seen = await until_not_ready(http, url, "postgres", IDLE_DETECT_WITHIN)
            assert "queues" not in seen
            assert seen["status"] == "not_writable"
        await until_ready(http, url)
    finally:
        await asyncio.to_thread(rig.close)


async def test_writes_nobody_waits_for_outlive_an_s3_and_a_postgres_outage(
    tmp_path: Path,
    pg_server: PgServer,
    s3_server: S3Server,
    s3_proxy: TcpProxy,
    pg_proxy: TcpProxy,
    http: aiohttp.ClientSession,
) -> None:
    rig = make_rig(tmp_path / "rig", pg_server, s3_server, s3_endpoint=s3_proxy.url, pg_port=pg_proxy.port)

    async def of_source(source: str) -> list[dict[str, Any]]:
        status, body = await read(http, url, "q")
        assert status == 200, body
        return [m for m in body["messages"] if m["source"] == source]

    async def stored(count: int) -> bool:
        return len(await of_source("s")) >= count

    async def unattended(first: int, save: str) -> None:
        body = messages("s", first, 10)
        status, answer, _ = await call(http, "POST", f"{url}/v1/queues/q/messages", body, save=save)
        assert status == 200, answer
        # A write that waits, sent after: its 503 comes once the flush before it gave up too.
        status, answer, _ = await produce(http, url, "q", "w", first, 10)
        assert status == 503, answer

    try:
        await asyncio.to_thread(rig.start, 1)
        url = rig.urls[0]
        await create_shared(http, url, "q")
        with s3_proxy.down("cut"):
            await unattended(1, "none")
        await until(lambda: stored(10), RECOVER_WITHIN, "the kept batch stored after S3 came back")

        with pg_proxy.down("cut"):
            await unattended(11, "mark")
        await until(
            lambda: stored(20), RECOVER_WITHIN, "the unanswered commit applied after PostgreSQL is back"
        )
        kept = await of_source("s")
        assert [m["external_id"] for m in kept] == list(range(1, 21))
        assert [m["data"] for m in kept] == [f"s-{e}" for e in range(1, 21)]
        _, body = await read(http, url, "q")
        assert [m["id"] for m in body["messages"]] == list(range(1, len(body["messages"]) + 1))
        waited = [m["external_id"] for m in body["messages"] if m["source"] == "w"]
        assert len(waited) == len(set(waited))  # answered 503, maybe stored later: once at most
    finally:
        await asyncio.to_thread(rig.close)
