"""Read from start when every block lives only in S3 (moto on loopback).

100,000 text messages (256 ASCII characters, as in the ``read`` scenario; ``--quick``:
20,000) go to a queue whose mark 1 is the ``s3`` mount; once sealed, one archive pass moves
every block there and deletes the local copies. The server is restarted, so no block is in
memory, and one reader pages from ``after=0`` with ``limit=1000``: every tenth page makes the
server fetch a block object from moto. moto is a Python process on the same two cores, so
this is Capella plus moto, not AWS.
"""

from __future__ import annotations

import time

from benchmarks.client import (
    QUEUE,
    messages_url,
    new_session,
    produce_concurrently,
    put_queue,
    queue_stats,
    text_batches,
    wait_sealed,
)
from benchmarks.read import PAGE, PAYLOAD, read_all
from benchmarks.result import BenchmarkFailed, Outcome, Row
from benchmarks.s3 import running_moto
from benchmarks.server import profiled, running_server
from benchmarks.settings import Settings
from benchmarks.tiers import BLOCK, put_handler, run_handler, tiered, write_config

BATCH = 1000
PRODUCERS = 2
HANDLER = "to-s3"


async def run(settings: Settings) -> Outcome:
    outcome = Outcome()
    total = settings.pick(100_000, 20_000)
    limit = settings.pick(180, 60)
    blocks = total // BLOCK
    data_dir = settings.data_dir("tiers-read-s3")
    log = settings.log_path("tiers-read-s3")
    async with running_moto(settings.log_path("tiers-read-s3-moto")) as moto:
        config = write_config(settings.work_dir / "tiers-read-s3.toml", moto)
        async with running_server(data_dir, log, config) as server, new_session() as session:
            await put_queue(session, server.url, QUEUE, tiered("s3"))
            bodies = text_batches(BATCH, PAYLOAD, count=8, seed=2)
            deadline = time.perf_counter() + limit
            sent = await produce_concurrently(
                messages_url(server.url, "mark"), bodies, BATCH, total, PRODUCERS, deadline
            )
            if sent != total:
                raise BenchmarkFailed(f"stored {sent:,} of {total:,} messages within {limit:g} s")
            await wait_sealed(session, server.url, blocks, limit)
            params = {"conditions": [{"mark": 1, "from_age": 0}], "limit": 1000, "interval": "1h"}
            body = {"type": "archive", "queues": [QUEUE], "params": params, "started": False}
            await put_handler(session, server.url, HANDLER, body)
            status = await run_handler(session, server.url, HANDLER, limit)
            by_mark = (await queue_stats(session, server.url))["blocks"]["by_mark"]
            if status["items"] != blocks or by_mark != {"1": blocks}:
                raise BenchmarkFailed(f"archived {status['items']} of {blocks} blocks; by mark {by_mark}")
        local = list((data_dir / "queues" / QUEUE / "blocks").glob("*.blk"))
        if local:
            raise BenchmarkFailed(f"{len(local)} block files still on the file mount after archiving")

        async with running_server(data_dir, log, config) as server:
            async with profiled(server, settings.profile_path("tiers-read-s3")):
                moto_cpu = moto.cpu_seconds()
                result = await read_all(server, total, limit)
                moto_cpu = moto.cpu_seconds() - moto_cpu
            result["moto_cpu_s"] = moto_cpu
            result["moto_cpu_pct"] = 100 * moto_cpu / result["seconds"]
            result["peak_rss_mb"] = server.peak_rss_mb()
    if result["timed_out"]:
        raise BenchmarkFailed(f"read {result['messages']:,} of {total:,} messages within {limit:g} s")
    outcome.details = {"messages": total, "blocks_in_s3": blocks, "archived_bytes": status["bytes"], **result}
    cpu = result["cpu"]
    note = (
        f"{result['seconds']:.2f} s for {total:,}; server CPU {cpu['server_cpu_pct']:.0f}%, "
        f"moto {result['moto_cpu_pct']:.0f}%, client {cpu['client_cpu_pct']:.0f}%"
    )
    outcome.rows.append(
        Row(
            "tiers-read-s3",
            f"from start, pages of {PAGE}, all blocks in S3",
            result["msgs_per_s"],
            "msg/s",
            note=note,
        )
    )
    print(f"  read from S3: {result['msgs_per_s']:,.0f} msg/s ({note})", flush=True)
    return outcome
