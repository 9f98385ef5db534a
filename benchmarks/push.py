"""Push delivery: messages/s a push handler delivers to a local receiver, and append → delivery latency.

The receiver is an aiohttp server in the benchmark process on 127.0.0.1 that answers 200 at
once and records each message id (a repeat or a gap fails the run). Throughput: a backlog is
produced first (``save=mark``, not timed), then the handler is defined and the clock runs
until the receiver has every message, with ``batch = 1`` (the body is the payload) and with
``batch = 100`` (JSON arrays). Latency: with a batch-1 handler running, one producer sends
single messages at a steady rate; the receiver takes ``now - Capella-Time`` (the append time
the server stamped) for each, so the figure is append → request in the receiver's hands.
Both processes share the machine, so the receiver's CPU counts against the server's.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
from aiohttp import web

from benchmarks.client import JSON_HEADERS, new_session, put_queue
from benchmarks.meter import Meter
from benchmarks.result import BenchmarkFailed, Outcome, Row, summary
from benchmarks.server import Server, profiled, running_server
from benchmarks.settings import Settings

SEED_BATCH = 5000
# (batch, requests in flight): batch 1 needs more in flight to keep the receiver busy.
SHAPES = ((1, 16), (100, 4))
LATENCY_RATE = 200  # messages/s, one per produce request
DEADLINE = 300.0


class Receiver:
    """Counts what arrives; with ``latency`` on, records append → arrival per message."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.latencies: list[float] = []
        self.done = asyncio.Event()
        self.expected = 0
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/hook", self.handle)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}/hook"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def handle(self, request: web.Request) -> web.Response:
        await request.read()
        now = time.time()
        self.ids.extend(int(i) for i in request.headers["Capella-Ids"].split(","))
        if "Capella-Time" in request.headers:
            self.latencies.append(now - float(request.headers["Capella-Time"]))
        if len(self.ids) >= self.expected:
            self.done.set()
        return web.Response(text="ok")

    def reset(self, expected: int) -> None:
        self.ids, self.latencies, self.expected = [], [], expected
        self.done = asyncio.Event()


async def run(settings: Settings) -> Outcome:
    outcome = Outcome()
    receiver = Receiver()
    await receiver.start()
    try:
        for batch, in_flight in SHAPES:
            total = settings.pick(300_000, 20_000) if batch > 1 else settings.pick(20_000, 2_000)
            result = await _throughput(settings, receiver, total, batch, in_flight)
            outcome.details[f"batch {batch}"] = result
            cpu = result["cpu"]
            note = f"server CPU {cpu['server_cpu_pct']:.0f}%, receiver {cpu['client_cpu_pct']:.0f}%"
            label = f"batch {batch}, {in_flight} requests in flight"
            outcome.rows.append(Row("push", label, result["rate"], "msg/s", note=note))
            print(f"  {label}: {result['rate']:,.0f} msg/s ({note})", flush=True)
        latency = await _latency(settings, receiver, settings.pick(3000, 400))
        outcome.details["latency"] = latency
        ms = latency["append_to_delivery_ms"]
        note = f"batch 1, {LATENCY_RATE} msg/s paced, {ms['count']} messages"
        for q in ("p50", "p99"):
            row = Row("push", f"append → delivery {q}", ms[q], "ms", higher_is_better=False, note=note)
            outcome.rows.append(row)
        print(f"  append → delivery: p50 {ms['p50']:.2f} ms, p99 {ms['p99']:.2f} ms", flush=True)
    finally:
        await receiver.stop()
    return outcome


async def _handler(server: Server, receiver: Receiver, batch: int, in_flight: int) -> None:
    params = {"url": receiver.url, "batch": batch, "concurrency": in_flight, "timeout": "10s"}
    async with new_session() as session:
        body = {"type": "push", "queue": "bench", "params": params}
        async with session.put(f"{server.url}/v1/handlers/out", json=body) as resp:
            if resp.status != 201:
                raise BenchmarkFailed(f"push handler: HTTP {resp.status}: {await resp.text()}")


async def _throughput(
    settings: Settings, receiver: Receiver, total: int, batch: int, in_flight: int
) -> dict[str, Any]:
    name = f"push-{batch}"
    async with running_server(settings.data_dir(name), settings.log_path(name)) as server:
        async with new_session() as session:
            await put_queue(session, server.url, "bench")
            for start in range(0, total, SEED_BATCH):
                count = min(SEED_BATCH, total - start)
                body = orjson.dumps({"messages": [{"data": f"event {start + i}"} for i in range(count)]})
                async with session.post(
                    f"{server.url}/v1/queues/bench/messages?save=mark", data=body, headers=JSON_HEADERS
                ) as resp:
                    if resp.status != 200:
                        raise BenchmarkFailed(f"seed: HTTP {resp.status}")
        receiver.reset(total)
        meter = Meter(server)
        async with profiled(server, settings.profile_path(name)):
            meter.start()
            await _handler(server, receiver, batch, in_flight)
            try:
                await asyncio.wait_for(receiver.done.wait(), DEADLINE)
            except TimeoutError:
                raise BenchmarkFailed(
                    f"{name}: {len(receiver.ids)} of {total} after {DEADLINE:g} s"
                ) from None
            meter.stop()
    _check(receiver, total, name)
    return {
        "messages": total,
        "batch": batch,
        "in_flight": in_flight,
        "seconds": meter.wall,
        "rate": total / meter.wall,
        "cpu": meter.to_dict(),
    }


async def _latency(settings: Settings, receiver: Receiver, total: int) -> dict[str, Any]:
    name = "push-latency"
    async with (
        running_server(settings.data_dir(name), settings.log_path(name)) as server,
        new_session() as session,
    ):
        await put_queue(session, server.url, "bench")
        await _handler(server, receiver, 1, 8)
        receiver.reset(total)
        url = f"{server.url}/v1/queues/bench/messages"
        started = time.perf_counter()
        for i in range(total):
            # Paced on a fixed schedule, so a slow answer does not slow the rate down.
            delay = started + i / LATENCY_RATE - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            async with session.post(url, data=orjson.dumps({"data": f"e{i}"}), headers=JSON_HEADERS) as resp:
                if resp.status != 200:
                    raise BenchmarkFailed(f"produce: HTTP {resp.status}")
        try:
            await asyncio.wait_for(receiver.done.wait(), 60)
        except TimeoutError:
            raise BenchmarkFailed(f"{name}: {len(receiver.ids)} of {total} delivered") from None
    _check(receiver, total, name)
    return {
        "messages": total,
        "rate": LATENCY_RATE,
        "append_to_delivery_ms": summary(receiver.latencies, 1000),
    }


def _check(receiver: Receiver, total: int, name: str) -> None:
    if sorted(receiver.ids) != list(range(1, total + 1)):
        repeats = len(receiver.ids) - len(set(receiver.ids))
        raise BenchmarkFailed(f"{name}: {len(set(receiver.ids))} of {total} distinct, {repeats} repeats")
