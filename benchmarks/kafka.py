"""The Kafka protocol listener beside the HTTP API and Redis, in the same run (issue 37's targets).

- durable produce: 256-byte payloads (the HTTP binary produce scenario's, ``versus.py``), 1 and
  4 producers, each a separate process. librdkafka (confluent-kafka) with ``acks=all`` and its
  own batching (``linger.ms`` 5, its default), into a queue whose save mode is ``wait``
  (answered after the fsync); HTTP binary produce (record batches of 100, ``save=wait``) into
  the same queue; Redis ``appendfsync always`` (pipelines of 100 ``XADD``). msg/s over the span
  from the first producer's start to the last one's end, and latency percentiles per request
  of 100 for HTTP and Redis (sent to answered, one request in flight per producer). A Kafka
  producer takes as many messages as it is given and answers each later (its own queue), so
  under that flood a message's latency is its wait in the client's queue: the Kafka latency
  is measured apart, one producer at 2,000 messages a second on a fixed schedule (produce call
  to delivery report, which includes librdkafka's ``linger.ms`` of 5);
- consume from the start: librdkafka (``assign`` at the beginning, ``consume`` of up to 1,000)
  beside the HTTP binary read (pages of 1,000 record batches, ``versus.py``), of the same
  messages, one process each;
- server CPU per produced message (``/proc/PID/stat``);
- start-up (spawn to ``/readyz``) and idle RSS with ``[kafka]`` off and on: off loads none of
  ``capella/kafka/``, so it must be today's figure.

Every figure is taken for each system in turn, the order rotating from round to round; the
rows are ratios of medians within the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import statistics
import time
from collections.abc import AsyncIterator
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

import orjson

from benchmarks import versus
from benchmarks.client import new_session, put_queue, text_batches
from benchmarks.result import BenchmarkFailed, Outcome, Row, percentile
from benchmarks.server import Server, cpu_seconds, free_port, profiled
from benchmarks.settings import Settings
from capella.records import record_batch

BATCH = versus.BATCH
PAYLOAD = versus.PAYLOAD
STREAM = versus.STREAM
IDLE_SECONDS = 2.0
PROCESS_TIMEOUT = versus.PROCESS_TIMEOUT
RATE = versus.RATE
TOPIC = STREAM  # a queue is a topic of one partition


async def run(settings: Settings) -> Outcome:
    outcome = Outcome()
    systems = ["capella"]
    redis_server = shutil.which("redis-server")
    if redis_server is None:
        print("  redis-server is not installed: Redis left out", flush=True)
    else:
        systems.append("redis")
    rounds = settings.pick(3, 1)
    messages = settings.pick(200_000, 20_000)
    figures: dict[str, list[float]] = {}
    for round_ in range(rounds):
        shift = round_ % len(systems)
        for system in systems[shift:] + systems[:shift]:
            measured = await _round(settings, system, round_, messages)
            for key, value in measured.items():
                figures.setdefault(key, []).append(value)
            shown = ", ".join(f"{k} {v:,.1f}" for k, v in measured.items())
            print(f"  round {round_ + 1} {system}: {shown}", flush=True)
        # Start-up and idle memory, [kafka] off then on.
        for kafka in (False, True):
            startup, rss = await _idle(settings, kafka, round_)
            side = "on" if kafka else "off"
            figures.setdefault(f"startup_s_{side}", []).append(startup)
            figures.setdefault(f"idle_rss_mb_{side}", []).append(rss)
            print(f"  round {round_ + 1} [kafka] {side}: start-up {startup:.3f} s, idle RSS {rss:.1f} MB")
    medians = {key: statistics.median(values) for key, values in figures.items()}
    outcome.details = {"rounds": rounds, "messages": messages, "figures": figures, "medians": medians}
    outcome.rows.extend(_rows(medians, rounds, "redis" in systems))
    return outcome


def _rows(m: dict[str, float], rounds: int, redis: bool) -> list[Row]:
    rows = []
    for producers in (1, 4):
        kafka, http = m[f"kafka_produce_{producers}"], m[f"http_produce_{producers}"]
        note = f"Kafka {kafka:,.0f}, HTTP binary {http:,.0f}"
        if redis:
            note += f", Redis {m[f'redis_produce_{producers}']:,.0f}"
        note += f" msg/s, medians of {rounds}"
        what = f"acks=all produce, {producers} producer{'s' if producers > 1 else ''}"
        rows.append(Row("kafka", f"{what} (Kafka/HTTP binary)", kafka / http, "x", 1.0, note=note))
        if redis:
            redis_rate = m[f"redis_produce_{producers}"]
            rows.append(Row("kafka", f"{what} (Kafka/Redis always)", kafka / redis_rate, "x", 1.0, note=note))
        for q in ("p50", "p99"):
            shown = f"Redis {m[f'redis_{q}_ms_{producers}']:.1f} ms per pipeline of {BATCH}" if redis else ""
            value = m[f"http_{q}_ms_{producers}"]
            rows.append(Row("kafka", f"{what}, HTTP binary {q} per request", value, "ms", None, False, shown))
    for q in ("p50", "p99"):
        value = m[f"kafka_paced_{q}_ms"]
        note = "produce call to delivery report, one producer"
        rows.append(Row("kafka", f"Kafka acks=all {q} at {RATE:,} msg/s", value, "ms", None, False, note))
    rows.append(
        Row(
            "kafka",
            "server CPU per produced message, Kafka",
            m["cpu_us_kafka_produce"],
            "µs",
            None,
            False,
            f"HTTP binary {m['cpu_us_http_produce']:.1f} µs",
        )
    )
    kafka, http = m["kafka_consume"], m["http_consume"]
    note = f"Kafka {kafka:,.0f}, HTTP binary {http:,.0f} msg/s, medians of {rounds}"
    rows.append(Row("kafka", "consume from the start (Kafka/HTTP binary)", kafka / http, "x", 1.0, note=note))
    # CPU per message over the span's own length: how busy the server was (1 less rate times CPU is
    # the share of the span it was idle, waiting on the consumer).
    busy = {w: m[f"cpu_us_{w}_consume"] * m[f"{w}_consume"] / 1e6 for w in ("kafka", "http")}
    rows.append(
        Row(
            "kafka",
            "server CPU per consumed message, Kafka",
            m["cpu_us_kafka_consume"],
            "µs",
            None,
            False,
            f"HTTP binary {m['cpu_us_http_consume']:.2f} µs; server busy {busy['kafka']:.0%} (Kafka), "
            f"{busy['http']:.0%} (HTTP)",
        )
    )
    for what, key, unit in (("start-up", "startup_s", "s"), ("idle RSS", "idle_rss_mb", "MB")):
        off, on = m[f"{key}_off"], m[f"{key}_on"]
        rows.append(Row("kafka", f"{what}, [kafka] off", off, unit, None, False, "no capella.kafka import"))
        rows.append(
            Row("kafka", f"{what}, [kafka] on", on, unit, None, False, f"{on - off:+.3f} {unit} over off")
        )
    return rows


async def _round(settings: Settings, system: str, round_: int, messages: int) -> dict[str, float]:
    name = f"kafka-{system}-{round_}"
    data, log = settings.data_dir(name), settings.log_path(name)
    figures: dict[str, float] = {}
    if system == "redis":
        async with versus._running(
            "redis", {"redis": shutil.which("redis-server") or ""}, data, log
        ) as target:
            for producers in (1, 4):
                rate, latencies = await _produce(_redis_producer, target, producers, messages)
                figures[f"redis_produce_{producers}"] = rate
                figures[f"redis_p50_ms_{producers}"] = 1000 * percentile(latencies, 50)
                figures[f"redis_p99_ms_{producers}"] = 1000 * percentile(latencies, 99)
        return figures
    async with _kafka_server(data, log, kafka=True) as (server, bootstrap):
        target = versus.Target("capella", server.url, server.pid)
        cpu_kafka = cpu_http = 0.0
        for producers in (1, 4):
            cpu = cpu_seconds(server.pid)
            profile = settings.profile_path(f"kafka-produce-{producers}-{round_}")
            async with profiled(server, profile):
                rate, latencies = await _produce(_kafka_producer, bootstrap, producers, messages)
            cpu_kafka += cpu_seconds(server.pid) - cpu
            figures[f"kafka_produce_{producers}"] = rate
        paced = versus._in_process(_kafka_paced, bootstrap, RATE * settings.pick(10, 2))
        figures["kafka_paced_p50_ms"] = 1000 * percentile(paced, 50)
        figures["kafka_paced_p99_ms"] = 1000 * percentile(paced, 99)
        for producers in (1, 4):
            cpu = cpu_seconds(server.pid)
            rate, latencies = await _produce(_http_producer, target, producers, messages)
            cpu_http += cpu_seconds(server.pid) - cpu
            figures[f"http_produce_{producers}"] = rate
            figures[f"http_p50_ms_{producers}"] = 1000 * percentile(latencies, 50)
            figures[f"http_p99_ms_{producers}"] = 1000 * percentile(latencies, 99)
        produced = 2 * (messages // BATCH) * BATCH
        figures["cpu_us_kafka_produce"] = 1e6 * cpu_kafka / produced
        figures["cpu_us_http_produce"] = 1e6 * cpu_http / produced
        stored = 2 * produced
        profile = settings.profile_path(f"kafka-consume-{round_}")
        cpu = cpu_seconds(server.pid)
        async with profiled(server, profile):
            figures["kafka_consume"], _ = versus._in_process(_kafka_consume, bootstrap, stored)
        figures["cpu_us_kafka_consume"] = 1e6 * (cpu_seconds(server.pid) - cpu) / stored
        cpu = cpu_seconds(server.pid)
        figures["http_consume"], _ = versus._in_process(versus._consume, target, stored, True)
        figures["cpu_us_http_consume"] = 1e6 * (cpu_seconds(server.pid) - cpu) / stored
    return figures


@contextlib.asynccontextmanager
async def _kafka_server(data: Path, log: Path, *, kafka: bool) -> AsyncIterator[tuple[Server, str]]:
    """A server (``[kafka]`` on a free port with ``kafka``) with the queue, save mode ``wait``."""
    await asyncio.to_thread(data.mkdir, parents=True)
    port = free_port()
    config = data.parent / f"{data.name}.toml"
    config.write_text(f'[kafka]\nlisten = "127.0.0.1:{port}"\n' if kafka else "", encoding="utf-8")
    server = await Server.start(data, log, config)
    try:
        async with new_session() as session:
            await put_queue(session, server.url, STREAM, {"save": "wait"})
        yield server, f"127.0.0.1:{port}"
    finally:
        await server.stop()


async def _idle(settings: Settings, kafka: bool, round_: int) -> tuple[float, float]:
    name = f"kafka-idle-{'on' if kafka else 'off'}-{round_}"
    async with _kafka_server(settings.data_dir(name), settings.log_path(name), kafka=kafka) as (server, _):
        await asyncio.sleep(IDLE_SECONDS)
        return server.startup, server.rss_mb()


async def _produce(job: Any, target: Any, producers: int, messages: int) -> tuple[float, list[float]]:
    """Each producer in its own process; the rate over the span from the first start to the last end."""
    per_producer = messages // producers // BATCH
    barrier = versus._SPAWN.Barrier(producers)
    results = await asyncio.to_thread(
        versus._processes, [(job, (target, i, per_producer, barrier)) for i in range(producers)]
    )
    started = min(r[1] for r in results)
    wall = max(r[2] for r in results) - started
    latencies = [lat for r in results for lat in r[3]]
    return sum(r[0] for r in results) / wall, latencies


def _payloads(index: int) -> list[list[bytes]]:
    """The HTTP binary produce scenario's payloads: 16 batches of 100 texts of 256 bytes."""
    bodies = text_batches(BATCH, PAYLOAD, count=16, seed=index + 1)
    return [[m["data"].encode() for m in orjson.loads(body)["messages"]] for body in bodies]


# --- what the child processes run ---------------------------------------------------------


async def _kafka_producer(
    bootstrap: str, index: int, batches: int, barrier: Barrier
) -> tuple[int, float, float, list[float]]:
    from confluent_kafka import Producer

    payloads = [p for batch in _payloads(index) for p in batch]
    count = batches * BATCH
    sent = [0.0] * count
    latencies: list[float] = []
    failed: list[str] = []

    def report(err: Any, msg: Any) -> None:
        if err is not None:
            failed.append(str(err))
            return
        # One partition: reports come in the order of the produce calls.
        latencies.append(time.monotonic() - sent[len(latencies)])

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for n in range(100):  # warm the connection up before the clock starts
        producer.produce(TOPIC, payloads[n], partition=0)
    producer.flush(30)
    await asyncio.to_thread(barrier.wait, PROCESS_TIMEOUT)
    started = time.monotonic()
    for n in range(count):
        sent[n] = time.monotonic()
        while True:
            try:
                producer.produce(TOPIC, payloads[n % len(payloads)], partition=0, on_delivery=report)
                break
            except BufferError:  # its queue is full: let deliveries drain
                producer.poll(0.01)
        if n % 1000 == 0:
            producer.poll(0)
    producer.flush(PROCESS_TIMEOUT)
    ended = time.monotonic()
    if failed or len(latencies) != count:
        raise BenchmarkFailed(
            f"kafka produce: {len(failed)} failed ({failed[:1]}), {len(latencies)} of {count}"
        )
    return count, started, ended, latencies


async def _kafka_paced(bootstrap: str, count: int) -> list[float]:
    """Message i goes out at start + i / RATE; each one's time from produce to delivery report."""
    from confluent_kafka import Producer

    payloads = [p for batch in _payloads(0) for p in batch]
    sent = [0.0] * count
    latencies: list[float] = []
    failed: list[str] = []

    def report(err: Any, msg: Any) -> None:
        if err is not None:
            failed.append(str(err))
            return
        # One partition: reports come in the order of the produce calls.
        latencies.append(time.monotonic() - sent[len(latencies)])

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    producer.produce(TOPIC, payloads[0], partition=0)
    producer.flush(30)
    started = time.monotonic() + 0.05
    for n in range(count):
        delay = started + n / RATE - time.monotonic()
        if delay > 0:
            producer.poll(delay)
        sent[n] = time.monotonic()
        producer.produce(TOPIC, payloads[n % len(payloads)], partition=0, on_delivery=report)
        producer.poll(0)
    producer.flush(PROCESS_TIMEOUT)
    if failed or len(latencies) != count:
        raise BenchmarkFailed(
            f"kafka produce: {len(failed)} failed ({failed[:1]}), {len(latencies)} of {count}"
        )
    return latencies


async def _http_producer(
    target: versus.Target, index: int, batches: int, barrier: Barrier
) -> tuple[int, float, float, list[float]]:
    bodies = [record_batch.encode(batch) for batch in _payloads(index)]
    latencies: list[float] = []
    async with versus._client(target, binary=True) as send:
        for body in bodies[:4]:
            await send(body)
        await asyncio.to_thread(barrier.wait, PROCESS_TIMEOUT)
        started = time.monotonic()
        for n in range(batches):
            at = time.monotonic()
            await send(bodies[n % len(bodies)])
            latencies.append(time.monotonic() - at)
        return batches * BATCH, started, time.monotonic(), latencies


async def _redis_producer(
    target: versus.Target, index: int, batches: int, barrier: Barrier
) -> tuple[int, float, float, list[float]]:
    bodies = [[p.decode() for p in batch] for batch in _payloads(index)]
    latencies: list[float] = []
    async with versus._client(target) as send:
        for body in bodies[:4]:
            await send(body)
        await asyncio.to_thread(barrier.wait, PROCESS_TIMEOUT)
        started = time.monotonic()
        for n in range(batches):
            at = time.monotonic()
            await send(bodies[n % len(bodies)])
            latencies.append(time.monotonic() - at)
        return batches * BATCH, started, time.monotonic(), latencies


async def _kafka_consume(bootstrap: str, expected: int) -> tuple[float, int]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False})
    read = 0
    started = time.monotonic()
    deadline = started + PROCESS_TIMEOUT
    try:
        consumer.assign([TopicPartition(TOPIC, 0, OFFSET_BEGINNING)])
        while read < expected and time.monotonic() < deadline:
            for msg in consumer.consume(1000, timeout=1.0):
                if msg.error() is not None:
                    raise BenchmarkFailed(f"kafka consume: {msg.error()}")
                read += 1
        elapsed = time.monotonic() - started
    finally:
        consumer.close()
    if read < expected:
        raise BenchmarkFailed(f"kafka consume: read {read} of {expected} messages from the start")
    return read / elapsed, read
