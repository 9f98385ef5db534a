"""Chunk files of a schedule: immutable files of delayed messages, each with a small index.

``<prefix>/chunks/<n>.sch`` holds up to ``CHUNK_ITEMS`` items (``capella.core.delayed.schedule``)
framed one after the other behind a header with their count and CRC. ``<n>.idx`` holds what
the schedule keeps in memory instead of the items: their sorted schedule ids and the sorted
identity hashes of those with an external id (16 bytes an item), with its own CRC. A chunk
is never changed; items deleted since it was written are listed in the schedule's snapshot.
"""

from __future__ import annotations

import bisect
import struct
import zlib
from array import array
from collections.abc import Container
from dataclasses import dataclass, field

from capella.core.delayed.item import DelayedMessage, decode_item, encode_item, identity_hash
from capella.core.journal.changelog import frame, unframe
from capella.errors import CorruptData, KeyNotFound
from capella.storage import Storage, keys

_CHUNK_HEAD = struct.Struct("<4sII")
_CHUNK_MAGIC = b"CPSC"
_INDEX_MAGIC = b"CPSI"
_CRC = struct.Struct("<I")


@dataclass(slots=True)
class Chunk:
    """An immutable file of delayed messages, and what is known about it without reading it."""

    number: int
    count: int
    min_due: float
    max_due: float
    sids: array[int]  # sorted
    hashes: array[int]  # identity hashes of the items with an external id, sorted
    deleted: set[int] = field(default_factory=set)
    loaded: bool = False  # every live item is in memory

    @property
    def live(self) -> int:
        return self.count - len(self.deleted)

    def holds(self, sid: int) -> bool:
        i = bisect.bisect_left(self.sids, sid)
        return i < len(self.sids) and self.sids[i] == sid and sid not in self.deleted

    def may_hold(self, identity_hash: int) -> bool:
        i = bisect.bisect_left(self.hashes, identity_hash)
        return i < len(self.hashes) and self.hashes[i] == identity_hash


class ChunkFiles:
    """The chunk files of one schedule."""

    def __init__(self, storage: Storage, prefix: str) -> None:
        self._storage = storage
        self._prefix = prefix

    def _key(self, number: int, ext: str) -> str:
        return keys.chunk(self._prefix, number, ext)

    async def write(self, number: int, items: list[DelayedMessage]) -> Chunk:
        body = b"".join(frame(encode_item(i)) for i in items)
        head = _CHUNK_HEAD.pack(_CHUNK_MAGIC, len(items), zlib.crc32(body))
        sids = array("q", sorted(i.sid for i in items))
        hashes = array("q", sorted(identity_hash(*i.identity) for i in items if i.external_id is not None))
        index = b"".join(
            (
                _CHUNK_HEAD.pack(_INDEX_MAGIC, len(sids), len(hashes)),
                sids.tobytes(),
                hashes.tobytes(),
            )
        )
        await self._storage.put(self._key(number, "sch"), head + body)
        await self._storage.put(self._key(number, "idx"), index + _CRC.pack(zlib.crc32(index)))
        dues = [i.due for i in items]
        return Chunk(number, len(items), min(dues, default=0.0), max(dues, default=0.0), sids, hashes)

    async def read(self, chunk: Chunk) -> list[DelayedMessage]:
        """Every item in the file, deleted ones too (``chunk.deleted`` says which)."""
        try:
            data = await self._storage.get(self._key(chunk.number, "sch"))
        except KeyNotFound:
            raise CorruptData(f"{self._prefix}: chunk {chunk.number} is missing") from None
        if len(data) < _CHUNK_HEAD.size:
            raise CorruptData(f"{self._prefix}: chunk {chunk.number} is shorter than its header")
        magic, count, crc = _CHUNK_HEAD.unpack_from(data)
        body = data[_CHUNK_HEAD.size :]
        if magic != _CHUNK_MAGIC or zlib.crc32(body) != crc:
            raise CorruptData(f"{self._prefix}: chunk {chunk.number} failed its checksum")
        records, _ = unframe(body)
        if len(records) != count:
            raise CorruptData(f"{self._prefix}: chunk {chunk.number} holds {len(records)} of {count} items")
        return [decode_item(r, 0, chunk.number) for r in records]

    async def read_index(self, number: int) -> tuple[array[int], array[int]]:
        try:
            data = await self._storage.get(self._key(number, "idx"))
        except KeyNotFound:
            raise CorruptData(f"{self._prefix}: index of chunk {number} is missing") from None
        if (
            len(data) < _CHUNK_HEAD.size + 4
            or zlib.crc32(data[:-4]) != _CRC.unpack_from(data, len(data) - 4)[0]
        ):
            raise CorruptData(f"{self._prefix}: index of chunk {number} failed its checksum")
        magic, n_sids, n_hashes = _CHUNK_HEAD.unpack_from(data)
        if magic != _INDEX_MAGIC:
            raise CorruptData(f"{self._prefix}: index of chunk {number} has a bad magic")
        sids, hashes = array("q"), array("q")
        start = _CHUNK_HEAD.size
        sids.frombytes(data[start : start + 8 * n_sids])
        hashes.frombytes(data[start + 8 * n_sids : start + 8 * (n_sids + n_hashes)])
        return sids, hashes

    async def delete(self, number: int) -> None:
        await self._storage.delete(self._key(number, "sch"))
        await self._storage.delete(self._key(number, "idx"))

    async def delete_unknown(self, known: Container[int]) -> None:
        """Delete the files of chunks not in ``known``."""
        for key in await self._storage.list(keys.within(self._prefix, keys.CHUNKS)):
            number = keys.number_of(key)
            if number is not None and number not in known:
                await self._storage.delete(key)
