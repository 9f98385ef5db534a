"""Shared queues: three nodes on one PostgreSQL and one moto S3 server, beside local ``wait`` queues.

One run on this machine: a PostgreSQL of its own (the tests' ``tests/support/pg.py`` with
``durable=True``: fsync, synchronous_commit and full-page writes on; restarted once with
pg_stat_statements and WAL timing, to split a commit's time), moto's S3 server, and three
``capella serve`` nodes with the same ``[cluster] name`` and each a ``[shared]`` table
(``flush_interval`` 100 ms). Payloads are 1 KiB of random ASCII letters in ``data``, 100 to a
request, ``save=wait``.

- idle: each node's ``capella_shared_put_requests_total`` over a few quiet seconds, before any
  write and again after the busy runs (what is idle must cost no PUT);
- shared produce, closed loop: one load process per node (its own, so the load generator's CPU
  and garbage collector stay out of the nodes' figures; the cyclic collector is off in it),
  each running ``PRODUCERS`` producers that send their next batch when the previous answer is
  in, for a fixed time after a warm-up; then again with twice the producers. Aggregate msg/s
  over the span from the first start to the last end; produce latency is send → answer in the
  load processes; commit p50 is interpolated in the nodes' ``capella_shared_commit_seconds``
  buckets (as ``histogram_quantile`` does), and PostgreSQL says how much of a commit was its
  function and how much the WAL fsync; PUTs per node per second from
  ``capella_shared_put_requests_total``, checked against the objects that appeared in the bucket;
- shared produce, open loop: every node's load process sends on a fixed schedule, 30,000 msg/s
  in all, whether or not earlier answers are in; latency runs from each scheduled send time,
  so a slow flush cannot hide the requests queued behind it;
- local produce: the closed-loop load, the same nodes, into a local queue on each node
  (``save=wait``: the node's own journal and fsync), so the ratio shared / local is taken in one
  sitting;
- reader: a shared queue filled through node 0 only (200,000 messages, 206 MB of objects),
  then read from the start through node 2, which wrote none of it, with ``limit=1000`` JSON
  pages: a first pass that GETs the objects (GETs per object counted) and a second one from
  what the node cached (no GET: its object cache and, as far as they hold, its stamped batches).

``CAPELLA_BENCH_SHARED_PRODUCERS`` sets the producers per node (default 16). Each producer has
one request in flight and every request waits for a window plus its PUT and commit, so the
closed-loop rate is about ``3 x producers x 100 / latency``: it measures the producers, not the
nodes, until the nodes' CPU says otherwise (the doubled run shows which).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import multiprocessing
import os
import resource
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from benchmarks.client import JSON_HEADERS, messages_url, new_session, put_queue, text_batches
from benchmarks.postgres import pg_support
from benchmarks.result import BenchmarkFailed, Outcome, Row, summary
from benchmarks.s3 import MotoServer, running_moto
from benchmarks.server import Server, profiled, running_server
from benchmarks.settings import Settings

NODES = 3
PRODUCERS = int(os.environ.get("CAPELLA_BENCH_SHARED_PRODUCERS", "16"))  # per node
MORE_PRODUCERS = 2 * PRODUCERS  # a second shared run: does the rate grow with the load?
BATCH = 100
PAYLOAD = 1024
WINDOW = 0.1  # [shared] flush_interval
WARMUP_REQUESTS = 5  # per producer, before the clock starts
PACED_RATE = 30_000.0  # msg/s in all, for the open-loop latency run
PACED_CONNECTIONS = 96  # per node, under its max_connections_per_address (128)
PAGE = 1000
CLUSTER = "bench-shared"
MOUNT = "s3main"
PRODUCE_QUEUE = "produce"
LOCAL_QUEUE = "local"
READ_QUEUE = "reads"
SEEN_TIMEOUT = 15.0
PROCESS_TIMEOUT = 300.0
TARGET_RATE = 30_000.0
TARGET_COMMIT_MS = 5.0
TARGET_P50_MS = 1000 * WINDOW + 30
TARGET_P99_MS = 1000 * WINDOW + 150
TARGET_READ = 100_000.0
_SPAWN = multiprocessing.get_context("spawn")
_LAST_ID = b'"last_id":'


async def run(settings: Settings) -> Outcome:
    try:
        import asyncpg  # noqa: F401 (the nodes need it; the check says why early)
        import boto3  # noqa: F401
    except ImportError:
        raise BenchmarkFailed(
            "the shared scenario needs asyncpg and boto3: pip install -e '.[dev]'"
        ) from None
    missing = pg_support().available()
    if missing is not None:  # Debian's PostgreSQL server binaries: `make tools`
        print(f"  left out: {missing}", flush=True)
        return Outcome(details={"left_out": missing})
    seconds = settings.pick(20, 5)
    idle = settings.pick(3, 1)
    read_total = settings.pick(200_000, 20_000)
    outcome = Outcome()
    details = outcome.details
    pg = await asyncio.to_thread(pg_support().PgServer, durable=True)
    try:
        await asyncio.to_thread(_with_statistics, pg)
        dsn = await asyncio.to_thread(pg.create_database, "shared")
        await asyncio.to_thread(pg.psql, "shared", "create extension pg_stat_statements")
        async with (
            running_moto(settings.log_path("shared-moto")) as moto,
            _nodes(settings, moto, dsn) as nodes,
        ):
            async with new_session() as session:
                await _create_queues(session, nodes)
                details["idle_before"] = await _idle(session, nodes, idle)
            print(f"  idle: PUT/s per node {_fmt(details['idle_before']['puts_per_s'])}", flush=True)

            details["shared"] = await _produce_run(
                settings, nodes, moto, pg, PRODUCE_QUEUE, PRODUCERS, seconds, "shared"
            )
            _print_run("shared", details["shared"])
            details["shared_more"] = await _produce_run(
                settings, nodes, moto, pg, PRODUCE_QUEUE, MORE_PRODUCERS, seconds, "shared-more"
            )
            _print_run(f"shared, {MORE_PRODUCERS} producers per node,", details["shared_more"])
            async with new_session() as session:
                await asyncio.sleep(3 * WINDOW)  # the last window's flush, if one was still open
                details["idle_after"] = await _idle(session, nodes, idle)
            print(f"  idle after: PUT/s per node {_fmt(details['idle_after']['puts_per_s'])}", flush=True)

            details["paced"] = await _produce_run(
                settings, nodes, moto, pg, PRODUCE_QUEUE, 0, seconds, "shared-paced", paced=PACED_RATE
            )
            _print_run(f"shared, paced at {PACED_RATE:,.0f} msg/s,", details["paced"])
            details["local"] = await _produce_run(
                settings, nodes, moto, pg, LOCAL_QUEUE, PRODUCERS, seconds, "local"
            )
            _print_run("local", details["local"])

            details["reader"] = await _reader(settings, nodes, read_total)
            reader = details["reader"]
            print(
                f"  reader on a node that did not write: cold {reader['cold']['msgs_per_s']:,.0f} msg/s"
                f" ({reader['gets_per_object']:.2f} GET per object), warm {reader['warm']['msgs_per_s']:,.0f}"
                " msg/s",
                flush=True,
            )
            details["peak_rss_mb"] = [node.peak_rss_mb() for node in nodes]
    finally:
        await asyncio.to_thread(pg.close)
    details["setup"] = {
        "nodes": NODES,
        "producers_per_node": PRODUCERS,
        "payload": f"{BATCH} x {PAYLOAD} random ASCII chars in 'data' per request",
        "flush_interval_s": WINDOW,
        "postgres": "tests/support/pg.py PgServer(durable=True): fsync, synchronous_commit on",
    }
    outcome.rows = _rows(details)
    return outcome


# --- the cluster -------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _nodes(settings: Settings, moto: MotoServer, dsn: str) -> AsyncIterator[list[Server]]:
    """Three nodes of one shared cluster, stopped on the way out."""
    async with contextlib.AsyncExitStack() as stack:
        nodes = []
        for i in range(NODES):
            name = f"shared-node-{i}"
            config = settings.work_dir / f"{name}.toml"
            config.write_text(node_config(i, moto, dsn))
            node = await stack.enter_async_context(
                running_server(settings.data_dir(name), settings.log_path(name), config)
            )
            nodes.append(node)
        yield nodes


def node_config(i: int, moto: MotoServer, dsn: str) -> str:
    """Node ``i``'s TOML: the cluster's name, a file mount for local queues, the bucket, ``[shared]``."""
    return (
        f'[cluster]\nname = "{CLUSTER}"\n\n'
        '[mounts.default]\nprovider = "file"\npath = "queues"\n\n'
        f"{moto.mount_toml(MOUNT)}\n"
        f'[shared]\nnode = "node-{i}"\nmount = "{MOUNT}"\ndsn = "{dsn}"\n'
        f'flush_interval = "{int(WINDOW * 1000)}ms"\n' + _no_compaction()
    )


def _no_compaction() -> str:
    """``compact_after`` past the run, where the nodes compact: rewriting the produce queue's
    first minute into blocks mid-run would load the nodes and moto under the write-path figures."""
    from capella.config import SharedSettings

    return 'compact_after = "1h"\n' if "compact_after" in SharedSettings.__struct_fields__ else ""


async def _create_queues(session: aiohttp.ClientSession, nodes: list[Server]) -> None:
    for queue in (PRODUCE_QUEUE, READ_QUEUE):
        await put_queue(session, nodes[0].url, queue, {"storage": "shared", "save": "wait"})
    for node in nodes:
        await put_queue(session, node.url, LOCAL_QUEUE, {"save": "wait"})
    # The definitions reach the other nodes through PostgreSQL (NOTIFY, a poll behind it).
    deadline = time.perf_counter() + SEEN_TIMEOUT
    for node in nodes:
        for queue in (PRODUCE_QUEUE, READ_QUEUE):
            while True:
                async with session.get(f"{node.url}/v1/queues/{queue}") as resp:
                    if resp.status == 200:
                        break
                if time.perf_counter() > deadline:
                    raise BenchmarkFailed(
                        f"{node.url} does not see shared queue {queue} after {SEEN_TIMEOUT:g} s"
                    )
                await asyncio.sleep(0.05)


async def scrape(session: aiohttp.ClientSession, base: str) -> dict[str, float]:
    """Every sample of ``/metrics``: ``name{labels}`` → value."""
    async with session.get(f"{base}/metrics") as resp:
        text = await resp.text()
        if resp.status != 200:
            raise BenchmarkFailed(f"{base}/metrics: HTTP {resp.status}")
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def delta(before: dict[str, float], after: dict[str, float], name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


def histogram_quantile(before: dict[str, float], after: dict[str, float], name: str, q: float) -> float:
    """The ``q`` quantile (0..1) of what histogram ``name`` observed between two scrapes, linear
    within the bucket it falls in (as Prometheus's ``histogram_quantile``); NaN for no samples."""
    prefix = f'{name}_bucket{{le="'
    bounds = sorted(
        (math.inf if key[len(prefix) : -2] == "+Inf" else float(key[len(prefix) : -2]), key)
        for key in after
        if key.startswith(prefix)
    )
    cumulative = [(bound, delta(before, after, key)) for bound, key in bounds]
    total = cumulative[-1][1] if cumulative else 0.0
    if total <= 0:
        return math.nan
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, count in cumulative:
        if count >= rank:
            if math.isinf(bound):
                return lower
            return lower + (bound - lower) * (rank - below) / max(count - below, 1e-12)
        lower, below = bound, count
    return lower


async def _idle(session: aiohttp.ClientSession, nodes: list[Server], seconds: float) -> dict[str, Any]:
    before = [await scrape(session, node.url) for node in nodes]
    cpu = [node.cpu_seconds() for node in nodes]
    started = time.perf_counter()
    await asyncio.sleep(seconds)
    wall = time.perf_counter() - started
    after = [await scrape(session, node.url) for node in nodes]
    return {
        "seconds": wall,
        "puts_per_s": [
            delta(b, a, "capella_shared_put_requests_total") / wall
            for b, a in zip(before, after, strict=True)
        ],
        "server_cpu_pct": [100 * (node.cpu_seconds() - c) / wall for node, c in zip(nodes, cpu, strict=True)],
    }


def _with_statistics(pg: Any) -> None:
    """PostgreSQL restarted with pg_stat_statements and WAL timing: the commit's time split
    into the function's execution and the WAL fsync it waits for (``synchronous_commit``)."""
    with (Path(pg.data) / "postgresql.auto.conf").open("a") as conf:
        conf.write(
            "shared_preload_libraries = 'pg_stat_statements'\n"
            "pg_stat_statements.track = 'top'\n"
            "track_wal_io_timing = on\n"
        )
    pg.stop()
    pg.start()


def _pg_statistics(pg: Any) -> dict[str, float]:
    row = pg.psql(
        "shared",
        "select coalesce(sum(calls), 0), coalesce(sum(total_exec_time), 0),"
        " (select wal_sync from pg_stat_wal), (select wal_sync_time from pg_stat_wal),"
        " (select xact_commit from pg_stat_database where datname = 'shared')"
        " from pg_stat_statements where query like 'select capella_commit_object(%'",
    ).strip()
    calls, exec_ms, syncs, sync_ms, commits = (float(x) for x in row.split("|"))
    return {
        "commit_calls": calls,
        "commit_exec_ms": exec_ms,
        "wal_sync": syncs,
        "wal_sync_ms": sync_ms,
        "xact_commit": commits,
    }


def _postgres_cpu(pg: Any) -> float:
    """CPU seconds of the PostgreSQL server so far: the postmaster (with its reaped children) and
    every live backend."""
    postmaster = int((Path(pg.data) / "postmaster.pid").read_text().split()[0])
    total = _cpu_with_children(postmaster)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[1]) == postmaster:
            total += (int(fields[11]) + int(fields[12])) / 100
    return total


def _cpu_with_children(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rpartition(")")[2].split()
    return sum(int(x) for x in fields[11:15]) / 100


# --- produce -----------------------------------------------------------------------------------


async def _produce_run(
    settings: Settings,
    nodes: list[Server],
    moto: MotoServer,
    pg: Any,
    queue: str,
    producers: int,
    seconds: float,
    name: str,
    paced: float | None = None,
) -> dict[str, Any]:
    """One timed run of every node's load process; ``paced``: an open loop at that many msg/s
    in all (``producers`` is then unused), else closed-loop producers."""
    # The bucket's objects against the PUTs the nodes counted, warm-up included (a listing
    # taken while PUTs go on would not match the counters); the rates are after the warm-up.
    async with new_session() as session:
        first = [await scrape(session, node.url) for node in nodes]
    objects_before = (await asyncio.to_thread(moto.objects))[0]
    barrier = _SPAWN.Barrier(NODES + 1)
    jobs: list[tuple[Callable[..., Coroutine[Any, Any, Any]], tuple[Any, ...]]] = [
        (_load, (str(messages_url(node.url, "wait", queue)), i, producers, seconds, barrier))
        if paced is None
        else (
            _paced,
            (str(messages_url(node.url, "wait", queue)), i, paced / NODES / BATCH, seconds, barrier),
        )
        for i, node in enumerate(nodes)
    ]
    async with profiled(nodes[0], settings.profile_path(f"shared-produce-{name}-node0")):
        running = asyncio.create_task(asyncio.to_thread(_processes, jobs))
        try:
            await asyncio.to_thread(barrier.wait, PROCESS_TIMEOUT)  # every process warmed up
            started = time.perf_counter()
            cpu = [node.cpu_seconds() for node in nodes]
            moto_cpu, pg_cpu = moto.cpu_seconds(), _postgres_cpu(pg)
            pg_before = await asyncio.to_thread(_pg_statistics, pg)
            # After the warm-up (every answer of it is in): its flushes are not counted.
            async with new_session() as session:
                before = [await scrape(session, node.url) for node in nodes]
            results = await running
        finally:
            running.cancel()
        wall = time.perf_counter() - started
    node_cpu = [100 * (node.cpu_seconds() - c) / wall for node, c in zip(nodes, cpu, strict=True)]
    moto_pct = 100 * (moto.cpu_seconds() - moto_cpu) / wall
    pg_pct = 100 * (_postgres_cpu(pg) - pg_cpu) / wall
    async with new_session() as session:
        after = [await scrape(session, node.url) for node in nodes]
    objects_after = (await asyncio.to_thread(moto.objects))[0]
    pg_after = await asyncio.to_thread(_pg_statistics, pg)
    pg_delta = {key: pg_after[key] - pg_before[key] for key in pg_after}
    span = max(r["end"] for r in results) - min(r["start"] for r in results)
    sent = sum(r["messages"] for r in results)
    latencies = [x for r in results for x in r["latencies"]]
    merged_before = _sum_samples(before)
    merged_after = _sum_samples(after)
    puts = [delta(b, a, "capella_shared_put_requests_total") for b, a in zip(before, after, strict=True)]
    commits = delta(merged_before, merged_after, "capella_shared_commit_seconds_count")
    return {
        "queue": queue,
        "producers_per_node": producers,
        "messages": sent,
        "seconds": span,
        "msgs_per_s": sent / span,
        "per_node_msgs_per_s": [r["messages"] / span for r in results],
        "request_latency_ms": summary(latencies, scale=1000),
        "commit_ms": {
            "count": commits,
            "p50": 1000
            * histogram_quantile(merged_before, merged_after, "capella_shared_commit_seconds", 0.5),
            "p99": 1000
            * histogram_quantile(merged_before, merged_after, "capella_shared_commit_seconds", 0.99),
            "mean": 1000 * delta(merged_before, merged_after, "capella_shared_commit_seconds_sum") / commits
            if commits
            else math.nan,
        },
        "postgres": {
            "commits": pg_delta["commit_calls"],
            "commit_exec_mean_ms": pg_delta["commit_exec_ms"] / pg_delta["commit_calls"]
            if pg_delta["commit_calls"]
            else math.nan,
            "wal_syncs": pg_delta["wal_sync"],
            "wal_sync_mean_ms": pg_delta["wal_sync_ms"] / pg_delta["wal_sync"]
            if pg_delta["wal_sync"]
            else math.nan,
            "transactions": pg_delta["xact_commit"],
        },
        "flush_ms": {
            "mean": 1000
            * delta(merged_before, merged_after, "capella_shared_flush_seconds_sum")
            / max(delta(merged_before, merged_after, "capella_shared_flush_seconds_count"), 1),
            "p50": 1000
            * histogram_quantile(merged_before, merged_after, "capella_shared_flush_seconds", 0.5),
            "p99": 1000
            * histogram_quantile(merged_before, merged_after, "capella_shared_flush_seconds", 0.99),
        },
        "puts_per_node_per_s": [p / span for p in puts],
        "put_mb_per_s": delta(merged_before, merged_after, "capella_shared_put_bytes_total") / span / 1e6,
        "objects_in_bucket": objects_after - objects_before,
        "puts": sum(
            delta(b, a, "capella_shared_put_requests_total") for b, a in zip(first, after, strict=True)
        ),
        "failures": {
            key: delta(merged_before, merged_after, key)
            for key in merged_after
            if key.startswith("capella_shared_failures_total") and delta(merged_before, merged_after, key)
        },
        "cpu_pct": {
            "nodes": node_cpu,
            "moto": moto_pct,
            "postgres": pg_pct,
            "load": [100 * r["cpu_s"] / span for r in results],
        },
    }


def _sum_samples(scrapes: list[dict[str, float]]) -> dict[str, float]:
    total: dict[str, float] = {}
    for samples in scrapes:
        for key, value in samples.items():
            total[key] = total.get(key, 0.0) + value
    return total


def _processes(jobs: list[tuple[Callable[..., Coroutine[Any, Any, Any]], tuple[Any, ...]]]) -> list[Any]:
    """Each job in a fresh process (the barrier goes in at start, by inheritance); their results."""
    answers: multiprocessing.Queue[tuple[int, Any, str | None]] = _SPAWN.Queue()
    procs = [
        _SPAWN.Process(target=_child, args=(i, job, args, answers)) for i, (job, args) in enumerate(jobs)
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


def _child(
    index: int,
    job: Callable[..., Coroutine[Any, Any, Any]],
    args: tuple[Any, ...],
    answers: multiprocessing.Queue[tuple[int, Any, str | None]],
) -> None:
    gc.disable()  # a full collection here would hold answers back and show up as latency
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


async def _load(url: str, index: int, producers: int, seconds: float, barrier: Barrier) -> dict[str, Any]:
    """One node's producers: each sends its next batch when its previous answer is in, for
    ``seconds`` after every process has warmed up."""
    bodies = text_batches(BATCH, PAYLOAD, count=8, seed=index + 1)
    latencies: list[float] = []
    starts: list[float] = []
    ends: list[float] = []
    sent = 0
    ready = asyncio.Barrier(producers + 1)
    go = asyncio.Event()
    deadline = 0.0

    async def producer(n: int) -> None:
        nonlocal sent
        own = bodies[n % len(bodies) :] + bodies[: n % len(bodies)]
        async with new_session() as session:
            for i in range(WARMUP_REQUESTS):
                await _post(session, url, own[i % len(own)])
            await ready.wait()
            await go.wait()
            starts.append(time.perf_counter())
            i = 0
            while time.perf_counter() < deadline:
                began = time.perf_counter()
                await _post(session, url, own[i % len(own)])
                latencies.append(time.perf_counter() - began)
                sent += BATCH
                i += 1
            ends.append(time.perf_counter())

    tasks = [asyncio.create_task(producer(n)) for n in range(producers)]
    try:
        await ready.wait()
        await asyncio.to_thread(barrier.wait, PROCESS_TIMEOUT)
        deadline = time.perf_counter() + seconds
        cpu = _own_cpu()
        go.set()
        await asyncio.gather(*tasks)
        cpu = _own_cpu() - cpu
    finally:
        for task in tasks:
            task.cancel()
    # perf_counter is CLOCK_MONOTONIC: comparable across the processes of one machine.
    return {"messages": sent, "start": min(starts), "end": max(ends), "latencies": latencies, "cpu_s": cpu}


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _paced(url: str, index: int, rate: float, seconds: float, barrier: Barrier) -> dict[str, Any]:
    """One node's open loop: request ``i`` goes out at ``start + i / rate`` whether or not the
    earlier answers are in; its latency runs from that scheduled time to its answer."""
    bodies = text_batches(BATCH, PAYLOAD, count=8, seed=index + 1)
    latencies: list[float] = []
    tasks: set[asyncio.Task[None]] = set()
    count = int(rate * seconds)
    async with new_session(connections=PACED_CONNECTIONS) as session:
        for i in range(WARMUP_REQUESTS):
            await _post(session, url, bodies[i % len(bodies)])

        async def send(i: int, scheduled: float) -> None:
            await _post(session, url, bodies[i % len(bodies)])
            latencies.append(time.perf_counter() - scheduled)

        await asyncio.to_thread(barrier.wait, PROCESS_TIMEOUT)
        cpu = _own_cpu()
        # Each node's schedule is offset by a share of one interval: the nodes do not send in step.
        start = time.perf_counter() + (index / NODES) / rate
        sent = 0
        while sent < count:
            due = min(count, int((time.perf_counter() - start) * rate) + 1)
            while sent < due:
                task = asyncio.create_task(send(sent, start + sent / rate))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                sent += 1
            # uvloop returns at once from sleeps under 1 ms: at least 1 ms, or a core spins.
            await asyncio.sleep(max(0.001, start + sent / rate - time.perf_counter()))
        await asyncio.gather(*tasks)
        end = time.perf_counter()
        cpu = _own_cpu() - cpu
    return {"messages": count * BATCH, "start": start, "end": end, "latencies": latencies, "cpu_s": cpu}


async def _post(session: aiohttp.ClientSession, url: str, body: bytes) -> None:
    async with session.post(url, data=body, headers=JSON_HEADERS) as resp:
        raw = await resp.read()
        if resp.status != 200:
            raise BenchmarkFailed(f"produce: HTTP {resp.status}: {raw[:300]!r}")


# --- the reader --------------------------------------------------------------------------------


async def _reader(settings: Settings, nodes: list[Server], total: int) -> dict[str, Any]:
    """Fill the read queue through node 0, then read it all through node 2, twice."""
    writer, reader = nodes[0], nodes[-1]
    async with new_session() as session:
        before = await scrape(session, writer.url)
    filled = await asyncio.to_thread(
        _processes, [(_fill, (str(messages_url(writer.url, "wait", READ_QUEUE)), total))]
    )
    async with new_session() as session:
        after_fill = await scrape(session, writer.url)
        objects = delta(before, after_fill, "capella_shared_objects_total")
        out: dict[str, Any] = {"messages": filled[0], "objects": objects}
        for name in ("cold", "warm"):
            start = await scrape(session, reader.url)
            cpu = reader.cpu_seconds()
            async with profiled(reader, settings.profile_path(f"shared-read-{name}")):
                result = await asyncio.to_thread(
                    _processes, [(_read_all, (str(messages_url(reader.url, queue=READ_QUEUE)), filled[0]))]
                )
            end = await scrape(session, reader.url)
            figures = result[0]
            figures["server_cpu_pct"] = 100 * (reader.cpu_seconds() - cpu) / figures["seconds"]
            figures["gets"] = delta(start, end, "capella_shared_get_requests_total")
            figures["get_mb"] = delta(start, end, "capella_shared_get_bytes_total") / 1e6
            out[name] = figures
    out["gets_per_object"] = out["cold"]["gets"] / objects if objects else math.nan
    return out


async def _fill(url: str, total: int) -> int:
    bodies = text_batches(BATCH, PAYLOAD, count=8, seed=99)
    requests = total // BATCH
    sent = 0

    async def producer(n: int) -> None:
        nonlocal sent
        async with new_session() as session:
            for i in range(n, requests, PRODUCERS):
                await _post(session, url, bodies[i % len(bodies)])
                sent += BATCH

    await asyncio.gather(*(producer(n) for n in range(PRODUCERS)))
    return sent


async def _read_all(url: str, total: int) -> dict[str, Any]:
    """Pages of ``PAGE`` from the start until ``total`` messages are read; the first is checked in full."""
    after = 0
    received = 0
    body_bytes = 0
    latencies: list[float] = []
    async with new_session() as session:
        started = time.perf_counter()
        while received < total:
            began = time.perf_counter()
            async with session.get(f"{url}?after={after}&limit={PAGE}") as resp:
                raw = await resp.read()
                if resp.status != 200:
                    raise BenchmarkFailed(f"read: HTTP {resp.status}: {raw[:300]!r}")
            latencies.append(time.perf_counter() - began)
            if after == 0:
                page = orjson.loads(raw)
                ids = [m["id"] for m in page["messages"]]
                if ids != list(range(1, len(ids) + 1)) or any(
                    len(m["data"]) != PAYLOAD for m in page["messages"]
                ):
                    raise BenchmarkFailed(
                        f"read: the first page is not messages 1.. with {PAYLOAD}-char data"
                    )
            last_id = int(raw[raw.rindex(_LAST_ID) + len(_LAST_ID) :].rstrip(b"}\n "))
            if last_id <= after:
                raise BenchmarkFailed(f"read stalled at after={after}")
            received += last_id - after
            body_bytes += len(raw)
            after = last_id
        wall = time.perf_counter() - started
    return {
        "messages": received,
        "seconds": wall,
        "msgs_per_s": received / wall,
        "mb_per_s": body_bytes / wall / 1e6,
        "page_latency_ms": summary(latencies, scale=1000),
    }


# --- the table ---------------------------------------------------------------------------------


def _rows(details: dict[str, Any]) -> list[Row]:
    shared, local = details["shared"], details["local"]
    reader = details["reader"]
    rows: list[Row] = []
    s_lat, l_lat = shared["request_latency_ms"], local["request_latency_ms"]
    cpu = shared["cpu_pct"]
    cpu_note = (
        f"nodes CPU {'/'.join(f'{c:.0f}' for c in cpu['nodes'])}%, PostgreSQL {cpu['postgres']:.0f}%,"
        f" moto {cpu['moto']:.0f}%, load processes {'/'.join(f'{c:.0f}' for c in cpu['load'])}%"
    )
    setup = f"{NODES} nodes x {PRODUCERS} producers, {BATCH} x 1 KiB, save=wait"
    rows += [
        Row(
            "shared", f"produce aggregate, {setup}", shared["msgs_per_s"], "msg/s", TARGET_RATE, note=cpu_note
        ),
        Row(
            "shared",
            "commit p50 (capella_shared_commit_seconds)",
            shared["commit_ms"]["p50"],
            "ms",
            TARGET_COMMIT_MS,
            higher_is_better=False,
            note=f"mean {shared['commit_ms']['mean']:.2f} ms, p99 {shared['commit_ms']['p99']:.1f} ms;"
            f" in PostgreSQL: function {shared['postgres']['commit_exec_mean_ms']:.2f} ms"
            f" + WAL fsync {shared['postgres']['wal_sync_mean_ms']:.2f} ms (means)",
        ),
        Row(
            "shared",
            "produce p50, send → answer (closed loop)",
            s_lat["p50"],
            "ms",
            TARGET_P50_MS,
            higher_is_better=False,
        ),
        Row(
            "shared",
            "produce p99, send → answer (closed loop)",
            s_lat["p99"],
            "ms",
            TARGET_P99_MS,
            higher_is_better=False,
        ),
        Row(
            "shared",
            f"produce p50 at a paced {PACED_RATE:,.0f} msg/s (open loop)",
            details["paced"]["request_latency_ms"]["p50"],
            "ms",
            TARGET_P50_MS,
            higher_is_better=False,
            note=f"{details['paced']['msgs_per_s']:,.0f} msg/s achieved; from each scheduled send time",
        ),
        Row(
            "shared",
            f"produce p99 at a paced {PACED_RATE:,.0f} msg/s (open loop)",
            details["paced"]["request_latency_ms"]["p99"],
            "ms",
            TARGET_P99_MS,
            higher_is_better=False,
            note=f"commit p50 {details['paced']['commit_ms']['p50']:.1f} ms, nodes CPU "
            + "/".join(f"{c:.0f}" for c in details["paced"]["cpu_pct"]["nodes"])
            + "%",
        ),
        Row(
            "shared",
            f"produce aggregate, {NODES} nodes x {MORE_PRODUCERS} producers",
            details["shared_more"]["msgs_per_s"],
            "msg/s",
            note=f"p50 {details['shared_more']['request_latency_ms']['p50']:.0f} ms,"
            f" p99 {details['shared_more']['request_latency_ms']['p99']:.0f} ms,"
            f" commit p50 {details['shared_more']['commit_ms']['p50']:.1f} ms, nodes CPU "
            + "/".join(f"{c:.0f}" for c in details["shared_more"]["cpu_pct"]["nodes"])
            + "%",
        ),
        Row(
            "shared",
            "PUT requests per node per second, busy (max of nodes)",
            max(shared["puts_per_node_per_s"] + details["shared_more"]["puts_per_node_per_s"]),
            "PUT/s",
            1 / WINDOW,
            higher_is_better=False,
            note=f"{'/'.join(f'{p:.1f}' for p in shared['puts_per_node_per_s'])};"
            f" {shared['objects_in_bucket']} objects in the bucket for {shared['puts']:.0f} PUTs",
        ),
        Row(
            "shared",
            "PUT requests per node per second, idle (max of nodes)",
            max(details["idle_before"]["puts_per_s"] + details["idle_after"]["puts_per_s"]),
            "PUT/s",
            0.0,
            higher_is_better=False,
            note="before any write and after the busy run",
        ),
        Row(
            "local",
            f"produce aggregate, {setup}",
            local["msgs_per_s"],
            "msg/s",
            note=f"nodes CPU {'/'.join(f'{c:.0f}' for c in local['cpu_pct']['nodes'])}%",
        ),
        Row("local", "produce p50, send → answer", l_lat["p50"], "ms", higher_is_better=False),
        Row("local", "produce p99, send → answer", l_lat["p99"], "ms", higher_is_better=False),
        Row("shared", "produce aggregate, shared / local", shared["msgs_per_s"] / local["msgs_per_s"], "x"),
        Row(
            "shared",
            "read from start on a node that did not write, cold",
            reader["cold"]["msgs_per_s"],
            "msg/s",
            note=f"{reader['cold']['gets']:.0f} GETs for {reader['objects']:.0f} objects,"
            f" server CPU {reader['cold']['server_cpu_pct']:.0f}%",
        ),
        Row(
            "shared",
            "read from start on a node that did not write, cached",
            reader["warm"]["msgs_per_s"],
            "msg/s",
            TARGET_READ,
            note=f"{reader['warm']['gets']:.0f} GETs, {reader['warm']['mb_per_s']:.0f} MB/s of JSON,"
            f" server CPU {reader['warm']['server_cpu_pct']:.0f}%",
        ),
        Row(
            "shared",
            "peak RSS of a node (VmHWM, max of nodes)",
            max(details["peak_rss_mb"]),
            "MB",
            higher_is_better=False,
            note="/".join(f"{m:.0f}" for m in details["peak_rss_mb"])
            + " MB; node 2 is the reader, nodes 0 and 1 pin their own objects for 30 s",
        ),
    ]
    return rows


def _print_run(name: str, result: dict[str, Any]) -> None:
    lat = result["request_latency_ms"]
    print(
        f"  {name} produce: {result['msgs_per_s']:,.0f} msg/s,"
        f" p50 {lat['p50']:.1f} ms, p99 {lat['p99']:.1f} ms; commit p50 {result['commit_ms']['p50']:.2f} ms;"
        f" PUT/s per node {_fmt(result['puts_per_node_per_s'])};"
        f" CPU {result['cpu_pct']}",
        flush=True,
    )


def _fmt(values: list[float]) -> str:
    return "/".join(f"{v:.1f}" for v in values)
