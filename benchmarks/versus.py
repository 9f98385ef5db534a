"""Capella against Redis Streams on the same machine, in the same run, with the same harness.

Redis is Debian's ``redis-server`` with ``appendonly yes`` and ``appendfsync always``, so both
systems fsync before they answer a write (Capella: ``save=wait``). Every figure is taken for
both systems in turn, rounds alternating which goes first, and the table gives the ratio
Capella / Redis of the medians: on a shared, noisy machine only a ratio within one run holds.

- durable produce: 256-byte payloads in batches of 100 (Capella: one POST; Redis: a pipeline
  of 100 ``XADD``), 1 and 4 producers, each a separate process with its own connection;
- consume from the start: pages of 1,000 (``GET ?after=&limit=1000`` / ``XRANGE ... COUNT
  1000``), parsed by the client, one process; Capella twice, as JSON (``orjson.loads``) and as
  binary frames (``Accept: application/vnd.capella.messages``, decoded by the client library
  into ``StoredMessage`` structs), each against the same Redis figure;
- end-to-end latency at 2,000 single-message writes per second: an open-loop generator in its
  own process sends on a fixed schedule, a follower in another process (long poll / ``XREAD
  BLOCK``) takes each message's send time from its payload; neither process is the one measured;
- idle RSS after start-up and peak RSS of the run.

Without ``redis-server`` on the PATH the scenario says so and measures nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import shutil
import statistics
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

import orjson

from benchmarks.client import new_session, put_queue, text_batches
from benchmarks.result import BenchmarkFailed, Outcome, Row, summary
from benchmarks.server import cpu_seconds, exited, free_port, running_server
from benchmarks.settings import Settings
from capella.wire import frames

BATCH = 100
PAYLOAD = 256
PAGE = 1000
RATE = 2000
STREAM = "bench"
LATENCY_STREAM = "latency"
IDLE_SECONDS = 2.0
TARGET_RATIO = 1.5
PROCESS_TIMEOUT = 180.0
_SPAWN = multiprocessing.get_context("spawn")


@dataclass(frozen=True, slots=True)
class Target:
    """Where one system listens, and the process to read memory and CPU from."""

    system: str  # "capella" or "redis"
    address: str  # Capella: its base URL; Redis: its port
    pid: int


async def run(settings: Settings) -> Outcome:
    outcome = Outcome()
    redis_server = shutil.which("redis-server")
    if redis_server is None:
        note = "redis-server is not installed (apt-get install redis-server); nothing compared"
        outcome.rows.append(Row("versus", "Capella / Redis", float("nan"), "x", note=note))
        print(f"  {note}", flush=True)
        return outcome
    rounds = settings.pick(3, 1)
    messages = settings.pick(200_000, 20_000)
    seconds = settings.pick(10, 2)
    figures: dict[str, dict[str, list[float]]] = {}
    for round_ in range(rounds):
        order = ("capella", "redis") if round_ % 2 == 0 else ("redis", "capella")
        for system in order:
            name = f"versus-{system}-{round_}"
            data, log = settings.data_dir(name), settings.log_path(name)
            async with _running(system, redis_server, data, log) as target:
                measured = await _measure(target, messages, seconds)
            for key, value in measured.items():
                figures.setdefault(key, {}).setdefault(system, []).append(value)
            shown = ", ".join(f"{k} {v:,.1f}" for k, v in measured.items())
            print(f"  round {round_ + 1} {system}: {shown}", flush=True)
    outcome.details = {"rounds": rounds, "figures": figures, "redis": _redis_version(redis_server)}
    for key, (metric, unit, higher, target) in WORKLOADS.items():
        capella = statistics.median(figures[key]["capella"])
        redis = statistics.median(figures[key]["redis"])
        note = f"Capella {capella:,.1f} {unit}, Redis {redis:,.1f} {unit}, medians of {rounds}"
        ratio = capella / redis if higher else redis / capella
        outcome.rows.append(Row("versus", metric, ratio, "x", target if higher else None, note=note))
        if key == "e2e_p99_ms":
            outcome.rows.append(Row("versus", "Capella end-to-end p99", capella, "ms", 1.0, False))
        if key == "idle_rss_mb":
            outcome.rows.append(Row("versus", "Capella idle RSS", capella, "MB", 40.0, False))
    return outcome


# key: (what the row says, unit, higher is better, target for the ratio Capella/Redis)
WORKLOADS: dict[str, tuple[str, str, bool, float | None]] = {
    "produce_1": ("durable produce, 1 producer (Capella/Redis)", "msg/s", True, TARGET_RATIO),
    "produce_4": ("durable produce, 4 producers (Capella/Redis)", "msg/s", True, TARGET_RATIO),
    "consume": ("consume from the start (Capella/Redis)", "msg/s", True, TARGET_RATIO),
    "consume_binary": ("consume from the start, binary (Capella/Redis)", "msg/s", True, TARGET_RATIO),
    "e2e_p50_ms": ("end-to-end p50 at 2,000 msg/s (Redis/Capella)", "ms", False, None),
    "e2e_p99_ms": ("end-to-end p99 at 2,000 msg/s (Redis/Capella)", "ms", False, None),
    "idle_rss_mb": ("idle RSS (Redis/Capella)", "MB", False, None),
    "peak_rss_mb": ("peak RSS of the run (Redis/Capella)", "MB", False, None),
    "produce_4_server_cpu": ("server CPU with 4 producers (Redis/Capella)", "% of a core", False, None),
}


async def _measure(target: Target, messages: int, seconds: int) -> dict[str, float]:
    await asyncio.sleep(IDLE_SECONDS)
    figures = {"idle_rss_mb": _status_kb(target.pid, "VmRSS") / 1024}
    for producers in (1, 4):
        cpu = cpu_seconds(target.pid)
        rate, wall = await _produce(target, producers, messages)
        figures[f"produce_{producers}"] = rate
        if producers == 4:
            figures["produce_4_server_cpu"] = 100 * (cpu_seconds(target.pid) - cpu) / wall
    stored = 2 * (messages // BATCH) * BATCH
    figures["consume"] = _in_process(_consume, target, stored, False)[0]
    # Redis has one answer format: its row for the binary read is the same XRANGE figure.
    binary = target.system == "capella"
    figures["consume_binary"] = (
        _in_process(_consume, target, stored, True)[0] if binary else figures["consume"]
    )
    latency = _latency(target, RATE * seconds)
    figures["e2e_p50_ms"], figures["e2e_p99_ms"] = latency["p50"], latency["p99"]
    figures["peak_rss_mb"] = _status_kb(target.pid, "VmHWM") / 1024
    return figures


async def _produce(target: Target, producers: int, messages: int) -> tuple[float, float]:
    """Each producer in its own process; the rate over the span from the first start to the last end."""
    per_producer = messages // producers // BATCH
    barrier = _SPAWN.Barrier(producers)
    results = await asyncio.to_thread(
        _processes, [(_producer, (target, i, per_producer, barrier)) for i in range(producers)]
    )
    started = min(r[1] for r in results)
    wall = max(r[2] for r in results) - started
    return sum(r[0] for r in results) / wall, wall


def _processes(jobs: list[tuple[Callable[..., Coroutine[Any, Any, Any]], tuple[Any, ...]]]) -> list[Any]:
    """Run each job in a fresh process (barriers go in at start, by inheritance); their results."""
    answers: multiprocessing.Queue[tuple[int, Any, str | None]] = _SPAWN.Queue()
    procs = [
        _SPAWN.Process(target=_child, args=(index, job, args, answers))
        for index, (job, args) in enumerate(jobs)
    ]
    for proc in procs:
        proc.start()
    try:
        results: dict[int, Any] = {}
        for _ in jobs:
            index, result, failure = answers.get(timeout=PROCESS_TIMEOUT)
            if failure is not None:
                raise BenchmarkFailed(f"a load process failed: {failure}")
            results[index] = result
        return [results[i] for i in range(len(jobs))]
    finally:
        for proc in procs:
            proc.join(10.0)
            if proc.is_alive():
                proc.kill()
                proc.join()


def _in_process(job: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> Any:
    return _processes([(job, args)])[0]


def _child(
    index: int,
    job: Callable[..., Coroutine[Any, Any, Any]],
    args: tuple[Any, ...],
    answers: multiprocessing.Queue[tuple[int, Any, str | None]],
) -> None:
    try:
        try:
            import uvloop
        except ImportError:
            result = asyncio.run(job(*args))
        else:
            result = uvloop.run(job(*args))
    except BaseException as exc:
        answers.put((index, None, f"{type(exc).__name__}: {exc}"))
        raise
    answers.put((index, result, None))


def _latency(target: Target, count: int) -> dict[str, float]:
    """The follower and the open-loop sender, each in its own process."""
    latencies: list[float] = _processes([(_follow, (target, count)), (_pace, (target, count))])[0]
    if len(latencies) < count:
        raise BenchmarkFailed(f"{target.system}: the follower saw {len(latencies)} of {count} messages")
    return summary(latencies, scale=1000)


# --- what the child processes run ---------------------------------------------------------


async def _producer(target: Target, index: int, batches: int, barrier: Barrier) -> tuple[int, float, float]:
    bodies: list[Any] = text_batches(BATCH, PAYLOAD, count=16, seed=index + 1)
    if target.system == "redis":  # decoded before the clock starts, as Capella's are encoded
        bodies = [[m["data"] for m in orjson.loads(body)["messages"]] for body in bodies]
    async with _client(target) as send:
        for body in bodies[:4]:  # warm the connection up before the clock starts
            await send(body)
        await asyncio.to_thread(barrier.wait, PROCESS_TIMEOUT)
        started = time.monotonic()
        for n in range(batches):
            await send(bodies[n % len(bodies)])
        return batches * BATCH, started, time.monotonic()


async def _consume(target: Target, expected: int, binary: bool) -> tuple[float, int]:
    read = 0
    started = time.monotonic()
    if target.system == "capella" and binary:
        after = 0
        async with new_session() as session:
            url = f"{target.address}/v1/queues/{STREAM}/messages"
            accept = {"Accept": frames.MEDIA_TYPE}
            while read < expected:
                async with session.get(url, params={"after": after, "limit": PAGE}, headers=accept) as resp:
                    messages, _ = frames.decode_page(await resp.read())
                if not messages:
                    break
                read += len(messages)
                after = messages[-1].id
    elif target.system == "capella":
        after = 0
        async with new_session() as session:
            url = f"{target.address}/v1/queues/{STREAM}/messages"
            while read < expected:
                async with session.get(url, params={"after": after, "limit": PAGE}) as resp:
                    page = orjson.loads(await resp.read())
                if not page["messages"]:
                    break
                read += len(page["messages"])
                after = page["messages"][-1]["id"]
    else:
        import redis.asyncio as redis

        client = redis.Redis(port=int(target.address))
        start = "-"
        while read < expected:
            entries = await client.xrange(STREAM, min=start, count=PAGE)
            if not entries:
                break
            read += len(entries)
            start = "(" + entries[-1][0].decode()
        await client.aclose()
    elapsed = time.monotonic() - started
    if read < expected:
        raise BenchmarkFailed(f"{target.system}: read {read} of {expected} messages from the start")
    return read / elapsed, read


async def _pace(target: Target, count: int) -> None:
    """Message i goes out at start + i / RATE, whether or not earlier answers are in."""
    pad = "x" * (PAYLOAD - 20)
    await asyncio.sleep(1.0)  # the follower, started with it, is waiting before the first send
    async with _client(target, single=True, connections=64) as send:
        started = time.monotonic() + 0.05
        tasks = []
        for i in range(count):
            delay = started + i / RATE - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            stamp = f"{time.monotonic_ns():020d}"
            tasks.append(asyncio.create_task(send(stamp + pad)))
        await asyncio.gather(*tasks)


async def _follow(target: Target, count: int) -> list[float]:
    latencies: list[float] = []
    if target.system == "capella":
        after = 0
        async with new_session() as session:
            url = f"{target.address}/v1/queues/{LATENCY_STREAM}/messages"
            while len(latencies) < count:
                params = {"after": after, "limit": PAGE, "wait": 1}
                async with session.get(url, params=params) as resp:
                    body = await resp.read()
                now = time.monotonic_ns()
                for message in orjson.loads(body)["messages"]:
                    latencies.append((now - int(message["data"][:20])) / 1e9)
                    after = message["id"]
    else:
        import redis.asyncio as redis

        client = redis.Redis(port=int(target.address))
        last = "0-0"
        while len(latencies) < count:
            answer = await client.xread({LATENCY_STREAM: last}, count=PAGE, block=1000)
            now = time.monotonic_ns()
            for _, entries in answer:
                for entry_id, fields in entries:
                    latencies.append((now - int(fields[b"d"][:20])) / 1e9)
                    last = entry_id
        await client.aclose()
    return latencies


@contextlib.asynccontextmanager
async def _client(
    target: Target, *, single: bool = False, connections: int = 1
) -> AsyncIterator[Callable[[Any], Coroutine[Any, Any, None]]]:
    """``send(batch)``: a batch (Capella: a JSON body; Redis: the payloads) or, with ``single``,
    one text payload."""
    if target.system == "capella":
        queue = LATENCY_STREAM if single else STREAM
        url = f"{target.address}/v1/queues/{queue}/messages?save=wait"
        headers = {"Content-Type": "application/json"}
        async with new_session(connections) as session:

            async def post(body: Any) -> None:
                data = orjson.dumps({"data": body}) if single else body
                async with session.post(url, data=data, headers=headers) as resp:
                    if resp.status != 200:
                        raise BenchmarkFailed(f"capella produce: HTTP {resp.status}: {await resp.text()}")
                    await resp.read()

            yield post
        return
    import redis.asyncio as redis

    # Waits for a free connection when all are busy, as aiohttp's connector does.
    pool = redis.BlockingConnectionPool(port=int(target.address), max_connections=connections)
    client = redis.Redis(connection_pool=pool)

    async def xadd(body: Any) -> None:
        if single:
            await client.xadd(LATENCY_STREAM, {"d": body})
            return
        pipe = client.pipeline(transaction=False)
        for payload in body:
            pipe.xadd(STREAM, {"d": payload})
        await pipe.execute()

    try:
        yield xadd
    finally:
        await client.aclose()


# --- the two servers ----------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _running(system: str, redis_server: str, data: Path, log: Path) -> AsyncIterator[Target]:
    if system == "capella":
        async with running_server(data, log) as server:
            async with new_session() as session:
                await put_queue(session, server.url, STREAM)
                await put_queue(session, server.url, LATENCY_STREAM)
            yield Target("capella", server.url, server.pid)
        return
    await asyncio.to_thread(data.mkdir, parents=True)
    port = free_port()
    command = [redis_server, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data)]
    command += ["--appendonly", "yes", "--appendfsync", "always", "--save", "", "--daemonize", "no"]
    with log.open("ab") as out:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    try:
        await _redis_ready(port, proc)
        yield Target("redis", str(port), proc.pid)
    finally:
        proc.terminate()
        if not await exited(proc, 30.0):
            proc.kill()
            proc.wait()


async def _redis_ready(port: int, proc: subprocess.Popen[bytes]) -> None:
    import redis.asyncio as redis

    client = redis.Redis(port=port)
    try:
        for _ in range(500):
            if proc.poll() is not None:
                raise BenchmarkFailed(f"redis-server exited with {proc.returncode}")
            with contextlib.suppress(redis.ConnectionError):
                if await client.ping():
                    return
            await asyncio.sleep(0.01)
    finally:
        await client.aclose()
    raise BenchmarkFailed("redis-server did not answer PING within 5 s")


def _redis_version(redis_server: str) -> str:
    done = subprocess.run([redis_server, "--version"], capture_output=True, text=True, check=False)
    return done.stdout.strip()


def _status_kb(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise BenchmarkFailed(f"/proc/{pid}/status has no {field}")
