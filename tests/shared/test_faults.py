"""Bad days for shared queues, on real processes: S3 or PostgreSQL cut off or blackholed while
the nodes run (start-up on a bad day: test_node_start.py; PostgreSQL restarted: test_pg_restart.py).

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
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from support.pg import PgServer, available
from support.servers import S3Server
from support.shared_calls import (
    ANSWER_SLACK,
    IDLE_DETECT_WITHIN,
    RECOVER_WITHIN,
    WINDOW,
    WRITE_TIMEOUT,
    assert_stored_once,
    call,
    create_shared,
    make_rig,
    messages,
    produce,
    read,
    readiness,
    until_not_ready,
    until_ready,
)
from support.tcp_proxy import TcpProxy
from support.wait import until

LISTEN_AGAIN_WITHIN = 2.5  # the listener retries every second

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(available() is not None, reason=f"shared queues need PostgreSQL: {available()}"),
]


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
        await asyncio.to_thread(rig.start, 2)
        url, other = rig.urls
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
            # A node that has not read them must GET them: answered 503, in time too.
            status, body, seconds = await call(http, "GET", f"{other}/v1/queues/q/messages", after="0")
            assert status == 503 and body["error"]["code"] == "storage_unavailable", body
            assert seconds <= WRITE_TIMEOUT + ANSWER_SLACK

        # No write needed: the node probes S3 and says it is ready again.
        await until_ready(http, url)
        status, body, _ = await produce(http, url, "q", "s", 21, 10)
        assert status == 200, body
        status, after = await read(http, url, "q")
        assert_stored_once(after, "s", 30)
        status, elsewhere = await read(http, other, "q")
        assert status == 200 and elsewhere == after
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


async def test_a_queue_defined_while_a_node_was_cut_off_is_seen_as_soon_as_it_listens_again(
    tmp_path: Path,
    pg_server: PgServer,
    s3_server: S3Server,
    pg_proxy: TcpProxy,
    http: aiohttp.ClientSession,
) -> None:
    rig = make_rig(tmp_path / "rig", pg_server, s3_server)
    proxied = rig.node_dsn.replace(f":{pg_server.port}/", f":{pg_proxy.port}/")
    rig.write_config(1, rig.config_text(1, shared={"dsn": proxied}))
    try:
        first, second = [node.url for node in await asyncio.to_thread(rig.start, 2)]
        with pg_proxy.down("cut"):
            # "shared listen connection lost", or "shared listen failed" when the cut came
            # before its first LISTEN (a node is ready before its listener is up).
            await until(lambda: "shared listen" in rig.node(1).log(), 10.0, "node 1 not listening")
            await create_shared(http, first, "late")  # announced while node 1 cannot hear it
        restored = time.monotonic()

        async def seen() -> bool:
            return (await call(http, "GET", f"{second}/v1/queues/late"))[0] == 200

        # The definitions poll behind NOTIFY runs every 5 s; listening again reloads them at once.
        await until(seen, 10.0, "queue late on node 1")
        assert time.monotonic() - restored < LISTEN_AGAIN_WITHIN
    finally:
        await asyncio.to_thread(rig.close)
