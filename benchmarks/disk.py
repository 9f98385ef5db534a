"""Bytes on disk per message: 256 random bytes each (``data_b64``), sealed blocks, clean stop.

Random payloads do not compress, so this measures the format's own overhead. The queue has
the default block limits (10,000 messages a block); the count is a multiple of that, so every
message ends up in a sealed block before the server is stopped with SIGTERM. Everything
under the data directory counts: blocks, summaries, manifest, state and registry.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from benchmarks.client import (
    binary_batches,
    messages_url,
    new_session,
    produce_sequentially,
    put_queue,
    wait_sealed,
)
from benchmarks.result import BenchmarkFailed, Outcome, Row
from benchmarks.server import running_server
from benchmarks.settings import Settings

PAYLOAD = 256
BATCH = 1000
BLOCK = 10_000
TARGET = 293.0


async def run(settings: Settings) -> Outcome:
    outcome = Outcome()
    total = settings.pick(100_000, 20_000)
    limit = settings.pick(120, 40)
    data_dir = settings.data_dir("disk")
    # Distinct random bodies for every request: repeats would let a block compress.
    bodies = binary_batches(BATCH, PAYLOAD, count=total // BATCH)
    async with running_server(data_dir, settings.log_path("disk")) as server:
        async with new_session() as session:
            await put_queue(session, server.url)
            sent = await produce_sequentially(
                session,
                messages_url(server.url, "wait"),
                bodies,
                BATCH,
                len(bodies),
                time.perf_counter() + limit,
            )
            if sent != total:
                raise BenchmarkFailed(f"stored {sent} of {total} messages within {limit:g} s")
            await wait_sealed(session, server.url, total // BLOCK, limit)
        await server.stop()
        if server.exit_code != 0:
            raise BenchmarkFailed(f"server exited with {server.exit_code} on SIGTERM:\n{server.log_tail()}")
    files = sizes(data_dir)
    on_disk = sum(files.values())
    blocks = sum(size for path, size in files.items() if path.suffix == ".blk")
    per_message = on_disk / total
    outcome.details = {
        "messages": total,
        "payload": f"{PAYLOAD} bytes from os.urandom, sent as data_b64",
        "bytes_total": on_disk,
        "bytes_in_blocks": blocks,
        "files": len(files),
        "largest": {
            str(p.relative_to(data_dir)): s for p, s in sorted(files.items(), key=lambda i: -i[1])[:5]
        },
    }
    outcome.rows.append(
        Row(
            "disk",
            f"bytes per message ({PAYLOAD} B random payload)",
            per_message,
            "B",
            TARGET,
            False,
            note=f"{blocks / total:.1f} B/msg in .blk files, {len(files)} files",
        )
    )
    print(f"  disk: {per_message:.1f} bytes/message over {total:,} messages", flush=True)
    return outcome


def sizes(root: Path) -> dict[Path, int]:
    """Apparent size of every file under ``root``."""
    found = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = Path(folder, name)
            found[path] = path.stat().st_size
    return found
