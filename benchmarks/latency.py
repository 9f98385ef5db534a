"""Tail latency at a paced 2,000 msg/s with ``save=wait``, and produce → consumer latency.

One producer (one session) sends single-message requests on a fixed schedule: message ``i``
goes out at ``start + i / rate`` whether or not earlier answers are in (an open loop, so a
slow answer cannot hide the ones queued behind it). Per-request latency is send → answer.
A long-polling reader (``wait=``) on its own session reads the same messages; each payload
carries its send time, so the end-to-end latency is send → message in the reader's hands.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import orjson

from benchmarks.client import (
    JSON_HEADERS,
    QUEUE,
    flush_delta,
    flush_totals,
    messages_url,
    new_session,
    post_batch,
    put_queue,
)
from benchmarks.meter import Meter
from benchmarks.result import BenchmarkFailed, Outcome, Row, summary
from benchmarks.server import Server, profiled, running_server
from benchmarks.settings import Settings

RATE = 2000
PAYLOAD = 256
WARMUP = 200
TARGET_P99_MS = 1.0
READ_WAIT = 1  # seconds a long poll may wait
_PAD = b"x" * (PAYLOAD - 20)


async def run(settings: Settings) -> Outcome:
    outcome = Outcome()
    seconds = settings.pick(10, 2)
    # The pacer's 256 connections come from one address (loopback): more than
    # server.max_connections_per_address allows one client by default.
    config = settings.work_dir / "latency.toml"
    config.write_text("[server]\nmax_connections_per_address = 1024\n")
    async with running_server(settings.data_dir("latency"), settings.log_path("latency"), config) as server:
        async with new_session() as session:
            await put_queue(session, server.url)
        async with profiled(server, settings.profile_path("latency")):
            result = await paced(server, RATE * seconds)
        result["peak_rss_mb"] = server.peak_rss_mb()
    outcome.details = result
    request = result["request_latency_ms"]
    e2e = result["end_to_end_ms"]
    rate_note = f"{result['achieved_rate']:,.0f} msg/s achieved, up to {result['max_in_flight']} in flight"
    outcome.rows += [
        Row("latency", "save=wait send → answer p50", request["p50"], "ms", higher_is_better=False),
        Row(
            "latency",
            "save=wait send → answer p99",
            request["p99"],
            "ms",
            TARGET_P99_MS,
            higher_is_better=False,
            note=rate_note,
        ),
        Row("latency", "save=wait send → answer max", request["max"], "ms", higher_is_better=False),
        Row("latency", "produce → long-poll reader p50", e2e["p50"], "ms", higher_is_better=False),
        Row("latency", "produce → long-poll reader p99", e2e["p99"], "ms", higher_is_better=False),
    ]
    print(
        f"  latency: p50 {request['p50']:.2f} ms, p99 {request['p99']:.2f} ms, max {request['max']:.2f} ms;"
        f" end to end p50 {e2e['p50']:.2f} ms, p99 {e2e['p99']:.2f} ms ({rate_note})",
        flush=True,
    )
    return outcome


async def paced(server: Server, count: int) -> dict[str, Any]:
    url = messages_url(server.url, "wait")
    request_latency: list[float] = []
    send_lag: list[float] = []
    end_to_end: list[float] = []
    in_flight = 0
    max_in_flight = 0

    async with new_session(connections=256) as session, new_session() as reader_session:
        for _ in range(WARMUP):
            await post_batch(session, url, _body(), 1)
        start_after = WARMUP

        async def send(scheduled: float) -> None:
            nonlocal in_flight, max_in_flight
            in_flight += 1
            max_in_flight = max(max_in_flight, in_flight)
            started = time.perf_counter()
            send_lag.append(started - scheduled)
            async with session.post(url, data=_body(), headers=JSON_HEADERS) as resp:
                raw = await resp.read()
            request_latency.append(time.perf_counter() - started)
            in_flight -= 1
            if resp.status != 200:
                raise BenchmarkFailed(f"produce: HTTP {resp.status}: {raw[:300]!r}")

        reader = asyncio.create_task(read_tail(reader_session, server, start_after, count, end_to_end))
        meter = Meter(server)
        flushes = await flush_totals(session, server.url)
        tasks: set[asyncio.Task[None]] = set()
        start = time.perf_counter() + 0.05
        meter.start(start)
        try:
            sent = 0
            while sent < count:
                due = min(count, int((time.perf_counter() - start) * RATE) + 1)
                while sent < due:
                    task = asyncio.create_task(send(start + sent / RATE))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                    sent += 1
                # uvloop returns at once from sleeps under 1 ms, which would spin a core:
                # sleep at least 1 ms and send the messages that fell due meanwhile together.
                await asyncio.sleep(max(0.001, start + sent / RATE - time.perf_counter()))
            await asyncio.gather(*tasks)
            meter.stop()
            flushed = flush_delta(flushes, await flush_totals(session, server.url), meter.wall)
            await asyncio.wait_for(reader, timeout=10)
        finally:
            reader.cancel()
            for task in tasks:
                task.cancel()
    return {
        "rate": RATE,
        "messages": count,
        "payload": f"one message of {PAYLOAD} ASCII chars in 'data' per request (send time inside)",
        "achieved_rate": count / meter.wall,
        "max_in_flight": max_in_flight,
        "request_latency_ms": summary(request_latency, scale=1000),
        "send_lag_ms": summary(send_lag, scale=1000),
        "end_to_end_ms": summary(end_to_end, scale=1000),
        "cpu": meter.to_dict(),
        "flush": flushed,
    }


async def read_tail(
    session: aiohttp.ClientSession,
    server: Server,
    after: int,
    count: int,
    latencies: list[float],
    queue: str = QUEUE,
) -> None:
    """Long-poll ``queue`` until ``count`` messages after ``after`` are read; note each one's age."""
    base = messages_url(server.url, queue=queue)
    received = 0
    while received < count:
        async with session.get(base.with_query(after=after, limit=1000, wait=READ_WAIT)) as resp:
            raw = await resp.read()
            if resp.status != 200:
                raise BenchmarkFailed(f"read: HTTP {resp.status}: {raw[:300]!r}")
        now = time.perf_counter_ns()
        page = orjson.loads(raw)
        for message in page["messages"]:
            latencies.append((now - int(message["data"][:20])) / 1e9)
        received += len(page["messages"])
        after = page["last_id"]


def _body() -> bytes:
    return b'{"data":"%020d%s"}' % (time.perf_counter_ns(), _PAD)
