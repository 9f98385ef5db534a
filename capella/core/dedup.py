"""Deduplication by ``(source, external_id)`` over a queue's whole retained history.

The common case costs one dict lookup: a source whose external ids only grow is new
whenever the id is above the highest one seen. Otherwise the recent (unsealed) blocks are
checked exactly, and sealed blocks through their summaries — a per-source id range and a
Bloom filter — so only blocks that may hold the key have their exact keys loaded.
"""

from __future__ import annotations

import struct
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

import orjson

from capella.core.bloom import BloomFilter, dedup_key
from capella.errors import CorruptData

_SUMMARY_MAGIC = b"CPS1"


@dataclass(slots=True)
class BlockSummary:
    """What dedup needs to know about one sealed block without reading it."""

    first_id: int
    ranges: dict[str, tuple[int, int]]
    bloom: BloomFilter

    def may_hold(self, source: str, external_id: int, key: bytes) -> bool:
        span = self.ranges.get(source)
        return span is not None and span[0] <= external_id <= span[1] and key in self.bloom

    def dump(self) -> bytes:
        ranges = orjson.dumps({s: list(r) for s, r in self.ranges.items()})
        return (
            _SUMMARY_MAGIC + struct.pack("<QI", self.first_id, len(ranges)) + ranges + self.bloom.to_bytes()
        )

    @classmethod
    def load(cls, data: bytes) -> BlockSummary:
        try:
            if data[:4] != _SUMMARY_MAGIC:
                raise ValueError("bad magic")
            first_id, size = struct.unpack_from("<QI", data, 4)
            ranges = orjson.loads(data[16 : 16 + size])
            bloom = BloomFilter.from_bytes(data[16 + size :])
            return cls(first_id, {s: (int(r[0]), int(r[1])) for s, r in ranges.items()}, bloom)
        except (ValueError, struct.error, orjson.JSONDecodeError, TypeError, IndexError) as exc:
            raise CorruptData(f"block summary is not valid: {exc}") from None

    @classmethod
    def build(cls, first_id: int, keys: Iterable[tuple[str, int]], count: int) -> BlockSummary:
        bloom = BloomFilter(max(count, 1))
        ranges: dict[str, tuple[int, int]] = {}
        for source, ext in keys:
            bloom.add(dedup_key(source, ext))
            span = ranges.get(source)
            if span is None:
                ranges[source] = (ext, ext)
            elif ext < span[0]:
                ranges[source] = (ext, span[1])
            elif ext > span[1]:
                ranges[source] = (span[0], ext)
        return cls(first_id, ranges, bloom)


KeyLoader = Callable[[int], Awaitable[dict[tuple[str, int], int]]]


class DedupIndex:
    """Answers "which id holds (source, external_id)?" for one queue."""

    def __init__(self, load_keys: KeyLoader) -> None:
        self._load_keys = load_keys
        self.highest: dict[str, int] = {}
        self.summaries: list[BlockSummary] = []
        self.recent: list[dict[tuple[str, int], int]] = []
        self.exact_lookups = 0

    def note(self, source: str, external_id: int) -> None:
        if external_id > self.highest.get(source, external_id - 1):
            self.highest[source] = external_id

    def add_summary(self, summary: BlockSummary) -> None:
        self.summaries.append(summary)
        self.summaries.sort(key=lambda s: s.first_id)
        for source, (_, hi) in summary.ranges.items():
            self.note(source, hi)

    def drop_summary(self, first_id: int) -> None:
        self.summaries = [s for s in self.summaries if s.first_id != first_id]

    async def find(self, source: str, external_id: int) -> int | None:
        highest = self.highest.get(source)
        if highest is None or external_id > highest:
            return None
        pair = (source, external_id)
        for keys in self.recent:
            found = keys.get(pair)
            if found is not None:
                return found
        key = dedup_key(source, external_id)
        for summary in reversed(self.summaries):
            if summary.may_hold(source, external_id, key):
                self.exact_lookups += 1
                found = (await self._load_keys(summary.first_id)).get(pair)
                if found is not None:
                    return found
        return None
