"""The shared object (``.cpo``): one node's flush, the record batches of every shared queue it buffered.

A node gathers the batches produced to all shared queues for one window, PUTs them as one
object under ``object_key``, then one PostgreSQL transaction gives them their ids and records
where each lies (its segment rows). The object is self-describing, so a verifier or a
disaster-recovery scan can read it without PostgreSQL (``read_index``, ``verify``). Everything
here is a pure function of bytes: no I/O, no event loop, no clock (``now`` is passed in).

Key::

    shared/<yyyy>/<mm>/<dd>/<node>/<ulid>.cpo

The date is the UTC day of the ULID's time. A ULID is 128 bits, written as 26 characters of
Crockford base32 (``0-9A-Z`` without ``I L O U``): a 48-bit UNIX time in milliseconds, then 80
random bits (``os.urandom``; injectable for tests). Keys of one node therefore sort by time,
and ``key_time`` reads the time back, so the janitor can tell an old unreferenced object from
one whose commit may still be in flight without a HEAD request.

Layout (all integers little-endian)::

    batches (B bytes) | index (I bytes) | tail (12 bytes)

Batches: the record batches (docs/format.md, "Record batch") back to back, byte for byte as
the node buffered them (base id 0, stamped by the reader), grouped by queue: queues in order
of their first batch, and a queue's batches in the order given. One queue's batches are
therefore one contiguous range, which a reader fetches with one ranged GET.

Index (``I`` bytes):

| offset | size | field |
|---|---|---|
| 0 | 2 | format version, u16: 1 |
| 2 | 2 | queue count ``q``, u16 |
| 4 | 4 | batch count ``k``, u32 |
| 8 | | ``q`` times: u16 length and the queue's name in UTF-8, in object order |
| | 18·``k`` | ``k`` entries, one per batch in object order (below) |

Entry (18 bytes):

| offset | size | field |
|---|---|---|
| 0 | 2 | queue, u16: an index into the names |
| 2 | 8 | the batch's byte offset in the object, u64 |
| 10 | 4 | its byte size, u32 |
| 14 | 4 | its message count, u32 (from its head) |

Tail (12 bytes): the index length ``I`` (u32), the CRC-32 of the index (u32, zlib's
polynomial, ``capella.kernels.crc32``, as every Capella format), the magic ``CPO1``.

Checks on read (``read_index``; any failure is ``CorruptData``): the magic; ``I`` fits in
the object; the index CRC; the version; every name is UTF-8, non-empty and unique; every
entry names a queue, starts where the one before ended (the first at 0), holds at least a
record batch head and 1 to 2**24 messages; the entries fill the batches exactly, and the index
holds nothing after them. The batches carry their own two CRCs each, which ``verify`` checks
too. ``build`` reads only each batch's head (its length, version and count): the node checked
the batch's checksums when it accepted it.

Overhead: 12 bytes per object, 8 plus the names per index, 18 per batch.
"""

from __future__ import annotations

import math
import os
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass

from capella.errors import CorruptData, InvalidRequest
from capella.kernels import crc32
from capella.records import record_batch

VERSION = 1
MAGIC = b"CPO1"
SUFFIX = ".cpo"
PREFIX = "shared/"

_INDEX_HEAD = struct.Struct("<HHI")
_ENTRY = struct.Struct("<HQII")
_NAME_LENGTH = struct.Struct("<H")
TAIL = struct.Struct("<II4s")
MAX_QUEUES = 0xFFFF
_MAX_SIZE = 0xFFFFFFFF

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_CROCKFORD_VALUE = {c: i for i, c in enumerate(_CROCKFORD)}
_ULID_LENGTH = 26
_RANDOM_BYTES = 10
_MAX_MS = (1 << 48) - 1


@dataclass(frozen=True, slots=True)
class Placed:
    """Where one batch lies in an object: its queue, byte offset and size, and message count."""

    queue: str
    offset: int
    size: int
    count: int


# --- keys --------------------------------------------------------------------------------


def object_key(node: str, now: float, rand: bytes | None = None) -> str:
    """The key of an object ``node`` writes at ``now`` (UNIX seconds); ``rand``: 10 random bytes."""
    if not node or "/" in node or node in (".", ".."):
        raise InvalidRequest(f"shared object key: bad node name {node!r}")
    ms = round(now * 1000) if math.isfinite(now) else -1
    if not 0 <= ms <= _MAX_MS:
        raise InvalidRequest(f"shared object key: time {now!r} is outside what a ULID holds")
    rand = os.urandom(_RANDOM_BYTES) if rand is None else rand
    if len(rand) != _RANDOM_BYTES:
        raise InvalidRequest(f"shared object key: {len(rand)} random bytes, not {_RANDOM_BYTES}")
    day = time.gmtime(ms // 1000)
    return f"{PREFIX}{day.tm_year:04d}/{day.tm_mon:02d}/{day.tm_mday:02d}/{node}/{_ulid(ms, rand)}{SUFFIX}"


def key_time(key: str) -> float | None:
    """The time (UNIX seconds, to the millisecond) in an object's key; None if ``key`` is not one.

    A key is one only if it has the whole shape, and its date is its ULID's.
    """
    parts = key.split("/")
    if len(parts) != 6 or f"{parts[0]}/" != PREFIX or not parts[5].endswith(SUFFIX):
        return None
    text = parts[5][: -len(SUFFIX)]
    if len(text) != _ULID_LENGTH or not parts[4] or text[0] > "7":  # 130 bits written, 128 held
        return None
    value = 0
    for char in text:
        digit = _CROCKFORD_VALUE.get(char)
        if digit is None:
            return None
        value = value << 5 | digit
    ms = value >> 80
    day = time.gmtime(ms // 1000)
    if parts[1:4] != [f"{day.tm_year:04d}", f"{day.tm_mon:02d}", f"{day.tm_mday:02d}"]:
        return None
    return ms / 1000


def _ulid(ms: int, rand: bytes) -> str:
    value = ms << 80 | int.from_bytes(rand, "big")
    return "".join(_CROCKFORD[(value >> shift) & 31] for shift in range(125, -1, -5))


# --- writing -----------------------------------------------------------------------------


def build(batches: Sequence[tuple[str, bytes]]) -> tuple[bytes, list[Placed]]:
    """The object holding ``(queue, record batch)`` pairs, grouped by queue, and where each batch went.

    Queues keep the order of their first batch, and a queue's batches their order among
    themselves. ``CorruptData`` if a batch's head does not say it is one whole record batch;
    ``InvalidRequest`` for more than 65,535 queues or an empty or too long queue name.
    """
    groups: dict[str, list[bytes]] = {}
    for queue, data in batches:
        groups.setdefault(queue, []).append(data)
    if len(groups) > MAX_QUEUES:
        raise InvalidRequest(f"shared object: {len(groups)} queues in one object; at most {MAX_QUEUES}")
    names: list[bytes] = []
    for queue in groups:
        name = queue.encode()
        if not 0 < len(name) <= 0xFFFF:
            raise InvalidRequest(f"shared object: bad queue name {queue!r}")
        names.append(_NAME_LENGTH.pack(len(name)) + name)
    placed: list[Placed] = []
    entries: list[bytes] = []
    parts: list[bytes] = []
    offset = 0
    for index, (queue, datas) in enumerate(groups.items()):
        for data in datas:
            count = _count(queue, data)
            placed.append(Placed(queue, offset, len(data), count))
            entries.append(_ENTRY.pack(index, offset, len(data), count))
            parts.append(data)
            offset += len(data)
    footer = b"".join([_INDEX_HEAD.pack(VERSION, len(groups), len(placed)), *names, *entries])
    parts += [footer, TAIL.pack(len(footer), crc32(footer), MAGIC)]
    return b"".join(parts), placed


def _count(queue: str, data: bytes) -> int:
    """The message count in a batch's head, once the head says the batch is ``data`` whole."""
    if len(data) < record_batch.HEAD.size or len(data) > _MAX_SIZE:
        raise CorruptData(f"shared object: a batch of queue {queue!r} has {len(data)} bytes")
    length, _, version, _, _, count, *_ = record_batch.HEAD.unpack_from(data)
    if length + 4 != len(data) or version != record_batch.VERSION or not 0 < count <= record_batch.MAX_COUNT:
        raise CorruptData(
            f"shared object: a batch of queue {queue!r} is not one record batch "
            f"({len(data)} bytes; its head: length {length}, version {version}, count {count})"
        )
    return int(count)


# --- reading -----------------------------------------------------------------------------


def read_index(data: bytes) -> list[Placed]:
    """Where every batch of the object ``data`` lies, from its index; ``CorruptData`` if it does not parse."""
    return read_footer(data, len(data))


def read_footer(end: bytes, size: int) -> list[Placed]:
    """The index of an object of ``size`` bytes, from ``end``: its last ``len(end)`` bytes.

    For a reader with only a ranged GET of the object's end: ``TAIL.size`` bytes tell the
    index length (``index_length``), the next GET fetches that much more.
    """
    if len(end) > size:
        raise CorruptData(f"shared object: {len(end)} bytes of its end, but it has {size}")
    length = index_length(end)
    if length > size - TAIL.size or length > len(end) - TAIL.size:
        raise CorruptData(f"shared object: an index of {length} bytes does not fit in {size} bytes")
    tail_at = len(end) - TAIL.size
    footer = end[tail_at - length : tail_at]
    _, crc, _ = TAIL.unpack_from(end, tail_at)
    if crc32(footer) != crc:
        raise CorruptData("shared object: index checksum mismatch")
    return _entries(footer, size - TAIL.size - length)


def index_length(end: bytes) -> int:
    """The index length ``I`` from the tail at the end of ``end`` (``CorruptData`` if it is not one)."""
    if len(end) < TAIL.size:
        raise CorruptData(f"shared object: {len(end)} bytes is shorter than its tail")
    length, _, magic = TAIL.unpack_from(end, len(end) - TAIL.size)
    if magic != MAGIC:
        raise CorruptData(f"shared object: bad magic {magic!r}")
    return int(length)


def _entries(footer: bytes, batches_size: int) -> list[Placed]:
    if len(footer) < _INDEX_HEAD.size:
        raise CorruptData(f"shared object: an index of {len(footer)} bytes is shorter than its head")
    version, queues, count = _INDEX_HEAD.unpack_from(footer)
    if version != VERSION:
        raise CorruptData(f"shared object: unsupported version {version}")
    pos = _INDEX_HEAD.size
    names: list[str] = []
    for _ in range(queues):
        if pos + _NAME_LENGTH.size > len(footer):
            raise CorruptData("shared object: the index ends inside its queue names")
        (length,) = _NAME_LENGTH.unpack_from(footer, pos)
        pos += _NAME_LENGTH.size
        raw = footer[pos : pos + length]
        pos += length
        if len(raw) != length or length == 0:
            raise CorruptData("shared object: a queue name is empty or runs past the index")
        try:
            names.append(raw.decode())
        except UnicodeDecodeError:
            raise CorruptData("shared object: a queue name is not UTF-8") from None
    if len(set(names)) != len(names):
        raise CorruptData("shared object: a queue is named twice in the index")
    if len(footer) - pos != count * _ENTRY.size:
        raise CorruptData(
            f"shared object: {count} index entries do not fill the index's last {len(footer) - pos} bytes"
        )
    placed: list[Placed] = []
    expected = 0
    for queue, offset, size, messages in _ENTRY.iter_unpack(footer[pos:]):
        if queue >= len(names):
            raise CorruptData(f"shared object: an index entry names queue {queue} of {len(names)}")
        if offset != expected or size < record_batch.HEAD.size or not 0 < messages <= record_batch.MAX_COUNT:
            raise CorruptData(
                f"shared object: bad index entry (offset {offset}, size {size}, count {messages}; "
                f"the batch before ended at {expected})"
            )
        placed.append(Placed(names[queue], offset, size, messages))
        expected = offset + size
    if expected != batches_size:
        raise CorruptData(
            f"shared object: the batches fill {expected} bytes; the object holds {batches_size}"
        )
    return placed


def verify(data: bytes) -> list[Placed]:
    """``read_index``, then every batch checked (its length, both CRCs, its head) against its entry."""
    placed = read_index(data)
    for entry in placed:
        batch = record_batch.read(data, entry.offset, entry.offset + entry.size)
        if batch.end != entry.offset + entry.size or batch.count != entry.count:
            raise CorruptData(
                f"shared object: the batch at offset {entry.offset} holds {batch.count} messages in "
                f"{batch.end - entry.offset} bytes; its index entry says {entry.count} in {entry.size}"
            )
    return placed


def queue_ranges(placed: Sequence[Placed]) -> dict[str, Placed]:
    """Each queue's batches as one range (``build`` keeps them contiguous): offset, size, messages."""
    ranges: dict[str, Placed] = {}
    for entry in placed:
        found = ranges.get(entry.queue)
        if found is None:
            ranges[entry.queue] = entry
        elif found.offset + found.size != entry.offset:
            raise CorruptData(f"shared object: the batches of queue {entry.queue!r} are not contiguous")
        else:
            ranges[entry.queue] = Placed(
                entry.queue, found.offset, found.size + entry.size, found.count + entry.count
            )
    return ranges
