"""The stats document of one queue, put together from its parts when someone asks.

The API answers it with the queue (``api/queues.py``); ``capella.metrics`` reads gauges from it.
"""

from __future__ import annotations

import bisect
from typing import Any

from capella.core.delayed.schedule import Schedule
from capella.core.log.blocks import BlockStore
from capella.core.log.writer import Writer


def queue_stats(
    store: BlockStore, writer: Writer, schedule: Schedule, *, first_id: int, subscriptions: int
) -> dict[str, Any]:
    in_memory = writer.in_memory()
    all_sealed = store.sealed
    sealed = [b for b in all_sealed if b.state == "sealed"]
    by_mark: dict[str, int] = {}
    for b in sealed:
        by_mark[str(b.mark)] = by_mark.get(str(b.mark), 0) + 1
    if in_memory:
        by_mark["0"] = by_mark.get("0", 0) + len(in_memory)
    count = sum(b.count for b in sealed) + sum(len(b.ids) for b in in_memory)
    size = sum(b.bytes for b in sealed) + sum(b.size for b in in_memory)
    open_block = writer.open_block
    return {
        "first_id": first_id,
        "last_id": writer.last_id,
        "messages": count,
        "bytes": size,
        "blocks": {
            "total": len(sealed) + len(in_memory),
            "by_mark": by_mark,
            "by_state": {
                "open": 1 if open_block is not None and open_block.ids else 0,
                "sealing": len(writer.sealing),
                "sealed": len(sealed),
                "loaded": len(store.loaded),
                "quarantined": len(all_sealed) - len(sealed),
            },
        },
        "subscriptions": subscriptions,
        "scheduled": {
            "count": schedule.count,
            "in_memory": schedule.in_memory,
            "chunks": schedule.chunk_count,
            "next_due": schedule.next_due(),
        },
        "recovery": store.recovery.to_dict(),
        "writable": not writer.faults,
        "faults": [
            {"step": step, "error": message, "since": since}
            for step, (message, since) in sorted(writer.faults.items())
        ],
        "last_error": writer.last_error,
    }


def block_list(store: BlockStore, writer: Writer, after: int, limit: int) -> list[dict[str, Any]]:
    """The queue's blocks in id order whose ids go past ``after``, at most ``limit``: sealed
    (or quarantined) ones with their mark, then those still in memory (``sealing``, ``open``)."""
    found: list[dict[str, Any]] = []
    start = max(0, bisect.bisect_right(store.firsts, after) - 1)
    for meta in store.sealed[start:]:
        if len(found) >= limit:
            return found
        if meta.last_id > after:
            found.append(
                {
                    "first_id": meta.first_id,
                    "last_id": meta.last_id,
                    "count": meta.count,
                    "bytes": meta.bytes,
                    "mark": meta.mark,
                    "state": meta.state,
                    "loaded": meta.first_id in store.loaded,
                    "sealed": meta.sealed,
                }
            )
    for block in writer.in_memory():
        if len(found) >= limit:
            break
        if block.ids and block.ids[-1] > after:
            found.append(
                {
                    "first_id": block.ids[0],
                    "last_id": block.ids[-1],
                    "count": len(block.ids),
                    "bytes": block.size,
                    "mark": 0,
                    "state": "open" if block is writer.open_block else "sealing",
                    "loaded": True,
                    "sealed": None,
                }
            )
    return found
