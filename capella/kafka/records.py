"""Kafka record batches (v2) to Capella record batches and back: the listener's one translation of messages.

Produce: ``read_batches`` finds the batches of a partition's ``records`` bytes (lengths and
CRC-32C checked), ``decode_records`` decompresses one (bounded by the server's body limit)
and reads its records, ``to_capella`` makes them one Capella record batch for
``Queue.append_batch``. Fetch: ``render`` makes a ``Batch`` of stored messages uncompressed
Kafka batches, once per batch (kept with it, ``Batch.form``). Kafka batches are never stored:
one batch layout runs from producer to disk (docs/format.md).

The mapping is lossless both ways. A value is the payload (a null value: an empty payload
and the header ``kafka.null`` = ``1``); a key is the header ``kafka.key`` (UTF-8) or
``kafka.key.b64`` (any other bytes), no header for a null key; Kafka headers are Capella
headers when their names are unique, none starts with ``kafka.`` and every value is UTF-8
(not null), otherwise the whole list, Kafka-encoded (``_encode_headers``), base64 in
``kafka.headers.b64``. CreateTime (ms) is the external time (s); one more than
``FUTURE_SKEW`` ahead of ``now`` is clamped to ``now + FUTURE_SKEW``, and a CreateTime the
external time does not give back exactly (a clamped one, or one some 100,000 years from
1970, where a float of seconds holds no ms) is kept in ``kafka.time`` (ms, decimal). An
idempotent producer's batch gives every message the caller's ``source`` and the external id
``(epoch << 32) | sequence``. A message that came any other way (HTTP) reads as a null key,
its headers as Kafka headers, CreateTime its external time (which is its time unless the
producer gave one).

Layout: apache/kafka ``docs/implementation.html`` ("Record Batch"); kafka-python's
``kafka/record/default_records.py`` reads the same bytes. Pure functions, no I/O.
"""

from __future__ import annotations

import base64
import importlib
import io
import struct
import zlib
from collections.abc import Sequence
from types import ModuleType
from typing import Any, NamedTuple

import zstandard

from capella.core.limits import FUTURE_SKEW
from capella.core.log.batch import Batch
from capella.errors import (
    CorruptRecords,
    RecordsTooLarge,
    TransactionsNotSupported,
    UnsupportedCompression,
    UnsupportedRecordFormat,
)
from capella.kernels import KERNELS, crc32c
from capella.records import record_batch

# The headers that carry what a Capella message has no field for.
KEY = "kafka.key"
KEY_B64 = "kafka.key.b64"
NULL = "kafka.null"
HEADERS_B64 = "kafka.headers.b64"
TIME = "kafka.time"
RESERVED_PREFIX = "kafka."

# baseOffset, batchLength, partitionLeaderEpoch, magic, crc, attributes, lastOffsetDelta,
# baseTimestamp, maxTimestamp, producerId, producerEpoch, baseSequence, recordsCount.
HEAD = struct.Struct(">qiibIhiqqqhii")
_CRC = struct.Struct(">I")
_CRC_AT = 17
_CRC_FROM = 21  # the CRC covers the attributes to the end
_LENGTH_FROM = 12  # batchLength counts the bytes after itself
_MAGIC_AT = 16

CODEC_NONE, CODEC_GZIP, CODEC_SNAPPY, CODEC_LZ4, CODEC_ZSTD = range(5)
CODEC_NAMES = {CODEC_GZIP: "gzip", CODEC_SNAPPY: "snappy", CODEC_LZ4: "lz4", CODEC_ZSTD: "zstd"}
ATTR_CODEC = 0x07
ATTR_LOG_APPEND_TIME = 0x08
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20

# What a fetch's batches say of what Capella has no notion of. The leader epoch is 0, what
# kafka-python's builder writes and what the feasibility server (design note §4) served.
LEADER_EPOCH = 0
NO_PRODUCER = -1

# The smallest record: length, attributes, timestamp delta, offset delta, key and value
# lengths, header count, one byte each.
_MIN_RECORD = 7
_INT32_MAX = (1 << 31) - 1
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEAD = 16  # the magic, then two big-endian int32 versions
_BE_I32 = struct.Struct(">i")
# Timestamps a fetch writes stay where a delta between two of them is an int64.
_MS_LIMIT = 1 << 62


class KafkaBatch(NamedTuple):
    """One record batch as a producer sent it: the 61-byte head's fields, and ``records``, the
    bytes after it (compressed as sent)."""

    base_offset: int
    length: int
    leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int
    records: bytes

    @property
    def codec(self) -> int:
        return self.attributes & ATTR_CODEC

    @property
    def log_append_time(self) -> bool:
        return bool(self.attributes & ATTR_LOG_APPEND_TIME)


class KafkaRecord(NamedTuple):
    """One record of a batch: deltas from the batch's base offset and timestamp, nullable key
    and value, and the headers in order (names may repeat, values may be null)."""

    offset_delta: int
    timestamp_delta: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


class Converted(NamedTuple):
    """A Kafka batch as a Capella record batch, and how many CreateTimes were clamped."""

    record_batch: bytes
    clamped: int


class Rendered(NamedTuple):
    """One Kafka batch of a fetch: the ids of its first and last record, and its bytes."""

    first_id: int
    last_id: int
    data: bytes


# --- reading what a producer sends -------------------------------------------------------


def read_batches(data: bytes | memoryview, *, max_size: int) -> list[KafkaBatch]:
    """Every batch in ``data``, which they must fill exactly, each CRC checked.

    ``CorruptRecords`` for anything short, truncated or not matching its CRC (and for no batch
    at all); ``UnsupportedRecordFormat`` for magic 0 or 1; ``TransactionsNotSupported`` for a
    transactional or control batch; ``RecordsTooLarge`` past ``max_size`` bytes.
    """
    if len(data) > max_size:
        raise RecordsTooLarge(f"records of {len(data)} bytes: the limit is {max_size}", limit=max_size)
    view = memoryview(data).cast("B")
    end = len(view)
    if not end:
        raise CorruptRecords("no record batch in the records")
    batches: list[KafkaBatch] = []
    pos = 0
    while pos < end:
        if end - pos < _MAGIC_AT + 1:
            raise CorruptRecords(f"record batch at byte {pos}: {end - pos} bytes is shorter than a head")
        magic = view[pos + _MAGIC_AT]
        if magic != 2:
            raise UnsupportedRecordFormat(f"record batch at byte {pos}: magic {magic}; only v2 (magic 2)")
        if end - pos < HEAD.size:
            raise CorruptRecords(f"record batch at byte {pos}: {end - pos} bytes is shorter than a head")
        head = HEAD.unpack_from(view, pos)
        stop = pos + _LENGTH_FROM + head[1]
        if stop < pos + HEAD.size or stop > end:
            raise CorruptRecords(
                f"record batch at byte {pos}: length {head[1]} does not fit in {end - pos} bytes"
            )
        if crc32c(view[pos + _CRC_FROM : stop]) != head[4]:
            raise CorruptRecords(f"record batch at byte {pos}: CRC-32C mismatch")
        attributes = head[5]
        if attributes & (ATTR_TRANSACTIONAL | ATTR_CONTROL):
            raise TransactionsNotSupported(
                f"record batch at byte {pos}: a {'control' if attributes & ATTR_CONTROL else 'transactional'}"
                " batch; transactions are not supported"
            )
        if not 0 < head[12] <= record_batch.MAX_COUNT:
            raise CorruptRecords(f"record batch at byte {pos}: {head[12]} records")
        batches.append(KafkaBatch._make((*head, bytes(view[pos + HEAD.size : stop]))))
        pos = stop
    return batches


def decode_records(batch: KafkaBatch, *, max_size: int) -> list[KafkaRecord]:
    """The records of ``batch``, decompressed (at most ``max_size`` bytes of them, else
    ``RecordsTooLarge`` before the rest is inflated); ``CorruptRecords`` if they do not parse
    or are not ``batch.records_count``, ``UnsupportedCompression`` for a codec this server lacks."""
    raw = _decompressed(batch, max_size)
    count = batch.records_count
    if count * _MIN_RECORD > len(raw):
        raise CorruptRecords(f"record batch: {count} records cannot fit in {len(raw)} bytes")
    try:
        records, pos = _records(raw, count)
    except (IndexError, ValueError) as exc:
        raise CorruptRecords(f"record batch: the records do not parse: {exc}") from None
    if pos != len(raw):
        raise CorruptRecords(f"record batch: {len(raw) - pos} bytes after its {count} records")
    return records


def _records(raw: bytes, count: int) -> tuple[list[KafkaRecord], int]:
    """``count`` records from the start of ``raw``, and where they end (IndexError or
    ValueError where they do not parse)."""
    records: list[KafkaRecord] = []
    varint = _varint
    pos = 0
    for _ in range(count):
        length, pos = varint(raw, pos)
        start = pos
        pos += 1  # attributes: unused
        timestamp_delta, pos = varint(raw, pos)
        offset_delta, pos = varint(raw, pos)
        size, pos = varint(raw, pos)
        key = None
        if size >= 0:
            key = raw[pos : pos + size]
            pos += size
        elif size != -1:
            raise ValueError(f"a key of {size} bytes")
        size, pos = varint(raw, pos)
        value = None
        if size >= 0:
            value = raw[pos : pos + size]
            pos += size
        elif size != -1:
            raise ValueError(f"a value of {size} bytes")
        header_count, pos = varint(raw, pos)
        headers: list[tuple[str, bytes | None]] = []
        if header_count:
            headers, pos = _headers(raw, pos, header_count)
        if pos - start != length or pos > len(raw):
            raise ValueError(f"a record of {length} bytes holds {pos - start}")
        records.append(KafkaRecord(offset_delta, timestamp_delta, key, value, headers))
    return records, pos


def _headers(raw: bytes, pos: int, count: int) -> tuple[list[tuple[str, bytes | None]], int]:
    if not 0 <= count <= len(raw) - pos:
        raise ValueError(f"{count} headers")
    varint = _varint
    headers: list[tuple[str, bytes | None]] = []
    for _ in range(count):
        size, pos = varint(raw, pos)
        if size < 0 or pos + size > len(raw):
            raise ValueError(f"a header name of {size} bytes")
        name = raw[pos : pos + size].decode()  # UnicodeDecodeError is a ValueError
        pos += size
        size, pos = varint(raw, pos)
        value = None
        if size >= 0:
            value = raw[pos : pos + size]
            pos += size
        elif size != -1:
            raise ValueError(f"a header value of {size} bytes")
        headers.append((name, value))
    return headers, pos


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    """The zigzag varint (or varlong) at ``buf[pos]`` and where it ends."""
    b = buf[pos]
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos + 1
    value = b & 0x7F
    shift = 7
    while True:
        pos += 1
        b = buf[pos]
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return (value >> 1) ^ -(value & 1), pos + 1
        shift += 7
        if shift > 63:
            raise ValueError("a varint longer than ten bytes")


# --- decompression, bounded --------------------------------------------------------------


def _decompressed(batch: KafkaBatch, max_size: int) -> bytes:
    codec, data = batch.codec, batch.records
    if codec == CODEC_NONE:
        return data
    if codec == CODEC_GZIP:
        return _gunzip(data, max_size)
    if codec == CODEC_ZSTD:
        return _unzstd(data, max_size)
    if codec not in CODEC_NAMES:
        raise UnsupportedCompression(f"record batch: compression codec {codec} is not one Kafka defines")
    cramjam = _cramjam(CODEC_NAMES[codec])
    if codec == CODEC_SNAPPY:
        return _unsnappy(cramjam, data, max_size)
    return _unlz4(cramjam, data, max_size)


def _too_large(max_size: int) -> RecordsTooLarge:
    return RecordsTooLarge(f"record batch: more than {max_size} bytes decompressed", limit=max_size)


def _gunzip(data: bytes, max_size: int) -> bytes:
    """gzip members one after another (Java's GZIPInputStream reads them so), never more than
    ``max_size + 1`` bytes out."""
    out: list[bytes] = []
    size = 0
    rest = data
    try:
        while rest:
            inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
            tail = rest
            while not inflater.eof:
                if size > max_size:
                    raise _too_large(max_size)
                # Bounded: what does not fit stays in the inflater (its unconsumed tail).
                chunk = inflater.decompress(tail, max_size + 1 - size)
                if not chunk and not inflater.eof:
                    raise CorruptRecords("record batch: gzip data ends inside its stream")
                size += len(chunk)
                out.append(chunk)
                tail = inflater.unconsumed_tail
            if size > max_size:
                raise _too_large(max_size)
            rest = inflater.unused_data
    except zlib.error as exc:
        raise CorruptRecords(f"record batch: gzip data does not inflate: {exc}") from None
    return b"".join(out)


# Decompressed bytes read from a zstd stream at a time.
_ZSTD_READ = 256 * 1024


def _unzstd(data: bytes, max_size: int) -> bytes:
    """zstd frames, read a chunk at a time; the window a frame may ask for is bounded too (a
    client streaming at any level up to 19 asks for at most 8 MiB; more than the records may
    hold is never needed)."""
    window = max(8 << 20, 1 << (max_size - 1).bit_length())
    out: list[bytes] = []
    size = 0
    try:
        decompressor = zstandard.ZstdDecompressor(max_window_size=window)
        with decompressor.stream_reader(io.BytesIO(data), read_across_frames=True) as reader:
            while True:
                chunk = reader.read(min(_ZSTD_READ, max_size + 1 - size))
                if not chunk:
                    break
                size += len(chunk)
                if size > max_size:
                    raise _too_large(max_size)
                out.append(chunk)
    except zstandard.ZstdError as exc:
        raise CorruptRecords(f"record batch: zstd data does not decompress: {exc}") from None
    return b"".join(out)


def _cramjam(codec: str) -> ModuleType:
    """``cramjam`` (lz4 and snappy), imported on first use; ``UnsupportedCompression`` without it."""
    try:
        return importlib.import_module("cramjam")
    except ImportError:
        raise UnsupportedCompression(
            f"record batch: {codec} needs the cramjam package, which this server does not have"
        ) from None


def _unsnappy(cramjam: Any, data: bytes, max_size: int) -> bytes:
    """Raw snappy (librdkafka) or xerial-framed (the Java client: a 16-byte head, then blocks
    of a big-endian length and raw snappy); every raw block says its size before it inflates."""
    if not data.startswith(_XERIAL_MAGIC):
        return _raw_snappy(cramjam, data, max_size)
    out: list[bytes] = []
    size = 0
    pos = _XERIAL_HEAD
    if len(data) < pos:
        raise CorruptRecords("record batch: a xerial snappy head is cut short")
    while pos < len(data):
        if len(data) - pos < 4:
            raise CorruptRecords("record batch: a xerial snappy block length is cut short")
        (length,) = _BE_I32.unpack_from(data, pos)
        pos += 4
        if length < 0 or pos + length > len(data):
            raise CorruptRecords(f"record batch: a xerial snappy block of {length} bytes runs past the data")
        block = _raw_snappy(cramjam, data[pos : pos + length], max_size - size)
        size += len(block)
        out.append(block)
        pos += length
    return b"".join(out)


def _raw_snappy(cramjam: Any, data: bytes, max_size: int) -> bytes:
    try:
        size = cramjam.snappy.decompress_raw_len(data)
        if size > max_size:
            raise _too_large(max_size)
        return bytes(cramjam.snappy.decompress_raw(data))
    except cramjam.DecompressionError as exc:
        raise CorruptRecords(f"record batch: snappy data does not decompress: {exc}") from None


def _unlz4(cramjam: Any, data: bytes, max_size: int) -> bytes:
    """An LZ4 frame, into a buffer that grows (each try decompresses again) up to
    ``max_size + 1`` bytes: one that fills it is too large, and nothing past it is written."""
    room = min(max_size + 1, max(64 * 1024, 8 * len(data)))
    while True:
        buffer = bytearray(room)
        try:
            size = int(cramjam.lz4.decompress_into(data, buffer))
        except cramjam.DecompressionError as exc:
            # cramjam says so when the frame has more than the buffer holds.
            if "whole buffer" not in str(exc):
                raise CorruptRecords(f"record batch: lz4 data does not decompress: {exc}") from None
            size = room
        if size < room:
            return bytes(memoryview(buffer)[:size])
        if room > max_size:
            raise _too_large(max_size)
        room = min(max_size + 1, room * 4)


# --- Kafka to Capella ---------------------------------------------------------------------


def to_capella(
    batch: KafkaBatch, records: Sequence[KafkaRecord], *, now: float, source: str | None
) -> Converted:
    """``records`` (of ``batch``) as one Capella record batch, under the module's mapping.

    ``source``: an idempotent producer's (the caller's ``<queue.own>/kafka/<pid>``), given for a
    batch with a producer id; every message then has it, and the external id
    ``(epoch << 32) | sequence``. A LogAppendTime batch carries no CreateTime: the external
    times stay the default. ``now``: the clock a CreateTime is clamped by. ``CorruptRecords``
    for a ``source`` with a batch of no epoch or sequence.
    """
    n = len(records)
    payloads: list[bytes] = []
    headers: list[dict[str, str]] = []
    times: list[float | None] | None = None if batch.log_append_time else []
    ceiling = now + FUTURE_SKEW
    ceiling_ms = ceiling * 1000.0
    base_timestamp = batch.base_timestamp
    clamped = 0
    for r in records:
        h: dict[str, str] = {}
        key = r.key
        if key is not None:
            try:
                h[KEY] = key.decode()
            except UnicodeDecodeError:
                h[KEY_B64] = base64.b64encode(key).decode("ascii")
        value = r.value
        if value is None:
            h[NULL] = "1"
            value = b""
        if r.headers:
            _put_headers(h, r.headers)
        if times is not None:
            ms = base_timestamp + r.timestamp_delta
            if ms > ceiling_ms:
                h[TIME] = str(ms)
                clamped += 1
                times.append(ceiling)
            else:
                seconds = ms / 1000.0
                if round(seconds * 1000.0) != ms:  # only far from now: a float of seconds has ~15 digits
                    h[TIME] = str(ms)
                times.append(seconds)
        payloads.append(value)
        headers.append(h)
    sources: list[str | None] | None = None
    external_ids: list[int | None] | None = None
    if source is not None:
        if batch.base_sequence < 0 or batch.producer_epoch < 0:
            # Such external ids would repeat, and dedup would drop new messages as repeats.
            raise CorruptRecords(
                f"record batch of producer {batch.producer_id}: epoch {batch.producer_epoch}, "
                f"sequence {batch.base_sequence}"
            )
        sources = [source] * n
        epoch = batch.producer_epoch << 32
        external_ids = [epoch | _sequence(batch.base_sequence, i) for i in range(n)]
    encoded = record_batch.encode(
        payloads, sources=sources, external_ids=external_ids, external_times=times, headers=headers
    )
    return Converted(encoded, clamped)


def _sequence(base: int, i: int) -> int:
    """Record ``i``'s sequence: Kafka's sequences wrap from int32's largest to 0."""
    return (base + i) % (_INT32_MAX + 1) if base + i > _INT32_MAX else base + i


def _put_headers(h: dict[str, str], headers: list[tuple[str, bytes | None]]) -> None:
    """Kafka headers as Capella's where they can be that (unique, not reserved, UTF-8), else
    the whole list in ``kafka.headers.b64``."""
    plain: dict[str, str] = {}
    for name, value in headers:
        if value is None or name in plain or name.startswith(RESERVED_PREFIX):
            break
        try:
            plain[name] = value.decode()
        except UnicodeDecodeError:
            break
    else:
        h.update(plain)
        return
    h[HEADERS_B64] = base64.b64encode(_encode_headers(headers)).decode("ascii")


def _encode_headers(headers: Sequence[tuple[str, bytes | None]]) -> bytes:
    """Headers as a Kafka record holds them: a count, then each name and nullable value, each
    with a zigzag varint length (-1: null)."""
    parts = [_zigzag(len(headers))]
    for name, value in headers:
        raw = name.encode()
        parts += (_zigzag(len(raw)), raw)
        if value is None:
            parts.append(_NULL_LENGTH)
        else:
            parts += (_zigzag(len(value)), value)
    return b"".join(parts)


def decode_headers_b64(text: str) -> list[tuple[str, bytes | None]]:
    """``kafka.headers.b64``'s list (ValueError if it is not one)."""
    raw = base64.b64decode(text, validate=True)
    count, pos = _varint(raw, 0)
    headers, pos = _headers(raw, pos, count)
    if pos != len(raw):
        raise ValueError("bytes after the headers")
    return headers


# --- Capella to Kafka (fetch) -------------------------------------------------------------


def _zigzag_uncached(value: int) -> bytes:
    z = value << 1 if value >= 0 else ((-value) << 1) - 1
    out = bytearray()
    while z >= 0x80:
        out.append(z & 0x7F | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


# The zigzag varints of -8192..8191 (one or two bytes): lengths and deltas are nearly always these.
_SMALL = 8192
_SMALL_VARINTS = [_zigzag_uncached(v) for v in range(-_SMALL, _SMALL)]
_NULL_LENGTH = _zigzag_uncached(-1)
_ZERO = _zigzag_uncached(0)


def _zigzag(value: int) -> bytes:
    if -_SMALL <= value < _SMALL:
        return _SMALL_VARINTS[value + _SMALL]
    return _zigzag_uncached(value)


def render(batch: Batch) -> list[Rendered]:
    """The messages of ``batch`` as uncompressed Kafka batches, made once per ``Batch`` and kept
    with it (``Batch.form``, dropped with its other forms): so ``render`` can be a read's
    ``render`` (``Queue.read_page``), and ``batch.holds(render)`` says whether it is made.

    One Kafka batch per stored record batch, or per run of consecutive ids for messages that
    did not come as batches; each record's offset is its id (``baseOffset`` the first id, the
    deltas may have gaps).
    """
    return batch.form(_render, key=render)


def _render(batch: Batch) -> list[Rendered]:
    if batch.holds(Batch.record_batches):
        # Stored record batches keep their bounds (a fetch answers whole batches), and each is
        # decoded on its own: the batch's columns would be a second copy of every payload kept
        # beside the rendering.
        rendered = []
        for r in batch.record_batches():
            made = (
                KERNELS.kafka_batch_records(
                    _parts, r.data, r.body, r.end, r.flags, r.count, r.base_id, r.base_time
                )
                if KERNELS is not None
                else None
            )
            if made is None:
                f = r.fields()
                made = _records_of(f.ids, f.external_times, f.payloads, f.headers, 0, r.count)
            rendered.append(_kafka_batch(r.base_id, r.last_id, r.count, made))
        return rendered
    c = batch.columns
    rendered = []
    start = 0
    for count in _runs(c.ids) if c.ids else []:
        stop = start + count
        made = (
            KERNELS.kafka_records(c.ids, c.external_times, c.payloads, c.headers, start, stop, _parts)
            if KERNELS is not None
            else None
        )
        if made is None:
            made = _records_of(c.ids, c.external_times, c.payloads, c.headers, start, stop)
        rendered.append(_kafka_batch(c.ids[start], c.ids[stop - 1], stop - start, made))
        start = stop
    return rendered


def _runs(ids: Sequence[int]) -> list[int]:
    """The lengths of the runs of consecutive ids."""
    runs: list[int] = []
    start = 0
    for i in range(1, len(ids)):
        if ids[i] != ids[i - 1] + 1:
            runs.append(i - start)
            start = i
    runs.append(len(ids) - start)
    return runs


def _create_times(external_times: Sequence[float]) -> list[int]:
    """Each message's CreateTime in ms: its external time (its time unless a producer gave one)."""
    times = [round(t * 1000.0) for t in external_times]
    if times and not -_MS_LIMIT <= min(times) <= max(times) <= _MS_LIMIT:
        times = [min(max(t, -_MS_LIMIT), _MS_LIMIT) for t in times]
    return times


def _kafka_batch(first_id: int, last_id: int, count: int, made: tuple[bytes, int, int]) -> Rendered:
    """The Kafka batch of ``count`` records (``made``: their bytes, first and greatest CreateTime)."""
    blob, base_time, max_time = made
    head = HEAD.pack(
        first_id,
        HEAD.size - _LENGTH_FROM + len(blob),
        LEADER_EPOCH,
        2,
        0,
        0,
        last_id - first_id,
        base_time,
        max_time,
        NO_PRODUCER,
        -1,
        -1,
        count,
    )
    crc = crc32c(blob, crc32c(memoryview(head)[_CRC_FROM:]))
    return Rendered(first_id, last_id, b"".join((head[:_CRC_AT], _CRC.pack(crc), head[_CRC_FROM:], blob)))


def _records_of(
    ids: Sequence[int],
    external_times: Sequence[float],
    payloads: Sequence[bytes],
    headers: Sequence[dict[str, str]],
    start: int,
    stop: int,
) -> tuple[bytes, int, int]:
    """The records of messages ``start..stop`` and their first and greatest CreateTime: what the
    ``kafka_records`` kernel makes (``capella/kernels.py``), in Python."""
    zigzag = _zigzag
    times = _create_times(external_times[start:stop])
    first_id = ids[start]
    base_time = max_time = 0
    parts: list[bytes] = []
    for i in range(start, stop):
        h = headers[i]
        value: bytes | None = payloads[i]
        ms = times[i - start]
        if h:
            key_part, value, ms, header_part = _parts(h, payloads[i], ms)
        else:
            key_part = _NULL_LENGTH
            header_part = _ZERO
        if i == start:
            base_time = max_time = ms
        elif ms > max_time:
            max_time = ms
        value_part = _NULL_LENGTH if value is None else zigzag(len(value))
        body = b"".join(
            (
                b"\x00",
                zigzag(ms - base_time),
                zigzag(ids[i] - first_id),
                key_part,
                value_part,
                b"" if value is None else value,
                header_part,
            )
        )
        parts += (zigzag(len(body)), body)
    return b"".join(parts), base_time, max_time


def _parts(h: dict[str, str], payload: bytes, ms: int) -> tuple[bytes, bytes | None, int, bytes]:
    """A message with headers as its Kafka record's key (length first), value, CreateTime and
    headers (count first)."""
    key, value, ms, kafka_headers = _reversed(h, payload, ms)
    key_part = _NULL_LENGTH if key is None else _zigzag(len(key)) + key
    return key_part, value, ms, _encode_headers(kafka_headers) if kafka_headers else _ZERO


def _reversed(
    h: dict[str, str], payload: bytes, ms: int
) -> tuple[bytes | None, bytes | None, int, list[tuple[str, bytes | None]]]:
    """A message's Kafka key, value, CreateTime and headers from its Capella headers.

    A reserved header that does not parse as the mapping writes it (a message produced over
    HTTP may carry anything) stays an ordinary header.
    """
    key: bytes | None = None
    value: bytes | None = payload
    listed: list[tuple[str, bytes | None]] = []
    others: list[tuple[str, bytes | None]] = []
    for name, text in h.items():
        if name.startswith(RESERVED_PREFIX):
            if name == KEY:
                key = text.encode()
                continue
            if name == KEY_B64:
                try:
                    key = base64.b64decode(text, validate=True)
                    continue
                except ValueError:  # binascii.Error, or a text that is not ASCII
                    pass
            elif name == NULL:
                if text == "1" and not payload:
                    value = None
                    continue
            elif name == TIME:
                try:
                    ms = min(max(int(text), -_MS_LIMIT), _MS_LIMIT)
                    continue
                except ValueError:
                    pass
            elif name == HEADERS_B64:
                try:
                    listed = decode_headers_b64(text)
                    continue
                except (ValueError, IndexError):
                    pass
        others.append((name, text.encode()))
    return key, value, ms, listed + others if others else listed
