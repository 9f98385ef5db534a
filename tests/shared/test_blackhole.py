"""A blackholed S3 or PostgreSQL (connections accepted, never answered) holds nothing else: the
node's local work stays fast, and a stop ends in time with a clean exit.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest
from support.pg import PgServer, available
from support.servers import S3Server
from support.shared import SharedRig
from support.shared_calls import IDLE_DETECT_WITHIN, call, create_shared, make_rig, produce, until_not_ready
from support.tcp_proxy import TcpProxy
from support.wait import until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(available() is not None, reason=f"shared queues need PostgreSQL: {available()}"),
]


async def test_an_s3_blackhole_does_not_hold_the_node_s_other_work(
    tmp_path: Path,
    pg_server: PgServer,
    s3_server: S3Server,
    s3_proxy: TcpProxy,
    http: aiohttp.ClientSession,
) -> None:
    # A short write timeout: flushes give up quickly and try again, while each blackholed PUT
    # keeps its thread until the mount's own timeouts end it (5 s, 3 attempts here).
    rig = SharedRig(
        tmp_path / "rig",
        pg=pg_server,
        s3=s3_server,
        flush_interval="50ms",
        extra='[storage]\nwrite_timeout = "500ms"\n',
        s3_endpoint=s3_proxy.url,
    )
    try:
        await asyncio.to_thread(rig.start, 1)
        url = rig.urls[0]
        await create_shared(http, url, "q")
        stop = asyncio.Event()

        async def producing(source: str) -> None:
            for i in range(100):
                if stop.is_set():
                    return
                status, body, _ = await produce(http, url, "q", source, i * 10 + 1, 10)
                assert status == 503, body

        with s3_proxy.down("blackhole"):
            tasks = [asyncio.create_task(producing(f"p{i}")) for i in range(3)]
            try:
                await until(lambda: failed_puts(http, url, 8), 20.0, "8 PUTs blackholed")
                # The node's own work on its file mount (a queue made, a write saved) is not
                # queued behind S3 calls that hang.
                for i in range(3):
                    status, body, seconds = await call(http, "PUT", f"{url}/v1/queues/local{i}", {})
                    assert status == 201, body
                    assert seconds < 1.0, f"creating a local queue took {seconds:.1f}s"
                    status, body, seconds = await call(
                        http, "POST", f"{url}/v1/queues/local{i}/messages", {"messages": [{"data": "x"}]},
                        save="immediate",
                    )  # fmt: skip
                    assert status == 200, body
                    assert seconds < 1.0, f"a local write took {seconds:.1f}s"
            finally:
                stop.set()
                await asyncio.gather(*tasks)
    finally:
        await asyncio.to_thread(rig.close)


async def failed_puts(http: aiohttp.ClientSession, url: str, at_least: int) -> bool:
    async with http.get(f"{url}/metrics") as resp:
        text = await resp.text()
    for line in text.splitlines():
        if line.startswith('capella_shared_failures_total{step="put"}'):
            return int(line.split()[-1]) >= at_least
    return False


@pytest.mark.parametrize("part", ["postgres", "s3"])
async def test_a_node_stops_in_time_while_postgres_or_s3_is_blackholed(
    tmp_path: Path,
    pg_server: PgServer,
    s3_server: S3Server,
    s3_proxy: TcpProxy,
    pg_proxy: TcpProxy,
    http: aiohttp.ClientSession,
    part: str,
) -> None:
    rig = make_rig(tmp_path / "rig", pg_server, s3_server, s3_endpoint=s3_proxy.url, pg_port=pg_proxy.port)
    proxy = pg_proxy if part == "postgres" else s3_proxy
    try:
        await asyncio.to_thread(rig.start, 1)
        url = rig.urls[0]
        await create_shared(http, url, "q")
        assert (await produce(http, url, "q", "s", 1, 5))[0] == 200
        with proxy.down("blackhole"):
            if part == "postgres":
                await until_not_ready(http, url, part, IDLE_DETECT_WITHIN)
            else:
                assert (await produce(http, url, "q", "s", 6, 5))[0] == 503
            started = time.monotonic()
            code = await asyncio.to_thread(rig.stop, 0)
            # SIGTERM answered with a clean exit, before the rig's patience (10 s) ran out.
            assert code == 0, rig.node(0).log_path.read_text()[-3000:]
            assert time.monotonic() - started < 10.0
    finally:
        await asyncio.to_thread(rig.close)
