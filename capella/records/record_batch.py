"""The record batch: a run of messages as one framed unit, the same bytes from producer to disk to reader.

A producer encodes its messages as a batch (``encode``); the server checks the body's
checksum once, gives the batch its base id, time and default source by rewriting only the
small head (``stamp``), and appends those bytes to the journal; a sealed block holds the
batches byte for byte, and a binary read answers with them. Within a batch the ids are
``base_id``, ``base_id + 1``, ... and every message has the batch's time, so neither is
stored per message, nor is what is usually a default: external id = id, external time =
time, segment 0, the batch's source, no headers. docs/format.md ("Record batch") describes
every byte; all integers are little-endian.

Everything here is a pure function of bytes and lists. Bytes that do not parse raise
``CorruptData``, whatever they are (``tests/core/test_record_batch.py`` fuzzes it).
"""

from __future__ import annotations

import functools
import math
import struct
import sys
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate, compress, pairwise
from typing import Any, NamedTuple

import msgspec

from capella.errors import CorruptData, InvalidMessage
from capella.kernels import crc32

VERSION = 2

FLAG_SOURCES = 0x01  # a source table and a u16 source index per message
FLAG_EXTERNAL_IDS = 0x02  # a presence bitmap and an i64 external id per message
FLAG_EXTERNAL_TIMES = 0x04  # an f64 external time per message (NaN: the batch's time)
FLAG_SEGMENTS = 0x08  # an i64 segment per message
FLAG_HEADERS = 0x10  # a u32 header-map length per message, then the maps
KNOWN_FLAGS = FLAG_SOURCES | FLAG_EXTERNAL_IDS | FLAG_EXTERNAL_TIMES | FLAG_SEGMENTS | FLAG_HEADERS

# length (the bytes after this field), head CRC, version, reserved, flags, count, base id,
# base time, body CRC, default source length; the default source, then the body, follow.
HEAD = struct.Struct("<IIBBHIQdIH")
# The head CRC covers the head from the version on, and the default source.
_CRC_FROM = 8
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
# A batch holds at most this many messages (the u16 index width limits nothing else).
MAX_COUNT = 1 << 24
_SWAP = sys.byteorder == "big"


class Fields(NamedTuple):
    """A batch's messages as one list per field, in ``capella.core.message.LogMessage`` order."""

    ids: list[int]
    times: list[float]
    sources: list[str]
    external_ids: list[int]
    external_times: list[float]
    segments: list[int]
    payloads: list[bytes]
    headers: list[dict[str, str]]


class RecordBatch(msgspec.Struct, frozen=True, gc=False):
    """One batch found in a buffer: its head's fields and where its bytes are.

    ``data[start:end]`` is the whole batch; its body is ``data[body:end]``. Not tracked by the
    cyclic garbage collector (it holds no container): an open block keeps one per request, and
    every young collection walked them (60,000 single-message appends: 23-29 ms of collections
    as a dataclass, 8-12 ms as this).
    """

    data: bytes
    start: int
    end: int
    body: int
    flags: int
    count: int
    base_id: int
    base_time: float
    source: str

    @property
    def last_id(self) -> int:
        return self.base_id + self.count - 1

    def raw(self) -> bytes:
        """The batch's bytes as stored."""
        if self.start == 0 and self.end == len(self.data):
            return self.data
        return self.data[self.start : self.end]

    def view(self) -> memoryview:
        """The batch's bytes as stored, without a copy."""
        return memoryview(self.data)[self.start : self.end]

    def alone(self) -> RecordBatch:
        """The batch over a copy of its own bytes, to keep without the rest of ``data``."""
        if self.start == 0 and self.end == len(self.data):
            return self
        start = self.start
        return RecordBatch(
            self.raw(),
            0,
            self.end - start,
            self.body - start,
            self.flags,
            self.count,
            self.base_id,
            self.base_time,
            self.source,
        )

    def fields(self) -> Fields:
        """Every message of the batch, as columns (``CorruptData`` if the body does not parse)."""
        return decode_body(self)


# --- writing -----------------------------------------------------------------------------


def encode(
    payloads: Sequence[bytes],
    *,
    sources: Sequence[str | None] | None = None,
    external_ids: Sequence[int | None] | None = None,
    external_times: Sequence[float | None] | None = None,
    segments: Sequence[int] | None = None,
    headers: Sequence[dict[str, str]] | None = None,
    base_id: int = 0,
    base_time: float = 0.0,
    source: str = "",
) -> bytes:
    """A batch of ``len(payloads)`` messages; each other column is optional, ``None`` in it a default.

    A producer leaves ``base_id``, ``base_time`` and ``source`` as they are: the server stamps
    them. A source of ``None`` is the batch's source (the producing cluster's name).
    """
    n = len(payloads)
    if not 0 < n <= MAX_COUNT:
        raise InvalidMessage(f"a record batch holds 1 to {MAX_COUNT} messages, not {n}")
    flags = 0
    parts: list[bytes] = [_packed("I", map(len, payloads), "payload length")]
    try:
        if sources is not None and sources.count(None) != n:
            flags |= FLAG_SOURCES
            parts += _source_columns(sources)
        if external_ids is not None and external_ids.count(None) != n:
            flags |= FLAG_EXTERNAL_IDS
            present = [e is not None for e in external_ids]
            parts.append(_bitmap(present))
            parts.append(_packed("q", (0 if e is None else e for e in external_ids), "external_id"))
        if external_times is not None and external_times.count(None) != n:
            flags |= FLAG_EXTERNAL_TIMES
            parts.append(
                _packed("d", (math.nan if t is None else t for t in external_times), "external_time")
            )
        if segments is not None and segments.count(0) != n:
            flags |= FLAG_SEGMENTS
            parts.append(_packed("q", segments, "segment"))
        if headers is not None and any(headers):
            flags |= FLAG_HEADERS
            blobs = [encode_headers(h) if h else b"" for h in headers]
            parts.append(_packed("I", map(len, blobs), "header length"))
            parts += blobs
    except (UnicodeEncodeError, struct.error) as exc:
        raise InvalidMessage(f"a message cannot be stored: {exc}") from None
    parts += payloads
    body = b"".join(parts)
    return _framed(flags, n, base_id, base_time, source, body, crc32(body))


def encode_fields(fields: Fields) -> list[bytes]:
    """Stored messages (ids increasing) as batches: one per run of consecutive ids with one time.

    For messages that did not arrive as a batch (a block of the earlier format, a filtered
    read): external ids equal to the id and external times equal to the time stay defaults.
    """
    batches: list[bytes] = []
    ids, times = fields.ids, fields.times
    n = len(ids)
    start = 0
    while start < n:
        end = start + 1
        base_id, base_time = ids[start], times[start]
        while end < n and ids[end] == base_id + end - start and times[end] == base_time:
            end += 1
        batches.append(_encode_run(fields, start, end))
        start = end
    return batches


def _encode_run(f: Fields, start: int, end: int) -> bytes:
    ids = f.ids[start:end]
    time = f.times[start]
    sources = f.sources[start:end]
    source = sources[0]
    return encode(
        f.payloads[start:end],
        sources=[None if s == source else s for s in sources],
        external_ids=[None if e == i else e for e, i in zip(f.external_ids[start:end], ids, strict=True)],
        external_times=[None if t == time else t for t in f.external_times[start:end]],
        segments=f.segments[start:end],
        headers=f.headers[start:end],
        base_id=ids[0],
        base_time=time,
        source=source,
    )


def stamp(batch: RecordBatch, base_id: int, base_time: float, source: str) -> bytes:
    """The batch with the server's base id, time and source: a new head, the body as it was."""
    body = memoryview(batch.data)[batch.body : batch.end]
    body_crc = HEAD.unpack_from(batch.data, batch.start)[8]
    return _framed(batch.flags, batch.count, base_id, base_time, source, body, body_crc)


def select(batch: RecordBatch, keep: Sequence[bool], base_id: int | None = None) -> bytes | None:
    """The batch without the messages whose ``keep`` is false (None when none is kept).

    The kept messages are renumbered from ``base_id`` (the batch's own by default); their
    external ids and times keep their values. Used to cut duplicates out before an append (a
    page's edge keeps its ids: ``cut``).
    """
    if all(keep):
        return batch.raw() if base_id is None or base_id == batch.base_id else _rebased(batch, base_id)
    if not any(keep):
        return None
    f, given_ids, given_times = _decode(batch)
    kept = Fields._make(list(compress(column, keep)) for column in f)
    return encode(
        kept.payloads,
        sources=[None if s == batch.source else s for s in kept.sources],
        # What the producer left to default stays default: a renumbered message's external id
        # is its new id.
        external_ids=None if given_ids is None else list(compress(given_ids, keep)),
        external_times=None if given_times is None else list(compress(given_times, keep)),
        segments=kept.segments,
        headers=kept.headers,
        base_id=batch.base_id if base_id is None else base_id,
        base_time=batch.base_time,
        source=batch.source,
    )


def cut(batch: RecordBatch, skip: int, take: int) -> bytes:
    """Messages ``skip`` to ``skip + take - 1`` of ``batch`` as a batch of their own, with their
    ids and every field as they were: each column is sliced, no message decoded (a page that
    starts or ends inside a batch). ``CorruptData`` if the body does not parse that far.

    The source table stays whole, and a column the slice leaves at its defaults stays: both
    read as ``select`` would make them, in a fraction of the time.
    """
    n, flags, data = batch.count, batch.flags, batch.data
    stop = skip + take
    if not 0 <= skip < stop <= n:
        raise ValueError(f"cannot cut messages {skip} to {stop - 1} from a batch of {n}")
    if take == n:
        return batch.raw()
    reader = _Reader(data, batch.body, batch.end, n)
    lengths, lengths_raw = reader.sizes()
    parts = [lengths_raw[4 * skip : 4 * stop]]
    if flags & FLAG_SOURCES:
        table = reader.pos
        (count,) = reader.unpack(_U16)
        for _ in range(count):
            (length,) = reader.unpack(_U16)
            reader.take(length)
        parts += (data[table : reader.pos], reader.take(2 * n)[2 * skip : 2 * stop])
    if flags & FLAG_EXTERNAL_IDS:
        bits = int.from_bytes(reader.take((n + 7) // 8), "little") >> skip & ((1 << take) - 1)
        parts += (bits.to_bytes((take + 7) // 8, "little"), reader.take(8 * n)[8 * skip : 8 * stop])
    for flag in (FLAG_EXTERNAL_TIMES, FLAG_SEGMENTS):
        if flags & flag:
            parts.append(reader.take(8 * n)[8 * skip : 8 * stop])
    if flags & FLAG_HEADERS:
        header_lengths, header_lengths_raw = reader.sizes()
        maps = reader.take(sum(header_lengths))
        before, size = sum(header_lengths[:skip]), sum(header_lengths[skip:stop])
        parts += (header_lengths_raw[4 * skip : 4 * stop], maps[before : before + size])
    start = reader.pos
    _check_fill(batch, start, start + sum(lengths))
    first = start + sum(lengths[:skip])
    parts.append(data[first : first + sum(lengths[skip:stop])])
    body = b"".join(parts)
    return _framed(flags, take, batch.base_id + skip, batch.base_time, batch.source, body, crc32(body))


def _rebased(batch: RecordBatch, base_id: int) -> bytes:
    return stamp(batch, base_id, batch.base_time, batch.source)


def _framed(
    flags: int,
    count: int,
    base_id: int,
    base_time: float,
    source: str,
    body: bytes | memoryview,
    body_crc: int,
) -> bytes:
    try:
        raw_source = source.encode()
        head = HEAD.pack(0, 0, VERSION, 0, flags, count, base_id, base_time, body_crc, len(raw_source))
    except (struct.error, UnicodeEncodeError, OverflowError) as exc:
        raise InvalidMessage(f"a record batch cannot be framed: {exc}") from None
    length = HEAD.size - 4 + len(raw_source) + len(body)
    if length > 0xFFFFFFFF:
        raise InvalidMessage(f"a record batch of {length} bytes is over the 4 GiB limit")
    crc = crc32(raw_source, crc32(memoryview(head)[_CRC_FROM:]))
    return b"".join((_U32.pack(length), _U32.pack(crc), head[_CRC_FROM:], raw_source, body))


def _source_columns(sources: Sequence[str | None]) -> list[bytes]:
    table: dict[str, int] = {}
    index = [0 if s is None else table.setdefault(s, len(table) + 1) for s in sources]
    if len(table) >= 0xFFFF:
        raise InvalidMessage(f"a record batch holds at most 65,534 sources, not {len(table)}")
    parts = [_U16.pack(len(table))]
    for name in table:
        raw = name.encode()
        parts += (_U16.pack(len(raw)), raw)
    parts.append(_packed("H", index, "source index"))
    return parts


def _bitmap(bits: list[bool]) -> bytes:
    out = bytearray((len(bits) + 7) // 8)
    for i in compress(range(len(bits)), bits):
        out[i >> 3] |= 1 << (i & 7)
    return bytes(out)


def _packed(typecode: str, values: object, what: str) -> bytes:
    try:
        packed: array[Any] = array(typecode, values)  # type: ignore[call-overload]
    except (OverflowError, TypeError) as exc:
        raise InvalidMessage(f"a {what} is out of range: {exc}") from None
    if _SWAP:
        packed.byteswap()
    return packed.tobytes()


def encode_headers(headers: dict[str, str]) -> bytes:
    """A message's header map as every format holds it (docs/format.md): a u16 count, then each
    key (u16 length, UTF-8) and value (u32 length, UTF-8). The journal and sealed blocks
    (``core/log/codec.py``) hold it in the same layout."""
    parts = [_U16.pack(len(headers))]
    for key, value in headers.items():
        k = key.encode()
        v = value.encode()
        parts += (_U16.pack(len(k)), k, _U32.pack(len(v)), v)
    return b"".join(parts)


# --- reading -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Scan:
    """The good batches at the start of a buffer, where they end, and why the scan stopped there."""

    batches: list[RecordBatch]
    end: int
    reason: str


def scan(data: bytes, start: int = 0, end: int | None = None) -> Scan:
    """Every batch from ``start`` up to the first that is torn or corrupt (a journal's tail).

    ``reason`` is "" when the batches fill ``data[start:end]`` exactly.
    """
    end = len(data) if end is None else end
    batches: list[RecordBatch] = []
    pos = start
    last = -1
    while pos < end:
        try:
            batch = read(data, pos, end)
        except CorruptData as exc:
            return Scan(batches, pos, str(exc))
        if batch.base_id <= last:
            return Scan(batches, pos, f"batch at offset {pos}: id {batch.base_id} does not follow id {last}")
        batches.append(batch)
        last = batch.last_id
        pos = batch.end
    return Scan(batches, pos, "")


def read_all(data: bytes, start: int = 0, end: int | None = None) -> list[RecordBatch]:
    """Every batch in ``data[start:end]``, which they must fill exactly; ``CorruptData`` otherwise."""
    found = scan(data, start, end)
    if found.reason:
        raise CorruptData(found.reason)
    return found.batches


def read(data: bytes, pos: int = 0, limit: int | None = None) -> RecordBatch:
    """The batch at ``data[pos:]``, checked: its length, both checksums and its head's fields.

    The body's columns are checked when they are decoded (``RecordBatch.fields``).
    """
    limit = len(data) if limit is None else limit
    if limit - pos < HEAD.size:
        raise CorruptData(f"record batch at offset {pos}: {limit - pos} bytes is shorter than a head")
    length, crc, version, _, flags, count, base_id, base_time, body_crc, source_len = HEAD.unpack_from(
        data, pos
    )
    end = pos + 4 + length
    if length < HEAD.size - 4 + source_len or end > limit:
        raise CorruptData(
            f"record batch at offset {pos}: length {length} does not fit in {limit - pos} bytes"
        )
    view = memoryview(data)
    body = pos + HEAD.size + source_len
    if crc32(view[pos + _CRC_FROM : body]) != crc:
        raise CorruptData(f"record batch at offset {pos}: head checksum mismatch")
    if version != VERSION:
        raise CorruptData(f"record batch at offset {pos}: unsupported version {version}")
    if flags & ~KNOWN_FLAGS or not 0 < count <= MAX_COUNT:
        raise CorruptData(f"record batch at offset {pos}: bad flags {flags:#x} or count {count}")
    if base_id + count > 1 << 64:
        raise CorruptData(f"record batch at offset {pos}: ids run past 2**64")
    if crc32(view[body:end]) != body_crc:
        raise CorruptData(f"record batch at offset {pos}: body checksum mismatch")
    try:
        source = _source_text(bytes(view[pos + HEAD.size : body]))
    except UnicodeDecodeError:
        raise CorruptData(f"record batch at offset {pos}: the source is not UTF-8") from None
    return RecordBatch(data, pos, end, body, flags, count, base_id, base_time, source)


def framed(data: bytes) -> RecordBatch:
    """The batch that ``data`` holds whole, from its head alone, unchecked: for bytes this
    process has just framed (``stamp``, ``select``, ``encode``). ``read`` checks bytes from
    anywhere else."""
    _, _, _, _, flags, count, base_id, base_time, _, source_len = HEAD.unpack_from(data)
    body = HEAD.size + source_len
    return RecordBatch(
        data, 0, len(data), body, flags, count, base_id, base_time, _source_text(data[HEAD.size : body])
    )


@functools.lru_cache(maxsize=1024)
def _source_text(raw: bytes) -> str:
    """A batch's source as text, one string per source: a block of 10,000 single-message
    batches keeps one string, not 10,000 (~50 bytes each)."""
    return raw.decode()


def decode_body(batch: RecordBatch) -> Fields:
    """The messages of ``batch`` as columns; ``CorruptData`` if the body does not parse."""
    return _decode(batch)[0]


# ``decode_given``'s answer: the columns, and the external ids and times as the producer gave them.
Given = tuple[Fields, list[int | None] | None, list[float | None] | None]


def decode_given(batch: RecordBatch) -> Given:
    """The messages of ``batch`` as columns, and the external ids and times as the producer gave
    them (``None`` where left to default; the list is ``None`` when every one was).

    What an append needs: dedup looks up only the explicit external ids, and only explicit
    external times are checked against the clock.
    """
    return _decode(batch)


def _decode(batch: RecordBatch) -> Given:
    """The columns, and the external ids and times as given (``None`` where left to default)."""
    try:
        return _decode_columns(batch)
    except CorruptData:
        raise
    except (struct.error, ValueError, IndexError, OverflowError, UnicodeDecodeError) as exc:
        raise CorruptData(f"record batch of ids from {batch.base_id}: body does not parse: {exc}") from None


def payload_sizes(batch: RecordBatch) -> list[int]:
    """The payload lengths of a batch of payloads and nothing else (``flags`` 0), checked to
    fill its body exactly as a decode checks them, without reading the payloads."""
    if batch.flags:
        raise ValueError("payload_sizes reads batches without optional columns")
    reader = _Reader(batch.data, batch.body, batch.end, batch.count)
    lengths = reader.column("I")
    _check_fill(batch, reader.pos, reader.pos + sum(lengths))
    return lengths


def _check_fill(batch: RecordBatch, start: int, payloads_end: int) -> None:
    if payloads_end != batch.end:
        raise CorruptData(
            f"record batch of ids from {batch.base_id}: payloads take {payloads_end - start} bytes, "
            f"the body has {batch.end - start}"
        )


def _decode_columns(batch: RecordBatch) -> Given:
    data, flags, n, end = batch.data, batch.flags, batch.count, batch.end
    reader = _Reader(data, batch.body, end, n)
    payload_lengths = reader.column("I")
    base_id, time = batch.base_id, batch.base_time
    ids = list(range(base_id, base_id + n))

    if flags & FLAG_SOURCES:
        table, index = _source_columns_read(reader, batch)
        sources = list(map(table.__getitem__, index))
    else:
        sources = [batch.source] * n

    given_ids: list[int | None] | None = None
    given_times: list[float | None] | None = None
    if flags & FLAG_EXTERNAL_IDS:
        bits = reader.take((n + 7) // 8)
        column = reader.column("q")
        given_ids = [e if bits[i >> 3] >> (i & 7) & 1 else None for i, e in enumerate(column)]
        external_ids = [i if e is None else e for i, e in zip(ids, given_ids, strict=True)]
    else:
        external_ids = ids
    if flags & FLAG_EXTERNAL_TIMES:
        given_times = [None if t != t else t for t in reader.column_float()]  # NaN: the batch's time
        external_times = [time if t is None else t for t in given_times]
    else:
        external_times = [time] * n
    segments = reader.column("q") if flags & FLAG_SEGMENTS else [0] * n
    if flags & FLAG_HEADERS:
        header_lengths = reader.column("I")
        headers = [_decode_headers(reader.take(length)) if length else {} for length in header_lengths]
    else:
        headers = [{}] * n

    start = reader.pos
    ends = list(accumulate(payload_lengths, initial=start))
    _check_fill(batch, start, ends[-1])
    payloads = [data[a:b] for a, b in pairwise(ends)]
    fields = Fields(ids, [time] * n, sources, external_ids, external_times, segments, payloads, headers)
    return fields, given_ids, given_times


def _source_columns_read(reader: _Reader, batch: RecordBatch) -> tuple[list[str], list[int]]:
    """The source table (the batch's default source first) and each message's index into it."""
    (count,) = reader.unpack(_U16)
    table = [batch.source]
    for _ in range(count):
        (length,) = reader.unpack(_U16)
        table.append(reader.take(length).decode())
    index = reader.column("H")
    if max(index) >= len(table):
        raise CorruptData(f"record batch of ids from {batch.base_id}: a source index is past its table")
    return table, index


class _Reader:
    """Reads a body's columns in order, never past its end."""

    def __init__(self, data: bytes, pos: int, end: int, count: int) -> None:
        self._data = data
        self.pos = pos
        self._end = end
        self._count = count

    def take(self, size: int) -> bytes:
        stop = self.pos + size
        if stop > self._end:
            raise CorruptData(f"record batch: a field runs past the body's end at offset {self.pos}")
        chunk = self._data[self.pos : stop]
        self.pos = stop
        return chunk

    def unpack(self, shape: struct.Struct) -> tuple[int, ...]:
        return shape.unpack(self.take(shape.size))

    def column(self, typecode: str) -> list[int]:
        values = array(typecode)
        values.frombytes(self.take(self._count * values.itemsize))
        if _SWAP:
            values.byteswap()
        return values.tolist()

    def sizes(self) -> tuple[array[int], bytes]:
        """A u32 column as an array, and its bytes as stored."""
        raw = self.take(self._count * 4)
        values = array("I", raw)
        if _SWAP:
            values.byteswap()
        return values, raw

    def column_float(self) -> list[float]:
        values = array("d")
        values.frombytes(self.take(self._count * values.itemsize))
        if _SWAP:
            values.byteswap()
        return values.tolist()


def _decode_headers(raw: bytes) -> dict[str, str]:
    (count,) = _U16.unpack_from(raw)
    pos = _U16.size
    headers: dict[str, str] = {}
    for _ in range(count):
        (klen,) = _U16.unpack_from(raw, pos)
        pos += _U16.size
        key = raw[pos : pos + klen].decode()
        pos += klen
        (vlen,) = _U32.unpack_from(raw, pos)
        pos += _U32.size
        if pos + vlen > len(raw) or len(key.encode()) != klen:
            raise CorruptData("record batch: a header runs past its map")
        headers[key] = raw[pos : pos + vlen].decode()
        pos += vlen
    if pos != len(raw) or len(headers) != count:
        raise CorruptData("record batch: a header map has trailing bytes or a repeated key")
    return headers


class Extent(NamedTuple):
    """What a block's index says of one batch: the sources its messages have, and their segment range."""

    sources: list[str]
    min_segment: int
    max_segment: int


def extent(batch: RecordBatch) -> Extent:
    """The batch's sources (in first-use order) and segment range, read without decoding its messages.

    Only the columns before the segments are stepped over; a batch with no per-message
    sources or segments answers from its head alone.
    """
    n, flags = batch.count, batch.flags
    if not flags & (FLAG_SOURCES | FLAG_SEGMENTS):
        return Extent([batch.source], 0, 0)
    try:
        reader = _Reader(batch.data, batch.body, batch.end, n)
        reader.take(4 * n)  # payload lengths
        sources = [batch.source]
        if flags & FLAG_SOURCES:
            table, index = _source_columns_read(reader, batch)
            sources = list(dict.fromkeys(table[i] for i in dict.fromkeys(index)))
        if not flags & FLAG_SEGMENTS:
            return Extent(sources, 0, 0)
        if flags & FLAG_EXTERNAL_IDS:
            reader.take((n + 7) // 8 + 8 * n)
        if flags & FLAG_EXTERNAL_TIMES:
            reader.take(8 * n)
        segments = reader.column("q")
    except (struct.error, ValueError, UnicodeDecodeError) as exc:
        raise CorruptData(f"record batch of ids from {batch.base_id}: body does not parse: {exc}") from None
    return Extent(sources, min(segments), max(segments))


def page_messages(batches: Iterable[RecordBatch], after: int, limit: int) -> list[bytes | memoryview]:
    """The batches' bytes for messages with ids above ``after``, at most ``limit`` of them.

    Whole batches are views of their stored bytes (the page's join is their one copy); only a
    batch cut at either edge is re-framed.
    """
    return [batch.view() for batch in page_batches(batches, after, limit)]


def page_batches(batches: Iterable[RecordBatch], after: int, limit: int) -> list[RecordBatch]:
    """The batches of the messages with ids above ``after``, at most ``limit`` of them: whole
    batches as they are, a batch cut at either edge re-framed with only its part."""
    out: list[RecordBatch] = []
    left = limit
    for batch in batches:
        if left <= 0:
            break
        if batch.last_id <= after:
            continue
        skip = max(0, after + 1 - batch.base_id)
        take = min(batch.count - skip, left)
        out.append(batch if skip == 0 and take == batch.count else framed(cut(batch, skip, take)))
        left -= take
    return out
