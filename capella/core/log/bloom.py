"""A Bloom filter over message keys, kept per sealed block so dedup can skip most blocks.

Hashing uses blake2b, never Python's ``hash()``, so a filter written by one process reads
the same in every other.
"""

from __future__ import annotations

import hashlib
import math
import struct
import zlib
from collections.abc import Iterable

from capella.errors import CorruptData

BLOOM_MAGIC = b"CPBF"
BLOOM_VERSION = 1
# magic, version, hash count, bit count, keys added; then the bits, then a CRC32 of all before.
_HEAD = struct.Struct("<4sHHQQ")
_CRC = struct.Struct("<I")
_KEY_ID = struct.Struct("<q")
_HALVES = struct.Struct("<QQ")
_U64_MASK = (1 << 64) - 1


def dedup_key(source: str, external_id: int) -> bytes:
    """The bytes that stand for a message's identity ``(source, external_id)``."""
    # The id has a fixed width, so the two parts can never run into each other.
    return _KEY_ID.pack(external_id) + source.encode()


class BloomFilter:
    """A set of byte keys that can answer "certainly not here" or "probably here"."""

    __slots__ = ("_bits", "_count", "_hashes", "_size")

    def __init__(self, expected: int, error_rate: float = 0.01) -> None:
        if not 0.0 < error_rate < 1.0:
            raise ValueError(f"error_rate must be between 0 and 1, not {error_rate}")
        expected = max(1, expected)
        size = math.ceil(-expected * math.log(error_rate) / math.log(2) ** 2)
        self._size = max(8, size)
        self._hashes = max(1, round(self._size / expected * math.log(2)))
        self._bits = bytearray((self._size + 7) // 8)
        self._count = 0

    @property
    def count(self) -> int:
        """How many keys were added (repeats included)."""
        return self._count

    @property
    def size(self) -> int:
        """The number of bits."""
        return self._size

    @property
    def hashes(self) -> int:
        """The number of bit positions each key sets."""
        return self._hashes

    def update(self, keys: Iterable[bytes]) -> None:
        """Add many keys; the loop is inlined because a sealed block adds thousands at once."""
        bits, size, hashes, blake2b, unpack = (
            self._bits,
            self._size,
            self._hashes,
            hashlib.blake2b,
            _HALVES.unpack,
        )
        count = 0
        for key in keys:
            first, second = unpack(blake2b(key, digest_size=16).digest())
            second |= 1
            for i in range(hashes):
                position = ((first + i * second) & _U64_MASK) % size
                bits[position >> 3] |= 1 << (position & 7)
            count += 1
        self._count += count

    def add(self, key: bytes) -> None:
        bits = self._bits
        for position in self._positions(key):
            bits[position >> 3] |= 1 << (position & 7)
        self._count += 1

    def __contains__(self, key: bytes) -> bool:
        bits = self._bits
        return all(bits[position >> 3] & (1 << (position & 7)) for position in self._positions(key))

    def _positions(self, key: bytes) -> list[int]:
        # Double hashing (Kirsch-Mitzenmacher): two independent 64-bit hashes give all k.
        first, second = _HALVES.unpack(hashlib.blake2b(key, digest_size=16).digest())
        second |= 1  # an even step could cycle through only part of the bits
        size = self._size
        return [((first + i * second) & _U64_MASK) % size for i in range(self._hashes)]

    def to_bytes(self) -> bytes:
        body = _HEAD.pack(BLOOM_MAGIC, BLOOM_VERSION, self._hashes, self._size, self._count) + self._bits
        return body + _CRC.pack(zlib.crc32(body))

    @classmethod
    def from_bytes(cls, data: bytes) -> BloomFilter:
        """A filter written by ``to_bytes``; ``CorruptData`` if the bytes are not one."""
        if len(data) < _HEAD.size + _CRC.size:
            raise CorruptData(f"bloom filter: {len(data)} bytes is too short")
        magic, version, hashes, size, count = _HEAD.unpack_from(data)
        if magic != BLOOM_MAGIC:
            raise CorruptData(f"bloom filter: bad magic {magic!r}")
        expected = _HEAD.size + (size + 7) // 8 + _CRC.size
        if len(data) != expected:
            raise CorruptData(f"bloom filter: {len(data)} bytes, header says {expected}")
        (crc,) = _CRC.unpack_from(data, len(data) - _CRC.size)
        if crc != zlib.crc32(memoryview(data)[: -_CRC.size]):
            raise CorruptData("bloom filter: checksum mismatch")
        if version != BLOOM_VERSION:
            raise CorruptData(f"bloom filter: unsupported format version {version}")
        if not size or not hashes:
            raise CorruptData("bloom filter: zero bits or zero hashes")
        bloom = cls.__new__(cls)
        bloom._size = size
        bloom._hashes = hashes
        bloom._count = count
        bloom._bits = bytearray(data[_HEAD.size : _HEAD.size + (size + 7) // 8])
        return bloom
