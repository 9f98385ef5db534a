"""Replication between two real clusters: a copy handler's catch-up rate, and steady-state lag.

Two servers run with generated configs naming their clusters ``a`` and ``b``. Both have a
queue ``events``; A has B as external cluster ``b`` and a copy handler ``push`` (``to`` ``b/events``,
``batch`` 1000, the default ``save=wait`` on both sides), created stopped.

1. Catch-up: A is seeded with 1,000,000 messages of 256 ASCII characters (``--quick``:
   100,000; ``save=mark``, batches of 1000, 2 producers) and left to seal, then the handler
   is started and the clock runs until B's ``last_id`` reaches the count. That is both the
   copy rate with batches of 1000 and the time to catch up on that backlog.
2. Lag: with the handler running and caught up, one producer sends single messages to A
   with ``save=wait``, paced at 2,000 msg/s for 10 s (``--quick``: 3 s) in an open loop, each
   carrying its send time; a long-polling reader on B notes when each one reaches it.

Afterwards B must hold exactly what A holds: the same count, every identity
``(source, external_id)`` once, and every id A gave out.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from yarl import URL

from benchmarks.client import (
    JSON_HEADERS,
    messages_url,
    new_session,
    post_batch,
    produce_concurrently,
    put_queue,
    queue_stats,
    text_batches,
    wait_sealed,
)
from benchmarks.latency import read_tail
from benchmarks.meter import Meter
from benchmarks.result import BenchmarkFailed, Outcome, Row, summary
from benchmarks.server import Server, profiled, running_server
from benchmarks.settings import Settings
from benchmarks.tiers import BLOCK, handler_status, put_handler

QUEUE = "events"
HANDLER = "push"
PAYLOAD = 256
BATCH = 1000
PRODUCERS = 2
RATE = 2000
WARMUP = 200
_PAD = b"x" * (PAYLOAD - 20)


async def run(settings: Settings) -> Outcome:
    outcome = Outcome()
    total = settings.pick(1_000_000, 100_000)
    seconds = settings.pick(10, 3)
    limit = settings.pick(300, 120)
    configs = {name: write_config(settings.work_dir / f"replication-{name}.toml", name) for name in "ab"}
    async with (
        running_server(
            settings.data_dir("replication-a"), settings.log_path("replication-a"), configs["a"]
        ) as a,
        running_server(
            settings.data_dir("replication-b"), settings.log_path("replication-b"), configs["b"]
        ) as b,
        new_session() as session,
    ):
        await connect(session, a, b)
        seeded = await seed(session, a, total, limit)
        async with (
            profiled(a, settings.profile_path("replication-a")),
            profiled(b, settings.profile_path("replication-b")),
        ):
            catch_up = await catch_up_time(session, a, b, total, limit)
        lag = await paced_lag(a, b, RATE * seconds)
        check = await check_copies(session, a, b)
        status = await handler_status(session, a.url, HANDLER)
        if status["last_error"] is not None:
            raise BenchmarkFailed(f"copy handler: {status['last_error']}")
    outcome.details = {
        "clusters": "a → b, no TLS or compression, copy handler batch 1000, save=wait both sides",
        "payload": f"{PAYLOAD} random ASCII chars in 'data'",
        "seed": seeded,
        "catch_up": catch_up,
        "lag": lag,
        "check": check,
        "handler_status": status,
    }
    rate, wall = catch_up["msgs_per_s"], catch_up["wall_s"]
    a_pct, b_pct = catch_up["a_cpu"]["server_cpu_pct"], catch_up["b_cpu"]["server_cpu_pct"]
    cpu = f"A CPU {a_pct:.0f} %, B CPU {b_pct:.0f} %"
    e2e = lag["end_to_end_ms"]
    answer = lag["request_latency_ms"]["p50"]
    lag_note = f"{lag['achieved_rate']:,.0f} msg/s achieved; send → answer on A p50 {answer:.2f} ms"
    outcome.rows += [
        Row("replication", "copy a → b, batch 1000", rate, "msg/s", note=cpu),
        Row("replication", f"catch-up on a {total:,}-message backlog", wall, "s", higher_is_better=False),
        Row("replication", "lag at 2,000 msg/s (save=wait) p50", e2e["p50"], "ms", higher_is_better=False),
        Row("replication", "lag at 2,000 msg/s (save=wait) p99", e2e["p99"], "ms", higher_is_better=False),
        Row(
            "replication",
            "lag at 2,000 msg/s (save=wait) max",
            e2e["max"],
            "ms",
            higher_is_better=False,
            note=lag_note,
        ),
    ]
    print(
        f"  replication: {rate:,.0f} msg/s, {total:,} in {wall:.1f} s ({cpu});"
        f" lag p50 {e2e['p50']:.2f} ms, p99 {e2e['p99']:.2f} ms, max {e2e['max']:.2f} ms;"
        f" b holds {check['b_messages']:,}, {check['distinct_identities']:,} distinct",
        flush=True,
    )
    return outcome


def write_config(path: Path, name: str) -> Path:
    """A TOML file for ``capella serve --config`` that names the cluster (the default source)."""
    # The load comes from one address (loopback), with up to 256 connections: more than
    # server.max_connections_per_address allows one client by default.
    path.write_text(f'[cluster]\nname = "{name}"\n\n[server]\nmax_connections_per_address = 1024\n')
    return path


async def connect(session: aiohttp.ClientSession, a: Server, b: Server) -> None:
    """The queues on both sides, B as A's external cluster, and the copy handler, stopped."""
    await put_queue(session, a.url, QUEUE)
    await put_queue(session, b.url, QUEUE)
    async with session.put(f"{a.url}/v1/clusters/b", json={"url": b.url}) as resp:
        if resp.status not in (200, 201):
            raise BenchmarkFailed(f"PUT cluster b: HTTP {resp.status}: {await resp.text()}")
    definition = {
        "type": "copy",
        "queues": [QUEUE],
        "params": {"to": f"b/{QUEUE}", "batch": BATCH},
        "started": False,
    }
    await put_handler(session, a.url, HANDLER, definition)


async def seed(session: aiohttp.ClientSession, a: Server, total: int, limit: float) -> dict[str, Any]:
    bodies = text_batches(BATCH, PAYLOAD, count=16, seed=5)
    started = time.perf_counter()
    sent = await produce_concurrently(
        messages_url(a.url, "mark", QUEUE), bodies, BATCH, total, PRODUCERS, started + limit
    )
    produced = time.perf_counter() - started
    if sent != total:
        raise BenchmarkFailed(f"seeded {sent:,} of {total:,} messages within {limit:g} s")
    # Copy from sealed blocks, as a real backlog would be, without the sealer competing.
    seal_wait = await wait_sealed(session, a.url, total // BLOCK, limit, QUEUE)
    return {"messages": total, "produce_s": produced, "seal_wait_s": seal_wait}


async def catch_up_time(
    session: aiohttp.ClientSession, a: Server, b: Server, total: int, limit: float
) -> dict[str, Any]:
    """Start the handler; seconds until B's ``last_id`` reaches ``total``."""
    meters = Meter(a), Meter(b)
    for meter in meters:
        meter.start()
    started = time.perf_counter()
    async with session.post(f"{a.url}/v1/handlers/{HANDLER}/start") as resp:
        if resp.status != 200:
            raise BenchmarkFailed(f"start {HANDLER}: HTTP {resp.status}: {await resp.text()}")
    first = None
    while (last_id := (await queue_stats(session, b.url, QUEUE))["last_id"]) < total:
        now = time.perf_counter()
        if first is None and last_id > 0:
            first = now - started
        if now - started > limit:
            status = await handler_status(session, a.url, HANDLER)
            raise BenchmarkFailed(f"b has {last_id:,} of {total:,} after {limit:g} s; handler: {status}")
        await asyncio.sleep(0.02)
    for meter in meters:
        meter.stop()
    wall = meters[0].wall
    return {
        "messages": total,
        "wall_s": wall,
        "msgs_per_s": total / wall,
        "mb_per_s": total * PAYLOAD / wall / 1e6,
        "first_arrival_s": first,
        "a_cpu": meters[0].to_dict(),
        "b_cpu": meters[1].to_dict(),
    }


async def paced_lag(a: Server, b: Server, count: int) -> dict[str, Any]:
    """Open-loop single-message produces to A; send → read on B for each message."""
    url = messages_url(a.url, "wait", QUEUE)
    request_latency: list[float] = []
    end_to_end: list[float] = []
    async with new_session(connections=256) as session, new_session() as reader_session:
        # Warm-up: connections, and the handler's pass loop, before the clock starts.
        for _ in range(WARMUP):
            await post_batch(session, url, _body(), 1)
        after = await arrived(session, b, (await queue_stats(session, a.url, QUEUE))["last_id"])
        reader = asyncio.create_task(read_tail(reader_session, b, after, count, end_to_end, QUEUE))
        meters = Meter(a), Meter(b)
        start = time.perf_counter() + 0.05
        for meter in meters:
            meter.start(start)
        try:
            await send_paced(session, url, count, start, request_latency)
            for meter in meters:
                meter.stop()
            await asyncio.wait_for(reader, timeout=30)
        finally:
            reader.cancel()
    return {
        "rate": RATE,
        "messages": count,
        "warmup": WARMUP,
        "payload": f"one message of {PAYLOAD} ASCII chars in 'data' per request (send time inside)",
        "achieved_rate": count / meters[0].wall,
        "request_latency_ms": summary(request_latency, scale=1000),
        "end_to_end_ms": summary(end_to_end, scale=1000),
        "a_cpu": meters[0].to_dict(),
        "b_cpu": meters[1].to_dict(),
    }


async def send_paced(
    session: aiohttp.ClientSession, url: URL, count: int, start: float, latencies: list[float]
) -> None:
    """Message ``i`` goes out at ``start + i / RATE`` whether or not earlier answers are in."""

    async def send() -> None:
        started = time.perf_counter()
        async with session.post(url, data=_body(), headers=JSON_HEADERS) as resp:
            raw = await resp.read()
        latencies.append(time.perf_counter() - started)
        if resp.status != 200:
            raise BenchmarkFailed(f"produce: HTTP {resp.status}: {raw[:300]!r}")

    tasks: set[asyncio.Task[None]] = set()
    try:
        sent = 0
        while sent < count:
            due = min(count, int((time.perf_counter() - start) * RATE) + 1)
            while sent < due:
                task = asyncio.create_task(send())
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                sent += 1
            # At least 1 ms: uvloop runs a shorter timer at once, so the loop would spin a core.
            await asyncio.sleep(max(0.001, start + sent / RATE - time.perf_counter()))
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()


async def arrived(session: aiohttp.ClientSession, b: Server, count: int, within: float = 30.0) -> int:
    """Wait until B holds ``count`` messages; its ``last_id`` then."""
    deadline = time.perf_counter() + within
    while (stats := await queue_stats(session, b.url, QUEUE))["messages"] < count:
        if time.perf_counter() > deadline:
            raise BenchmarkFailed(f"b has {stats['messages']:,} of {count:,} messages after {within:g} s")
        await asyncio.sleep(0.02)
    last_id: int = stats["last_id"]
    return last_id


async def check_copies(session: aiohttp.ClientSession, a: Server, b: Server) -> dict[str, Any]:
    """B holds each of A's messages exactly once: same count, distinct identities, no gaps."""
    a_last = (await queue_stats(session, a.url, QUEUE))["last_id"]
    await arrived(session, b, a_last)
    b_messages = (await queue_stats(session, b.url, QUEUE))["messages"]
    identities: set[tuple[str, int]] = set()
    read = 0
    after = 0
    while True:
        async with session.get(messages_url(b.url, queue=QUEUE).with_query(after=after, limit=1000)) as resp:
            raw = await resp.read()
            if resp.status != 200:
                raise BenchmarkFailed(f"read b: HTTP {resp.status}: {raw[:300]!r}")
        page = orjson.loads(raw)
        if not page["messages"]:
            break
        identities.update((m["source"], m["external_id"]) for m in page["messages"])
        read += len(page["messages"])
        after = page["last_id"]
    expected = {("a", i) for i in range(1, a_last + 1)}
    check = {
        "a_last_id": a_last,
        "b_messages": b_messages,
        "b_read": read,
        "distinct_identities": len(identities),
        "missing": len(expected - identities),
        "unexpected": len(identities - expected),
    }
    if not (b_messages == read == len(identities) == a_last) or check["missing"] or check["unexpected"]:
        raise BenchmarkFailed(f"b does not hold exactly a's messages: {check}")
    return check


def _body() -> bytes:
    return b'{"data":"%020d%s"}' % (time.perf_counter_ns(), _PAD)
