"""The binary formats Capella writes: the journal of an open block and the sealed block.

Both are pure functions from messages to bytes and back; nothing here touches a file or the
event loop. docs/format.md describes every byte. Bad bytes raise ``CorruptData`` and are
never returned as messages.

Format 2 (``CPJ2`` journals, ``CPB2`` blocks) holds record batches
(``capella.records.record_batch``) byte for byte: the journal is the batches back to back, and
a sealed block is those same bytes between a head and an index. Format 1 (``CPJ1``, ``CPB1``:
one frame per message, a columnar block) is read forever; only the tests write it
(tests/support/codec.py).
"""

from __future__ import annotations

import functools
import importlib
import struct
import sys
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, chain, pairwise
from operator import add, attrgetter
from types import ModuleType

import msgspec

from capella.core.message import EMPTY_HEADERS, LogMessage
from capella.errors import CorruptData, InvalidMessage
from capella.kernels import crc32
from capella.records import record_batch
from capella.records.record_batch import RecordBatch

BLOCK_SUFFIX = ".blk"
JOURNAL_SUFFIX = ".log"

_U64_MASK = (1 << 64) - 1
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_HEADER_KEY = struct.Struct("<H")
_HEADER_VALUE = struct.Struct("<I")

# --- journal -----------------------------------------------------------------------------

# magic, format version, two reserved fields (zero), then a CRC32 of those 12 bytes.
_JOURNAL_HEAD = struct.Struct("<4sHHI")


def _journal_header(magic: bytes, version: int) -> bytes:
    body = _JOURNAL_HEAD.pack(magic, version, 0, 0)
    return body + _U32.pack(crc32(body))


# Format 2, written by this version: record batches back to back.
JOURNAL_MAGIC = b"CPJ2"
JOURNAL_VERSION = 2
JOURNAL_HEADER: bytes = _journal_header(JOURNAL_MAGIC, JOURNAL_VERSION)
# Format 1, read forever: one frame per message.
JOURNAL_MAGIC_V1 = b"CPJ1"
JOURNAL_HEADER_V1: bytes = _journal_header(JOURNAL_MAGIC_V1, 1)
_JOURNAL_VERSIONS = {JOURNAL_MAGIC: JOURNAL_VERSION, JOURNAL_MAGIC_V1: 1}

# A frame is body length + CRC32 of the body, then the body.
_FRAME = struct.Struct("<II")
# id, time, external_id, external_time, segment, source length; source, headers, payload follow.
_RECORD = struct.Struct("<QdqdqH")
_NO_HEADERS = _U16.pack(0)
_MIN_BODY = _RECORD.size + _U16.size


@dataclass(frozen=True, slots=True)
class JournalScan:
    """What a journal holds: the good prefix, and whether anything after it was cut off.

    ``valid_length`` is the byte length of the header plus every good frame (or batch), so
    recovery can truncate the file there. ``torn`` is true when bytes follow the good prefix;
    ``reason`` says why the scan stopped there ("" for a clean journal). ``batches`` holds the
    good record batches of a format 2 journal (none for format 1), which a sealed block takes
    as they are.
    """

    messages: list[LogMessage]
    valid_length: int
    torn: bool
    reason: str
    batches: list[RecordBatch] = field(default_factory=list)
    version: int = JOURNAL_VERSION


def message_body(m: LogMessage) -> bytes:
    """``m`` as the body of a journal frame, without the frame (for other logs that hold messages)."""
    try:
        source = m.source.encode()
        head = _RECORD.pack(m.id, m.time, m.external_id, m.external_time, m.segment, len(source))
        headers = record_batch.encode_headers(m.headers) if m.headers else _NO_HEADERS
        return b"".join((head, source, headers, m.payload))
    except (struct.error, UnicodeEncodeError, OverflowError) as exc:
        raise InvalidMessage(f"message {m.id} cannot be stored: {exc}") from exc


def message_from_body(data: bytes, start: int = 0, end: int | None = None) -> LogMessage:
    """The message in ``data[start:end]`` as ``message_body`` wrote it (``CorruptData`` if it cannot be)."""
    end = len(data) if end is None else end
    if end - start < _MIN_BODY:
        raise CorruptData(f"message body of {end - start} bytes is too short")
    try:
        return _decode_record(data, start, end)
    except (_Malformed, struct.error) as exc:
        raise CorruptData(f"message body does not parse: {exc}") from None


def decode_journal(data: bytes) -> JournalScan:
    """Every message in a journal up to the first frame or batch that is torn, corrupt or out of order.

    The header's magic says the format: ``CPJ2`` (record batches) or ``CPJ1`` (a frame per
    message). A journal shorter than its header whose bytes are a prefix of either header
    (also an empty one) was cut off while being created: it scans as empty with
    ``valid_length`` 0, and the caller writes a fresh header. Any other bad header raises
    ``CorruptData``.
    """
    size = len(data)
    head_size = len(JOURNAL_HEADER)
    if size < head_size and (JOURNAL_HEADER.startswith(data) or JOURNAL_HEADER_V1.startswith(data)):
        return JournalScan([], 0, size > 0, "torn journal header" if size else "")
    version = _check_journal_header(data)
    if version == 1:
        return _decode_journal_v1(data)
    found = record_batch.scan(data, head_size)
    batches, end, reason = found.batches, found.end, found.reason
    messages: list[LogMessage] = []
    for index, batch in enumerate(batches):
        try:
            messages += messages_of(Columns._make(batch.fields()))
        except CorruptData as exc:
            # Its checksums held but its body does not parse: cut here, as for a torn batch.
            batches, end, reason = batches[:index], batch.start, exc.message
            break
    return JournalScan(messages, end, end != size, reason, batches, version)


def _decode_journal_v1(data: bytes) -> JournalScan:
    size = len(data)
    view = memoryview(data)
    messages: list[LogMessage] = []
    last_id = -1
    pos = len(JOURNAL_HEADER_V1)
    reason = ""
    while pos < size:
        if size - pos < _FRAME.size:
            reason = f"truncated frame header at offset {pos}"
            break
        length, crc = _FRAME.unpack_from(data, pos)
        start = pos + _FRAME.size
        end = start + length
        if length < _MIN_BODY:
            reason = f"impossible frame length {length} at offset {pos}"
            break
        if end > size:
            reason = f"truncated frame at offset {pos}: needs {length} body bytes, has {size - start}"
            break
        if crc32(view[start:end]) != crc:
            reason = f"checksum mismatch in frame at offset {pos}"
            break
        try:
            message = _decode_record(data, start, end)
        except _Malformed as exc:
            reason = f"malformed frame at offset {pos}: {exc}"
            break
        if message.id <= last_id:
            reason = f"id {message.id} at offset {pos} does not follow id {last_id}"
            break
        messages.append(message)
        last_id = message.id
        pos = end
    return JournalScan(messages, pos, pos != size, reason, [], 1)


def _check_journal_header(data: bytes) -> int:
    """The format version of a journal whose header is good; ``CorruptData`` otherwise."""
    head_size = len(JOURNAL_HEADER)
    if len(data) < head_size:
        raise CorruptData(f"journal: {len(data)} bytes is shorter than its {head_size}-byte header")
    magic, version, _, _ = _JOURNAL_HEAD.unpack_from(data)
    expected = _JOURNAL_VERSIONS.get(magic)
    if expected is None:
        raise CorruptData(f"journal: bad magic {magic!r}, expected {JOURNAL_MAGIC!r} or {JOURNAL_MAGIC_V1!r}")
    (crc,) = _U32.unpack_from(data, _JOURNAL_HEAD.size)
    if crc != crc32(data[: _JOURNAL_HEAD.size]):
        raise CorruptData("journal: header checksum mismatch")
    if version != expected:
        raise CorruptData(f"journal: unsupported format version {version}")
    return int(version)


def _decode_record(data: bytes, start: int, end: int) -> LogMessage:
    mid, time, external_id, external_time, segment, source_len = _RECORD.unpack_from(data, start)
    pos = start + _RECORD.size
    if pos + source_len + _U16.size > end:
        raise _Malformed("source runs past the frame")
    source = _text(data[pos : pos + source_len])
    pos += source_len
    headers, pos = _decode_headers(data, pos, end)
    return LogMessage(mid, time, source, external_id, external_time, segment, data[pos:end], headers)


# --- headers (shared by both formats) ----------------------------------------------------


class _Malformed(ValueError):
    """Bytes that passed their checksum but do not parse; the caller turns this into a report."""


def _decode_headers(data: bytes, pos: int, end: int) -> tuple[dict[str, str], int]:
    """The header map at ``pos`` and the offset just after it; it must end by ``end``."""
    if pos + _U16.size > end:
        raise _Malformed("header count runs past its end")
    (count,) = _U16.unpack_from(data, pos)
    pos += _U16.size
    if not count:
        return EMPTY_HEADERS, pos
    headers: dict[str, str] = {}
    for _ in range(count):
        if pos + _HEADER_KEY.size > end:
            raise _Malformed("header key runs past its end")
        (klen,) = _HEADER_KEY.unpack_from(data, pos)
        pos += _HEADER_KEY.size
        key = _text(data[pos : pos + klen])
        pos += klen
        if pos + _HEADER_VALUE.size > end:
            raise _Malformed("header value runs past its end")
        (vlen,) = _HEADER_VALUE.unpack_from(data, pos)
        pos += _HEADER_VALUE.size
        if pos + vlen > end:
            raise _Malformed("header value runs past its end")
        headers[key] = _text(data[pos : pos + vlen])
        pos += vlen
    if len(headers) != count:
        raise _Malformed("repeated header key")
    return headers, pos


def _text(raw: bytes) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError as exc:
        raise _Malformed(f"text is not UTF-8: {exc}") from None


# --- sealed block ------------------------------------------------------------------------

BLOCK_MAGIC_V1 = b"CPB1"
BLOCK_END_MAGIC = b"CPBE"
BLOCK_VERSION_V1 = 1
FLAG_HEADERS = 0x0001
_KNOWN_FLAGS = FLAG_HEADERS
# magic, version, flags, count, reserved, first id, last id, compressed metadata length,
# raw metadata length, payload section length.
_BLOCK_HEAD = struct.Struct("<4sHHIIQQQQQ")
# total block length, end magic, CRC32 of every byte before the CRC.
_BLOCK_FOOT = struct.Struct("<Q4sI")

Buffer = bytes | bytearray | memoryview

# Columns go through array for bulk packing; the format is little-endian whatever the host.
_SWAP = sys.byteorder == "big"
assert array("Q").itemsize == 8 and array("q").itemsize == 8 and array("d").itemsize == 8
assert array("I").itemsize == 4


# Messages as one list per field, in ``LogMessage``'s field order (``messages_of`` builds them):
# the record batch's own shape, declared once.
Columns = record_batch.Fields


def block_columns(data: Buffer) -> Columns:
    """Every message in a sealed block of either format, as columns; ``CorruptData`` if any byte is wrong.

    A column a format 1 block stores as "same as another" (external ids equal to the ids,
    external times equal to the times) is that other list itself, so a reader can tell
    without looking.
    """
    if not isinstance(data, bytes):
        data = bytes(data)  # payloads are sliced from it and must come out as bytes
    records = block_records(data)
    if records is not None:
        return columns_of_records(records)
    block = _open_block(data)
    start = _BLOCK_HEAD.size + block.meta_len
    ends = list(accumulate(block.payload_lengths, initial=start))
    return block.columns._replace(payloads=[data[a:b] for a, b in pairwise(ends)])


def columns_of(messages: Sequence[LogMessage]) -> Columns:
    """``messages`` as columns (``messages_of`` turns them back)."""
    return Columns(*(list(map(attrgetter(name), messages)) for name in LogMessage.__struct_fields__))


def block_keys(data: Buffer) -> tuple[list[int], list[tuple[str, int]]]:
    """The ids and ``(source, external_id)`` keys of a sealed block (format 1: without its payloads)."""
    records = block_records(data)
    columns = _open_block(data).columns if records is None else columns_of_records(records)
    return columns.ids, list(zip(columns.sources, columns.external_ids, strict=True))


def columns_of_records(records: Sequence[RecordBatch]) -> Columns:
    """The messages of record batches as one set of columns (``CorruptData`` if a body does not parse).

    As ``block_columns`` does for a format 1 block, external ids that are all the ids (no
    batch has its own) are the ids list itself, and likewise external times and times: a
    reader renders such a column once (``batch.json_objects``).
    """
    if len(records) == 1:
        columns = Columns._make(records[0].fields())
    else:
        parts = [r.fields() for r in records]
        columns = Columns._make(
            list(chain.from_iterable(part[i] for part in parts)) for i in range(len(Columns._fields))
        )
    flags = 0
    for r in records:
        flags |= r.flags
    if not flags & record_batch.FLAG_EXTERNAL_IDS:
        columns = columns._replace(external_ids=columns.ids)
    if not flags & record_batch.FLAG_EXTERNAL_TIMES:
        columns = columns._replace(external_times=columns.times)
    return columns


@dataclass(frozen=True, slots=True)
class _Meta:
    """A block's decoded metadata: every column but the payloads, which follow it."""

    meta_len: int
    payload_lengths: list[int]
    columns: Columns  # payloads empty


def _open_block(data: Buffer) -> _Meta:
    """Check a block's framing and checksum, then decode its metadata columns."""
    size = len(data)
    if size < _BLOCK_HEAD.size + _BLOCK_FOOT.size:
        raise CorruptData(f"block: {size} bytes is too short to be a block")
    magic, version, flags, n, _, first_id, last_id, meta_len, raw_len, payload_len = _BLOCK_HEAD.unpack_from(
        data
    )
    if magic != BLOCK_MAGIC_V1:
        raise CorruptData(f"block: bad magic {magic!r}, expected {BLOCK_MAGIC_V1!r}")
    # Checked before the CRC so that truncation and extension are reported as such, and
    # caught for certain rather than with CRC odds.
    expected = _BLOCK_HEAD.size + meta_len + payload_len + _BLOCK_FOOT.size
    if expected != size:
        raise CorruptData(f"block: truncated or extended: header says {expected} bytes, found {size}")
    total, end_magic, crc = _BLOCK_FOOT.unpack_from(data, size - _BLOCK_FOOT.size)
    if total != size or end_magic != BLOCK_END_MAGIC:
        raise CorruptData(f"block: bad footer (length {total}, magic {end_magic!r}) in {size} bytes")
    if crc != crc32(memoryview(data)[:-4]):
        raise CorruptData("block: checksum mismatch")
    if version != BLOCK_VERSION_V1:
        raise CorruptData(f"block: unsupported format version {version}")
    if flags & ~_KNOWN_FLAGS:
        raise CorruptData(f"block: unknown flags {flags:#06x}")
    try:
        return _decode_meta(data, n, flags, (first_id, last_id), meta_len, raw_len, payload_len)
    except CorruptData:
        raise
    except (_Malformed, _zstandard().ZstdError, struct.error, ValueError, IndexError, OverflowError) as exc:
        raise CorruptData(f"block: metadata does not parse: {exc}") from None


def _decode_meta(
    data: Buffer,
    n: int,
    flags: int,
    ids_range: tuple[int, int],
    meta_len: int,
    raw_len: int,
    payload_len: int,
) -> _Meta:
    first_id, last_id = ids_range
    meta_start = _BLOCK_HEAD.size
    compressed = memoryview(data)[meta_start : meta_start + meta_len]
    meta = _zstandard().ZstdDecompressor().decompress(compressed, max_output_size=raw_len)
    if len(meta) != raw_len:
        raise _Malformed(f"metadata is {len(meta)} bytes, header says {raw_len}")
    has_headers = bool(flags & FLAG_HEADERS)
    fixed = n * (8 * 5 + 4 * (3 if has_headers else 2))
    if fixed > raw_len:
        raise _Malformed(f"{n} messages need {fixed} metadata bytes, have {raw_len}")

    reader = _ColumnReader(meta, n)
    id_deltas = reader.ints("Q")
    if n > 1 and min(id_deltas[1:]) <= 0:
        raise _Malformed("ids do not strictly increase")
    ids = list(accumulate(id_deltas))
    if n and (ids[0] != first_id or ids[-1] != last_id):
        raise _Malformed(f"ids run {ids[0]}..{ids[-1]}, header says {first_id}..{last_id}")
    time_bits = list(accumulate(reader.ints("Q")))
    # Deltas wrap modulo 2**64, so the running sum may pass it; masking is only paid then.
    wrapped = time_bits if not n or max(time_bits) <= _U64_MASK else _masked(time_bits)
    times = _bits_float(wrapped)

    external_ids = ids if reader.zero(8) else _signed(_masked(map(add, ids, reader.ints("Q"))))
    external_times = times if reader.zero(8) else _bits_float(_masked(map(add, time_bits, reader.ints("Q"))))
    segments = [0] * n if reader.zero(8) else reader.ints("q")
    sole_source = reader.zero(4)
    source_ids = [] if sole_source else reader.ints("I")
    payload_lengths = reader.ints("I")
    header_lengths = reader.ints("I") if has_headers else []

    pos = reader.pos
    (source_count,) = _U32.unpack_from(meta, pos)
    pos += _U32.size
    table: list[str] = []
    for _ in range(source_count):
        (length,) = _U16.unpack_from(meta, pos)
        pos += _U16.size
        if pos + length > raw_len:
            raise _Malformed("source table runs past the metadata")
        table.append(_text(meta[pos : pos + length]))
        pos += length
    if sole_source:
        if n and source_count < 1:
            raise _Malformed("source table is empty")
        sources = [table[0]] * n if n else []
    else:
        sources = list(map(table.__getitem__, source_ids))

    headers: list[dict[str, str]] | None = None
    if has_headers:
        headers = []
        for length in header_lengths:
            if not length:
                headers.append(EMPTY_HEADERS)
                continue
            parsed, after = _decode_headers(meta, pos, pos + length)
            if after != pos + length:
                raise _Malformed("header blob has trailing bytes")
            headers.append(parsed)
            pos = after
    if pos != raw_len:
        raise _Malformed(f"metadata has {raw_len - pos} unexplained bytes")
    if sum(payload_lengths) != payload_len:
        raise _Malformed(f"payload lengths sum to {sum(payload_lengths)}, header says {payload_len}")
    columns = Columns(
        ids, times, sources, external_ids, external_times, segments, [], headers or [EMPTY_HEADERS] * n
    )
    return _Meta(meta_len, payload_lengths, columns)


# --- sealed block, format 2 ------------------------------------------------------------

BLOCK_MAGIC = b"CPB2"
BLOCK_VERSION = 2
# magic, version, flags (none yet), message count, batch count, first id, last id, length of
# the batches; the batches follow, then the index, then the footer (``_BLOCK_FOOT``).
_BLOCK2_HEAD = struct.Struct("<4sHHIIQQQ")
# Per batch: first id, byte offset in the block, message count, min and max segment, number
# of sources; each source follows as a u16 length and its UTF-8 bytes.
_INDEX_ENTRY = struct.Struct("<QQIqqH")


def index_entry(batch: RecordBatch, offset: int) -> bytes:
    """The block index's entry for ``batch``, which starts ``offset`` bytes after the block's head.

    The open block makes each entry as its batch is added, so sealing joins bytes and reads
    none of them again.
    """
    found = record_batch.extent(batch)
    try:
        parts = [
            _INDEX_ENTRY.pack(
                batch.base_id,
                _BLOCK2_HEAD.size + offset,
                batch.count,
                found.min_segment,
                found.max_segment,
                len(found.sources),
            )
        ]
        for source in found.sources:
            raw = source.encode()
            parts += (_U16.pack(len(raw)), raw)
    except (struct.error, UnicodeEncodeError, OverflowError) as exc:
        raise InvalidMessage(f"block: a batch's index entry cannot be stored: {exc}") from exc
    return b"".join(parts)


def assemble_block(
    raws: Sequence[Buffer], index: Sequence[Buffer], count: int, first_id: int, last_id: int
) -> bytes:
    """A sealed block of format 2: its batches' bytes (``raws``, in id order) and their
    ``index_entry``s (in parts, as they come), holding ``count`` messages from ``first_id``
    to ``last_id``.

    The caller has checked that the batches' ids strictly increase (``encode_block``, and
    ``OpenBlock.add_batch`` as each batch came): nothing here is done per batch, so sealing a
    block of 10,000 one-message batches holds the GIL for a join, not for 10,000 steps.
    """
    size = sum(map(len, raws))
    head = _BLOCK2_HEAD.pack(BLOCK_MAGIC, BLOCK_VERSION, 0, count, len(raws), first_id, last_id, size)
    entries = b"".join(index)
    total = _BLOCK2_HEAD.size + size + len(entries) + _BLOCK_FOOT.size
    crc = crc32(entries, crc32(head))
    return b"".join((head, *raws, entries, _BLOCK_FOOT.pack(total, BLOCK_END_MAGIC, crc)))


def encode_block(batches: Sequence[RecordBatch]) -> tuple[bytes, list[RecordBatch]]:
    """A sealed block of format 2 holding ``batches`` byte for byte, and the same batches as
    found in the block's bytes. Their ids must strictly increase."""
    if any(a.last_id >= b.base_id for a, b in pairwise(batches)):
        raise ValueError("block batches must have strictly increasing ids")
    index: list[bytes] = []
    offset = 0
    for batch in batches:
        index.append(index_entry(batch, offset))
        offset += batch.end - batch.start
    ids = (batches[0].base_id, batches[-1].last_id) if batches else (0, 0)
    raws = [b.data[b.start : b.end] for b in batches]
    data = assemble_block(raws, index, sum(b.count for b in batches), *ids)
    placed: list[RecordBatch] = []
    at = _BLOCK2_HEAD.size
    for b in batches:
        placed.append(
            msgspec.structs.replace(
                b, data=data, start=at, end=at + b.end - b.start, body=at + b.body - b.start
            )
        )
        at += b.end - b.start
    return data, placed


def block_records(data: Buffer) -> list[RecordBatch] | None:
    """The record batches of a format 2 block, every checksum checked; None for a format 1 block.

    ``CorruptData`` if any byte is wrong: the head and index by the footer's CRC, each batch
    by its own two, and the index against the batches it points at.
    """
    if bytes(data[:4]) == BLOCK_MAGIC_V1:
        return None
    if not isinstance(data, bytes):
        data = bytes(data)
    size = len(data)
    if size < _BLOCK2_HEAD.size + _BLOCK_FOOT.size:
        raise CorruptData(f"block: {size} bytes is too short to be a block")
    magic, version, flags, count, batch_count, first_id, last_id, batches_len = _BLOCK2_HEAD.unpack_from(data)
    if magic != BLOCK_MAGIC:
        raise CorruptData(f"block: bad magic {magic!r}, expected {BLOCK_MAGIC!r} or {BLOCK_MAGIC_V1!r}")
    total, end_magic, crc = _BLOCK_FOOT.unpack_from(data, size - _BLOCK_FOOT.size)
    index_end = size - _BLOCK_FOOT.size
    batches_end = _BLOCK2_HEAD.size + batches_len
    if total != size or end_magic != BLOCK_END_MAGIC:
        raise CorruptData(f"block: truncated or extended: footer says {total} bytes, found {size}")
    if batches_end > index_end:
        raise CorruptData(f"block: batches of {batches_len} bytes do not fit in {size}")
    view = memoryview(data)
    if crc32(view[batches_end:index_end], crc32(view[: _BLOCK2_HEAD.size])) != crc:
        raise CorruptData("block: checksum mismatch")
    if version != BLOCK_VERSION or flags:
        raise CorruptData(f"block: unsupported format version {version} or flags {flags:#06x}")
    try:
        records = _read_index(data, batch_count, batches_end, index_end)
    except (struct.error, UnicodeDecodeError) as exc:
        raise CorruptData(f"block: index does not parse: {exc}") from None
    if sum(r.count for r in records) != count or (
        records and (records[0].base_id, records[-1].last_id) != (first_id, last_id)
    ):
        raise CorruptData(
            f"block: batches disagree with the head ({count} messages, ids {first_id}..{last_id})"
        )
    return records


def _read_index(data: bytes, batch_count: int, batches_end: int, index_end: int) -> list[RecordBatch]:
    records: list[RecordBatch] = []
    pos = batches_end
    at = _BLOCK2_HEAD.size
    last = -1
    for _ in range(batch_count):
        first, offset, count, low, high, source_count = _INDEX_ENTRY.unpack_from(data, pos)
        pos += _INDEX_ENTRY.size
        sources = []
        for _ in range(source_count):
            (length,) = _U16.unpack_from(data, pos)
            pos += _U16.size
            sources.append(data[pos : pos + length].decode())
            pos += length
        if pos > index_end or offset != at:
            raise CorruptData(f"block: index entry for id {first} is past the index or off its batch")
        batch = record_batch.read(data, offset, batches_end)
        if (batch.base_id, batch.count) != (first, count) or batch.base_id <= last:
            raise CorruptData(f"block: batch at offset {offset} is not the one the index names")
        if record_batch.extent(batch) != (sources, low, high):
            raise CorruptData(f"block: index entry for id {first} disagrees with its batch")
        records.append(batch)
        at = batch.end
        last = batch.last_id
    if pos != index_end or at != batches_end:
        raise CorruptData("block: the index and the batches do not fill the block")
    return records


class _ColumnReader:
    """Reads the byte-shuffled columns at the start of the raw metadata, in order."""

    def __init__(self, meta: bytes, n: int) -> None:
        self._meta = meta
        self._n = n
        self.pos = 0

    def zero(self, width: int) -> bool:
        """Skip the next column if it is all zeros (a common case with a faster decode)."""
        size = self._n * width
        if self._meta[self.pos : self.pos + size] != bytes(size):
            return False
        self.pos += size
        return True

    def ints(self, typecode: str) -> list[int]:
        values = array(typecode)
        width = values.itemsize
        n = self._n
        # Undo the byte shuffle: plane i holds byte i of every value.
        raw = bytearray(n * width)
        for plane in range(width):
            start = self.pos + plane * n
            raw[plane::width] = self._meta[start : start + n]
        self.pos += n * width
        values.frombytes(raw)
        if _SWAP:
            values.byteswap()
        return values.tolist()


def _masked(values: Iterable[int]) -> list[int]:
    return list(map(_U64_MASK.__and__, values))


def _bits_float(bits: list[int]) -> list[float]:
    """Floats from their u64 IEEE 754 bit patterns."""
    values = array("d")
    values.frombytes(array("Q", bits).tobytes())
    return values.tolist()


def _signed(values: list[int]) -> list[int]:
    """u64 values read as i64."""
    signed = array("q")
    signed.frombytes(array("Q", values).tobytes())
    return signed.tolist()


def messages_of(columns: Columns) -> list[LogMessage]:
    """The messages whose fields ``columns`` holds, equal to ``LogMessage(...)`` field for field."""
    return list(map(LogMessage, *columns))


@functools.cache
def _zstandard() -> ModuleType:
    """zstandard, imported when the first block is sealed or read: a server whose queues have
    no sealed block yet (the default configuration at start) does not load it."""
    return importlib.import_module("zstandard")
