"""Archive throughput (MB/s of block data moved) to a zstd file tier and to S3 (moto).

Two queues on one server get 500,000 order-like JSON documents of ~256 bytes each
(``--quick``: 50,000; ``save=mark``, batches of 1000, 2 producers): ``to-z3`` maps mark 1 to
the ``z3`` mount (``file``, zstd level 3), ``to-s3`` to the ``s3`` mount (moto on loopback).
Once their blocks are sealed, a stopped archive handler per queue (condition
``{"mark": 1, "from_age": 0}``, ``limit`` 1000) is run once with ``POST .../run``: the rate
is the handler's ``bytes`` (uncompressed block bytes copied) over the time to the answer.

moto keeps objects in its own Python process, so the S3 figure is Capella plus moto on the
same two cores, not AWS. The compression ratio per zstd level is measured separately, with
the zstandard library on one sealed block file of ``to-z3`` copied before it was moved.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import zstandard

from benchmarks.client import (
    messages_url,
    new_session,
    produce_concurrently,
    put_queue,
    queue_stats,
    wait_sealed,
)
from benchmarks.meter import Meter
from benchmarks.result import BenchmarkFailed, Outcome, Row
from benchmarks.s3 import MotoServer, running_moto
from benchmarks.server import Server, profiled, running_server
from benchmarks.settings import Settings
from benchmarks.tiers import BLOCK, json_batches, put_handler, run_handler, tiered, write_config

BATCH = 1000
PRODUCERS = 2
LEVELS = (1, 3, 9, 19)
TARGETS = ("z3", "s3")


async def run(settings: Settings) -> Outcome:
    outcome = Outcome()
    total = settings.pick(500_000, 50_000)
    limit = settings.pick(300, 90)
    bodies = json_batches(BATCH, count=20)
    data_dir = settings.data_dir("tiers-archive")
    async with running_moto(settings.log_path("tiers-archive-moto")) as moto:
        config = write_config(settings.work_dir / "tiers-archive.toml", moto)
        async with running_server(data_dir, settings.log_path("tiers-archive"), config) as server:
            async with new_session() as session:
                seeded = time.perf_counter()
                for target in TARGETS:
                    queue = f"to-{target}"
                    await put_queue(session, server.url, queue, tiered(target))
                    url = messages_url(server.url, "mark", queue)
                    deadline = time.perf_counter() + limit
                    sent = await produce_concurrently(url, bodies, BATCH, total, PRODUCERS, deadline)
                    if sent != total:
                        raise BenchmarkFailed(
                            f"{queue}: stored {sent:,} of {total:,} messages within {limit:g} s"
                        )
                    await wait_sealed(session, server.url, total // BLOCK, limit, queue)
                outcome.details["seed_s"] = time.perf_counter() - seeded
                sample = sealed_block(data_dir / "queues" / "to-z3" / "blocks")
                for target in TARGETS:
                    result = await archive(settings, server, moto, session, target, total // BLOCK, limit)
                    outcome.details[f"file -> {target}"] = result
            outcome.details["peak_rss_mb"] = server.peak_rss_mb()
        outcome.details["s3_objects"], outcome.details["s3_bytes"] = await asyncio.to_thread(moto.objects)
    z3_files = sum(p.stat().st_size for p in (data_dir / "z3" / "to-z3" / "blocks").glob("*.blk"))
    moved = outcome.details["file -> z3"]["bytes"]
    outcome.details["z3_mount_ratio"] = moved / z3_files
    outcome.details["compression"] = await asyncio.to_thread(compression_table, sample)
    outcome.details["payload"] = f"{total:,} order-like JSON documents of ~256 bytes per queue"

    for target, label in (("z3", "file → file+zstd 3"), ("s3", "file → s3 (moto)")):
        r = outcome.details[f"file -> {target}"]
        note = f"{r['blocks']} blocks in {r['seconds']:.1f} s, server CPU {r['cpu']['server_cpu_pct']:.0f}%"
        if target == "s3":
            note += f", moto CPU {r['moto_cpu_pct']:.0f}%"
        outcome.rows.append(Row("tiers-archive", f"archive {label}", r["mb_per_s"], "MB/s", note=note))
        print(f"  archive {label}: {r['mb_per_s']:.1f} MB/s ({note})", flush=True)
    for level, c in outcome.details["compression"]["levels"].items():
        note = f"compress {c['compress_mb_per_s']:.0f} MB/s, decompress {c['decompress_mb_per_s']:.0f} MB/s"
        outcome.rows.append(
            Row("tiers-archive", f"zstd level {level} ratio, JSON block", c["ratio"], "x", note=note)
        )
    print(
        "  zstd ratio "
        + ", ".join(f"L{lv} {c['ratio']:.2f}x" for lv, c in outcome.details["compression"]["levels"].items())
        + f"; z3 mount on disk {outcome.details['z3_mount_ratio']:.2f}x",
        flush=True,
    )
    return outcome


async def archive(
    settings: Settings,
    server: Server,
    moto: MotoServer,
    session: aiohttp.ClientSession,
    target: str,
    blocks: int,
    limit: float,
) -> dict[str, Any]:
    """Run one archive pass of ``to-{target}`` and time it."""
    queue, name = f"to-{target}", f"archive-{target}"
    params = {"conditions": [{"mark": 1, "from_age": 0}], "limit": 1000, "interval": "1h"}
    await put_handler(
        session, server.url, name, {"type": "archive", "queues": [queue], "params": params, "started": False}
    )
    meter = Meter(server)
    async with profiled(server, settings.profile_path(f"tiers-archive-{target}")):
        moto_cpu = moto.cpu_seconds()
        meter.start()
        status = await run_handler(session, server.url, name, limit)
        meter.stop()
        moto_cpu = moto.cpu_seconds() - moto_cpu
    by_mark = (await queue_stats(session, server.url, queue))["blocks"]["by_mark"]
    if status["items"] != blocks or by_mark != {"1": blocks}:
        raise BenchmarkFailed(f"{name}: moved {status['items']} of {blocks} blocks; by mark {by_mark}")
    return {
        "blocks": status["items"],
        "bytes": status["bytes"],
        "seconds": meter.wall,
        "mb_per_s": status["bytes"] / meter.wall / 1e6,
        "cpu": meter.to_dict(),
        "moto_cpu_s": moto_cpu,
        "moto_cpu_pct": 100 * moto_cpu / meter.wall,
    }


def sealed_block(folder: Path) -> bytes:
    """The bytes of the first sealed block file in ``folder`` (a ``file`` mount's blocks)."""
    files = sorted(folder.glob("*.blk"))
    if not files:
        raise BenchmarkFailed(f"no sealed block file in {folder}")
    return files[0].read_bytes()


def compression_table(block: bytes) -> dict[str, Any]:
    """Ratio (block bytes / compressed bytes) and one-thread speed of each level in ``LEVELS``."""
    levels = {}
    for level in LEVELS:
        started = time.perf_counter()
        packed = zstandard.ZstdCompressor(level=level).compress(block)
        compress_s = time.perf_counter() - started
        started = time.perf_counter()
        if zstandard.ZstdDecompressor().decompress(packed) != block:
            raise BenchmarkFailed(f"zstd level {level} did not round-trip")
        decompress_s = time.perf_counter() - started
        levels[str(level)] = {
            "ratio": len(block) / len(packed),
            "compressed_bytes": len(packed),
            "compress_mb_per_s": len(block) / compress_s / 1e6,
            "decompress_mb_per_s": len(block) / decompress_s / 1e6,
        }
    return {"block_bytes": len(block), "levels": levels}
