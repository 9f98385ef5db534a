"""What the storage-tier scenarios share: a config with tiered mounts, handlers, JSON payloads.

The config has three mounts: ``default`` (a ``file`` directory, which holds metadata,
journals and new blocks), ``z3`` (a ``file`` directory with zstd level 3) and, when a moto
server is given, ``s3`` (its bucket). A queue maps marks to them; an archive handler moves
its sealed blocks from mark 0 to mark 1.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from benchmarks.result import BenchmarkFailed
from benchmarks.s3 import MotoServer

BLOCK = 10_000  # the default block limit (block.max_messages)
_WORDS = ["shipped", "pending", "paid", "refunded", "cancelled", "packed", "returned"]
_NOTE_TEXT = (
    "leave at door ring twice fragile gift wrap no invoice call before delivery back entrance "
    "second floor office hours only weekend ok express urgent customer requested change of address"
)
_CITIES = ["Lyon", "Porto", "Gdansk", "Leeds", "Bremen", "Turin", "Ghent", "Malmo"]


def write_config(path: Path, moto: MotoServer | None = None) -> Path:
    """A TOML file for ``capella serve --config``; ``--data-dir`` sets where the files go."""
    text = (
        '[cluster]\nname = "bench"\n\n'
        '[mounts.default]\nprovider = "file"\npath = "queues"\n\n'
        '[mounts.z3]\nprovider = "file"\npath = "z3"\ncompression = "zstd"\nlevel = 3\n\n'
    )
    if moto is not None:
        text += moto.mount_toml("s3")
    path.write_text(text)
    return path


def tiered(mark1: str) -> dict[str, Any]:
    """A queue definition: metadata and new blocks on ``default``, mark 1 on ``mark1``."""
    return {"mounts": {"meta": "default", "marks": {"0": "default", "1": mark1}}}


def json_batches(batch: int, count: int, seed: int = 3) -> list[bytes]:
    """``count`` bodies of ``batch`` distinct order-like JSON documents (~256 bytes) in ``data``."""
    rng = random.Random(seed)
    bodies = []
    for b in range(count):
        messages = [{"data": _order(rng, b * batch + i)} for i in range(batch)]
        bodies.append(orjson.dumps({"messages": messages}))
    return bodies


def _order(rng: random.Random, n: int) -> str:
    items = [
        {
            "sku": f"SKU-{rng.randrange(100_000):05d}",
            "qty": rng.randrange(1, 5),
            "price": rng.randrange(99, 9999) / 100,
        }
        for _ in range(rng.randrange(1, 3))
    ]
    doc: dict[str, Any] = {
        "order_id": 7_000_000 + n,
        "customer": f"cust-{rng.randrange(50_000):05d}",
        "status": rng.choice(_WORDS),
        "ts": f"2026-11-{rng.randrange(1, 29):02d}T{rng.randrange(24):02d}:{rng.randrange(60):02d}:"
        f"{rng.randrange(60):02d}.{rng.randrange(1000):03d}Z",
        "city": rng.choice(_CITIES),
        "currency": "EUR",
        "items": items,
        "note": "",
    }
    # A free-text note of words brings each document to about 256 bytes (no padding, which
    # would compress far better than real data).
    size = len(orjson.dumps(doc))
    words: list[str] = []
    vocabulary = _NOTE_TEXT.split()
    goal = 240 + rng.randrange(32)
    while size + sum(len(w) + 1 for w in words) < goal:
        words.append(rng.choice(vocabulary))
    doc["note"] = " ".join(words)
    return orjson.dumps(doc).decode()


async def put_handler(session: aiohttp.ClientSession, base: str, name: str, body: dict[str, Any]) -> None:
    async with session.put(f"{base}/v1/handlers/{name}", json=body) as resp:
        if resp.status not in (200, 201):
            raise BenchmarkFailed(f"PUT handler {name}: HTTP {resp.status}: {await resp.text()}")


async def handler_status(session: aiohttp.ClientSession, base: str, name: str) -> dict[str, Any]:
    async with session.get(f"{base}/v1/handlers/{name}") as resp:
        if resp.status != 200:
            raise BenchmarkFailed(f"GET handler {name}: HTTP {resp.status}: {await resp.text()}")
        status: dict[str, Any] = (await resp.json())["status"]
        return status


async def run_handler(session: aiohttp.ClientSession, base: str, name: str, within: float) -> dict[str, Any]:
    """One pass now (at most ``within`` seconds); its status, or ``BenchmarkFailed`` if it failed."""
    timeout = aiohttp.ClientTimeout(total=within)
    async with session.post(f"{base}/v1/handlers/{name}/run", timeout=timeout) as resp:
        if resp.status != 200:
            raise BenchmarkFailed(f"run handler {name}: HTTP {resp.status}: {await resp.text()}")
        status: dict[str, Any] = (await resp.json())["status"]
    if status["last_error"] is not None:
        raise BenchmarkFailed(f"handler {name}: the pass failed: {status['last_error']}")
    return status
