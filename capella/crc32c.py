"""CRC-32C (Castagnoli) in pure Python: what ``capella.kernels.crc32c`` is where the C kernels are not built.

Kafka's record batches (v2) carry it (``capella/kafka/records.py``). It runs like
``zlib.crc32``: ``crc32c(b, crc32c(a)) == crc32c(a + b)``. Four bytes a step through two
tables of 65,536 entries (512 KiB as arrays, made when this module is imported, which only a
process without the kernels does): ~14 MB/s, against ~9 for a byte at a time and ~6.5 for
kafka-python's ``kafka.record._crc32c``; the C kernel is a hundred to a thousand times that.
"""

from __future__ import annotations

import struct
from array import array

_POLY = 0x82F63B78  # the Castagnoli polynomial, bit-reflected


def _tables() -> tuple[tuple[int, ...], array[int], array[int]]:
    """The byte table, and the two 16-bit tables of a four-byte step (low half, high half)."""
    byte = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ _POLY if c & 1 else c >> 1
        byte.append(c)
    # shifted[k][b]: the state after byte b and k zero bytes.
    shifted = [byte]
    for _ in range(3):
        last = shifted[-1]
        shifted.append([(c >> 8) ^ byte[c & 0xFF] for c in last])
    t0, t1, t2, t3 = shifted
    high = array("I", [t1[x & 0xFF] ^ t0[x >> 8] for x in range(65536)])
    low = array("I", [t3[x & 0xFF] ^ t2[x >> 8] for x in range(65536)])
    return tuple(byte), low, high


_BYTE, _LOW, _HIGH = _tables()
_WORD = struct.Struct("<I")


def crc32c(data: bytes | bytearray | memoryview, value: int = 0, /) -> int:
    """The CRC-32C of ``data``, continuing from ``value`` (the CRC of what came before)."""
    crc = (value & 0xFFFFFFFF) ^ 0xFFFFFFFF
    view = memoryview(data).cast("B")
    whole = len(view) & ~3
    low, high, byte = _LOW, _HIGH, _BYTE
    for (word,) in _WORD.iter_unpack(view[:whole]):
        word ^= crc
        crc = low[word & 0xFFFF] ^ high[word >> 16]
    for b in view[whole:]:
        crc = byte[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF
