"""The formats of ``capella.core.log.codec`` that only tests write, and a whole block read back.

Format 1 (``CPJ1`` journals, ``CPB1`` columnar blocks) is what an earlier Capella wrote: Capella
reads it forever and writes format 2, so its encoders live here, beside ``decode_block`` (every
message of a sealed block of either format, which Capella itself reads by columns).
docs/format.md describes every byte.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterable, Sequence
from operator import sub

from capella.core.log.codec import (
    _BLOCK_FOOT,
    _BLOCK_HEAD,
    _FRAME,
    _NO_HEADERS,
    _RECORD,
    _SWAP,
    _U16,
    _U32,
    BLOCK_END_MAGIC,
    BLOCK_MAGIC_V1,
    BLOCK_VERSION_V1,
    FLAG_HEADERS,
    Buffer,
    Columns,
    _masked,
    _zstandard,
    block_columns,
    columns_of,
    messages_of,
)
from capella.core.message import LogMessage
from capella.errors import InvalidMessage
from capella.kernels import crc32
from capella.records import record_batch

_ZSTD_LEVEL = 3
# The foot without its CRC: total block length, end magic.
_BLOCK_FOOT_HEAD = struct.Struct("<Q4s")


def encode_record_v1(m: LogMessage) -> bytes:
    """One frame of a format 1 journal for ``m``."""
    try:
        source = m.source.encode()
        head = _RECORD.pack(m.id, m.time, m.external_id, m.external_time, m.segment, len(source))
        headers = record_batch.encode_headers(m.headers) if m.headers else _NO_HEADERS
        body = b"".join((head, source, headers, m.payload))
        return _FRAME.pack(len(body), crc32(body)) + body
    except (struct.error, UnicodeEncodeError, OverflowError) as exc:
        raise InvalidMessage(f"message {m.id} cannot be stored: {exc}") from exc


def decode_block(data: Buffer) -> list[LogMessage]:
    """Every message in a sealed block of either format; ``CorruptData`` if any byte is wrong."""
    return messages_of(block_columns(data))


def encode_block_v1(messages: Sequence[LogMessage]) -> bytes:
    """A sealed block of format 1 holding ``messages``, whose ids must strictly increase."""
    return encode_columns_v1(columns_of(messages))


def encode_columns_v1(c: Columns) -> bytes:
    """A sealed block of format 1 holding the messages of ``c``."""
    n = len(c.ids)
    ids = c.ids
    id_deltas = [ids[0], *map(sub, ids[1:], ids[:-1])] if n else []
    if n > 1 and min(id_deltas[1:]) <= 0:
        raise ValueError("block messages must have strictly increasing ids")
    try:
        # Building the arrays also checks every value fits its field.
        array("Q", ids)
        times = array("d", c.times)
        external_ids = array("q", c.external_ids)
        external_times = array("d", c.external_times)
        segments = array("q", c.segments)
    except (OverflowError, TypeError) as exc:
        raise InvalidMessage(f"block: a message field is out of range: {exc}") from exc

    # Times are stored as deltas of their IEEE bit patterns: exact, and for close times
    # the deltas are small numbers that compress to a few bits each.
    time_bits = _float_bits(times)
    time_deltas = _deltas(time_bits)
    # The external id is usually the id itself and the external time usually the time,
    # so store the difference: a column of zeros compresses to almost nothing.
    external_id_deltas = _masked(map(sub, external_ids.tolist(), ids))
    external_time_deltas = _masked(map(sub, _float_bits(external_times), time_bits))

    source_index: dict[str, int] = {}
    source_ids = [source_index.setdefault(s, len(source_index)) for s in c.sources]
    try:
        source_table = [_U32.pack(len(source_index))]
        for source in source_index:
            raw = source.encode()
            source_table += (_U16.pack(len(raw)), raw)
        has_headers = any(c.headers)
        header_blobs = (
            [record_batch.encode_headers(h) if h else b"" for h in c.headers] if has_headers else []
        )
        payloads = c.payloads
        columns = [
            _column("Q", id_deltas),
            _column("Q", time_deltas),
            _column("Q", external_id_deltas),
            _column("Q", external_time_deltas),
            _column("q", segments),
            _column("I", source_ids),
            _column("I", map(len, payloads)),
        ]
        if has_headers:
            columns.append(_column("I", map(len, header_blobs)))
    except (struct.error, UnicodeEncodeError, OverflowError) as exc:
        raise InvalidMessage(f"block: a source, header or payload cannot be stored: {exc}") from exc
    raw_meta = b"".join((*columns, *source_table, *header_blobs))
    meta = _zstandard().ZstdCompressor(level=_ZSTD_LEVEL).compress(raw_meta)
    payload_len = sum(map(len, payloads))

    flags = FLAG_HEADERS if has_headers else 0
    first_id, last_id = (ids[0], ids[-1]) if n else (0, 0)
    head = _BLOCK_HEAD.pack(
        BLOCK_MAGIC_V1,
        BLOCK_VERSION_V1,
        flags,
        n,
        0,
        first_id,
        last_id,
        len(meta),
        len(raw_meta),
        payload_len,
    )
    total = _BLOCK_HEAD.size + len(meta) + payload_len + _BLOCK_FOOT.size
    body = b"".join((head, meta, *payloads, _BLOCK_FOOT_HEAD.pack(total, BLOCK_END_MAGIC)))
    return body + _U32.pack(crc32(body))


def _column(typecode: str, values: Iterable[int] | array[int] | array[float]) -> bytes:
    """Pack values little-endian and byte-shuffle them, which lets zstd see the runs."""
    packed = values if isinstance(values, array) else array(typecode, values)
    if _SWAP:
        packed = array(typecode, packed)
        packed.byteswap()
    raw = packed.tobytes()
    width = packed.itemsize
    return b"".join(raw[plane::width] for plane in range(width))


def _deltas(values: list[int]) -> list[int]:
    """Differences of u64 values, modulo 2**64, with the first value kept as is."""
    if not values:
        return []
    return [values[0], *_masked(map(sub, values[1:], values[:-1]))]


def _float_bits(values: array[float]) -> list[int]:
    """The IEEE 754 bit patterns of floats, as u64."""
    bits = array("Q")
    bits.frombytes(values.tobytes())
    return bits.tolist()
