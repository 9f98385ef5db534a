"""Deduplication by ``(source, external_id)`` over a queue's whole retained history.

The common case costs one dict lookup: a source whose external ids only grow is new
whenever the id is above the highest one seen. Otherwise the recent (unsealed) blocks are
checked exactly, and sealed blocks through their summaries, so only blocks that may hold
the key have their exact keys loaded:

- a message produced here without an external id has the key ``(cluster name, its own id)``;
  such "own" keys are not put in the summary at all, because the block's id range already
  says exactly which block could hold them (and building a Bloom filter for every message
  would cost more than the rest of the write path);
- every other key goes into a per-source external-id range and a Bloom filter.
"""

from __future__ import annotations

import struct
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import orjson

from capella.core.log.bloom import BloomFilter, dedup_key
from capella.errors import CorruptData

_SUMMARY_MAGIC = b"CPS2"
_HEAD = struct.Struct("<4sQQI")


@dataclass(slots=True)
class BlockSummary:
    """What dedup needs to know about one sealed block without reading it."""

    first_id: int
    last_id: int
    own: str
    ranges: dict[str, tuple[int, int]]
    bloom: BloomFilter

    def may_hold(self, source: str, external_id: int, key: bytes) -> bool:
        if source == self.own and self.first_id <= external_id <= self.last_id:
            return True
        span = self.ranges.get(source)
        return span is not None and span[0] <= external_id <= span[1] and key in self.bloom

    def dump(self) -> bytes:
        head = orjson.dumps({"own": self.own, "ranges": {s: list(r) for s, r in self.ranges.items()}})
        return (
            _HEAD.pack(_SUMMARY_MAGIC, self.first_id, self.last_id, len(head)) + head + self.bloom.to_bytes()
        )

    @classmethod
    def load(cls, data: bytes) -> BlockSummary:
        try:
            magic, first_id, last_id, size = _HEAD.unpack_from(data)
            if magic != _SUMMARY_MAGIC:
                raise ValueError(f"bad magic {magic!r}")
            head = orjson.loads(data[_HEAD.size : _HEAD.size + size])
            bloom = BloomFilter.from_bytes(data[_HEAD.size + size :])
            ranges = {s: (int(r[0]), int(r[1])) for s, r in head["ranges"].items()}
            return cls(first_id, last_id, str(head["own"]), ranges, bloom)
        except (ValueError, struct.error, orjson.JSONDecodeError, TypeError, KeyError, IndexError) as exc:
            raise CorruptData(f"block summary is not valid: {exc}") from None

    @classmethod
    def build(cls, keys: Mapping[tuple[str, int], int], own: str) -> BlockSummary:
        """The summary of a block whose keys map to their ids (ids ascending)."""
        ids = keys.values()
        foreign = [(s, e) for (s, e), i in keys.items() if s != own or e != i]
        return cls.of_block(min(ids), max(ids), foreign, own)

    @classmethod
    def of_block(
        cls, first_id: int, last_id: int, foreign: Collection[tuple[str, int]], own: str
    ) -> BlockSummary:
        """The summary of the block of ids ``first_id``..``last_id`` whose identities other
        than ``(own, id)`` are ``foreign``."""
        bloom = BloomFilter(len(foreign))
        bloom.update(dedup_key(s, e) for s, e in foreign)
        ranges: dict[str, tuple[int, int]] = {}
        for source, ext in foreign:
            span = ranges.get(source)
            if span is None:
                ranges[source] = (ext, ext)
            elif ext < span[0]:
                ranges[source] = (ext, span[1])
            elif ext > span[1]:
                ranges[source] = (span[0], ext)
        return cls(first_id, last_id, own, ranges, bloom)


KeyLoader = Callable[[int], Awaitable[dict[tuple[str, int], int]]]


class RecentBlock(Protocol):
    """A block not sealed yet (``capella.core.log.writer.OpenBlock``), which dedup asks exactly."""

    def find(self, source: str, external_id: int) -> int | None: ...


class DedupIndex:
    """Answers "which id holds (source, external_id)?" for one queue."""

    def __init__(self, load_keys: KeyLoader) -> None:
        self._load_keys = load_keys
        self.highest: dict[str, int] = {}
        self.summaries: list[BlockSummary] = []
        self.recent: Sequence[RecentBlock] = []
        self.exact_lookups = 0

    def note(self, source: str, external_id: int) -> None:
        if external_id > self.highest.get(source, external_id - 1):
            self.highest[source] = external_id

    def add_summary(self, summary: BlockSummary) -> None:
        self.summaries.append(summary)
        self.summaries.sort(key=lambda s: s.first_id)
        self.note(summary.own, summary.last_id)
        for source, (_, hi) in summary.ranges.items():
            self.note(source, hi)

    def drop_summary(self, first_id: int) -> None:
        self.summaries = [s for s in self.summaries if s.first_id != first_id]

    async def find(self, source: str, external_id: int) -> int | None:
        highest = self.highest.get(source)
        if highest is None or external_id > highest:
            return None
        for block in self.recent:
            found = block.find(source, external_id)
            if found is not None:
                return found
        pair = (source, external_id)
        key = dedup_key(source, external_id)
        for summary in reversed(self.summaries):
            if summary.may_hold(source, external_id, key):
                self.exact_lookups += 1
                found = (await self._load_keys(summary.first_id)).get(pair)
                if found is not None:
                    return found
        return None
