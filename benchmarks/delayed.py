"""Delayed delivery: schedule, cancel and dispatch 100,000 tasks.

- **schedule**: 4 producers send batches of 1000 tasks (64-byte payloads) with ``save=wait``,
  all due at the same instant (the start of one second), far enough ahead that scheduling
  ends before it;
- **cancel**: 100,000 tasks a day ahead (so most wait in chunk files on disk) are cancelled
  by 4 clients with ``POST /scheduled/cancel``, 1000 ids a request;
- **dispatch**: from the due instant, the queue's stats are polled every few milliseconds
  until every task is in the log: the rate is tasks / (time from the due instant until the
  last one was seen), so the releaser's wake-up and every fsync are in it.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import orjson

from benchmarks.client import JSON_HEADERS, new_session, put_queue, queue_stats
from benchmarks.meter import Meter
from benchmarks.result import BenchmarkFailed, Outcome, Row
from benchmarks.server import profiled, running_server
from benchmarks.settings import Settings

BATCH = 1000
CLIENTS = 4
PAYLOAD = "t" * 64
DISPATCH_TARGET = 200_000.0
DISPATCH_LIMIT = 60.0


async def run(settings: Settings) -> Outcome:
    outcome = Outcome()
    total = settings.pick(100_000, 10_000)
    async with running_server(settings.data_dir("delayed"), settings.log_path("delayed")) as server:
        async with new_session() as session:
            await put_queue(session, server.url, "delayed")
            await put_queue(session, server.url, "cancelled")

        # Far enough ahead that scheduling (measured at ~20k-60k/s on 2 cores) ends first.
        due = math.ceil(time.time()) + settings.pick(20, 6)
        bodies = [
            orjson.dumps({"messages": [{"data": PAYLOAD, "deliver_at": due} for _ in range(BATCH)]})
            for _ in range(0, total, BATCH)
        ]
        meter = Meter(server)
        meter.start()
        answers = await _send_all(server.url, "delayed", bodies)
        meter.stop()
        if time.time() >= due:
            raise BenchmarkFailed("scheduling took longer than the lead time; raise it")
        schedule = {
            "tasks": answers,
            "seconds": meter.wall,
            "rate": answers / meter.wall,
            "cpu": meter.to_dict(),
        }

        profile = settings.profile_path("delayed-dispatch")
        async with profiled(server, profile), new_session() as session:
            dispatch = await _watch_dispatch(session, server.url, total, due)

        far = time.time() + 86_400
        cancel_bodies = [
            orjson.dumps({"messages": [{"data": PAYLOAD, "deliver_at": far + i + j} for j in range(BATCH)]})
            for i in range(0, total, BATCH)
        ]
        sids = await _schedule_ids(server.url, cancel_bodies)
        async with new_session() as session:
            stats = await queue_stats(session, server.url, "cancelled")
        meter = Meter(server)
        meter.start()
        cancelled = await _cancel_all(server.url, sids)
        meter.stop()
        cancel = {
            "tasks": cancelled,
            "seconds": meter.wall,
            "rate": cancelled / meter.wall,
            "in_memory_before": stats["scheduled"]["in_memory"],
            "chunks_before": stats["scheduled"]["chunks"],
            "cpu": meter.to_dict(),
        }
        peak = server.peak_rss_mb()

    outcome.details = {"schedule": schedule, "dispatch": dispatch, "cancel": cancel, "peak_rss_mb": peak}
    outcome.rows += [
        Row(
            "delayed",
            f"schedule {total:,} (4 clients, batches of 1000, save=wait)",
            schedule["rate"],
            "msg/s",
            note=f"server CPU {schedule['cpu']['server_cpu_pct']:.0f}%",
        ),
        Row(
            "delayed",
            f"dispatch {total:,} due in the same second",
            dispatch["rate"],
            "msg/s",
            DISPATCH_TARGET,
            note=f"all in the log {dispatch['done_after_due_s']:.2f} s after they fell due",
        ),
        Row(
            "delayed",
            f"cancel {total:,} a day ahead (4 clients, 1000 ids a request)",
            cancel["rate"],
            "msg/s",
            note=f"{cancel['in_memory_before']:,} in memory, {cancel['chunks_before']} chunks before",
        ),
        Row("delayed", "peak RSS", peak, "MB", higher_is_better=False),
    ]
    for row in outcome.rows:
        print(f"  {row.metric}: {row.value:,.0f} {row.unit} {row.note}", flush=True)
    return outcome


async def _send_all(base: str, queue: str, bodies: list[bytes]) -> int:
    url = f"{base}/v1/queues/{queue}/messages?save=wait"

    async def client(own: list[bytes]) -> int:
        sent = 0
        async with new_session() as session:
            for body in own:
                async with session.post(url, data=body, headers=JSON_HEADERS) as resp:
                    raw = await resp.read()
                    if resp.status != 200:
                        raise BenchmarkFailed(f"schedule: HTTP {resp.status}: {raw[:300]!r}")
                sent += sum(1 for r in orjson.loads(raw)["results"] if "scheduled_id" in r)
        return sent

    return sum(await asyncio.gather(*(client(bodies[i::CLIENTS]) for i in range(CLIENTS))))


async def _schedule_ids(base: str, bodies: list[bytes]) -> list[int]:
    url = f"{base}/v1/queues/cancelled/messages?save=wait"
    sids: list[int] = []
    async with new_session() as session:
        for body in bodies:
            async with session.post(url, data=body, headers=JSON_HEADERS) as resp:
                raw = await resp.read()
                if resp.status != 200:
                    raise BenchmarkFailed(f"schedule: HTTP {resp.status}: {raw[:300]!r}")
            sids += [r["scheduled_id"] for r in orjson.loads(raw)["results"]]
    return sids


async def _cancel_all(base: str, sids: list[int]) -> int:
    url = f"{base}/v1/queues/cancelled/scheduled/cancel?save=wait"
    chunks = [sids[i : i + BATCH] for i in range(0, len(sids), BATCH)]

    async def client(own: list[list[int]]) -> int:
        done = 0
        async with new_session() as session:
            for ids in own:
                async with session.post(url, json={"ids": ids}) as resp:
                    answer = await resp.json()
                    if resp.status != 200 or answer["not_cancelled"]:
                        raise BenchmarkFailed(f"cancel: HTTP {resp.status}: {str(answer)[:300]}")
                done += len(answer["cancelled"])
        return done

    return sum(await asyncio.gather(*(client(chunks[i::CLIENTS]) for i in range(CLIENTS))))


async def _watch_dispatch(session: Any, base: str, total: int, due: int) -> dict[str, Any]:
    """Poll the queue from just before ``due`` until every task is in the log."""
    await asyncio.sleep(max(0.0, due - time.time() - 0.05))
    first = last = math.nan
    polls = 0
    deadline = time.time() + DISPATCH_LIMIT
    while time.time() < deadline:
        stats = await queue_stats(session, base, "delayed")
        polls += 1
        now = time.time()
        if stats["messages"] > 0 and math.isnan(first):
            first = now
        if stats["messages"] >= total and stats["scheduled"]["count"] == 0:
            last = now
            break
        await asyncio.sleep(0.002)
    else:
        raise BenchmarkFailed(f"dispatch: not every task was delivered within {DISPATCH_LIMIT:g} s")
    span = max(last - due, 1e-3)
    return {
        "tasks": total,
        "first_seen_after_due_s": first - due,
        "done_after_due_s": last - due,
        "seconds": span,
        "rate": total / span,
        "polls": polls,
    }
