"""A shared node's start on a bad day: PostgreSQL down when it starts (it serves its local
queues and comes up by itself), and a node restarted after ``kill -9`` (it reclaims its name at
once, while another process with the same name is still refused).
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import aiohttp
import pytest
from support.pg import PgServer, available
from support.servers import S3Server
from support.shared_calls import (
    assert_stored_once,
    call,
    create_shared,
    make_rig,
    produce,
    read,
    until_not_ready,
    until_ready,
)
from support.tcp_proxy import TcpProxy
from support.wait import until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(available() is not None, reason=f"shared queues need PostgreSQL: {available()}"),
]


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
