"""The binary read format: a page of messages as a head and one length-prefixed frame each.

A reader asks for it with ``Accept: application/vnd.capella.messages``; docs/format.md
describes every byte. The server makes frames in bulk from a block's columns
(``encode_frames``: one ``struct`` call and one join per message, no Python loop) and serves
a page as the head plus slices of them; the client turns a page back into the same
``StoredMessage`` structs a JSON answer decodes to (``decode_page``). All integers are
little-endian.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from itertools import repeat
from operator import add

import orjson

from capella.errors import CorruptData
from capella.wire.messages import StoredMessage, stored_of

MEDIA_TYPE = "application/vnd.capella.messages"
MAGIC = b"CPM1"
VERSION = 1

# magic, version, flags (0), message count, last_id.
PAGE_HEAD = struct.Struct("<4sHHIQ")
# frame length (the bytes after this field), id, time, external_id, external_time, segment,
# source length, headers length, payload length; source, headers and payload follow.
FRAME_HEAD = struct.Struct("<IQdqdqHII")
_AFTER_LENGTH = FRAME_HEAD.size - 4


def page_head(count: int, last_id: int) -> bytes:
    """The head of a page of ``count`` frames whose reader goes on after ``last_id``."""
    return PAGE_HEAD.pack(MAGIC, VERSION, 0, count, last_id)


def encode_frames(
    ids: Sequence[int],
    times: Sequence[float],
    sources: Sequence[str],
    external_ids: Sequence[int],
    external_times: Sequence[float],
    segments: Sequence[int],
    payloads: Sequence[bytes],
    headers: Sequence[dict[str, str]],
) -> list[bytes]:
    """One frame per message, given as columns (the fields in ``Message`` order).

    Headers are the UTF-8 JSON object of the message's headers, or nothing when it has none.
    """
    table = {s: s.encode() for s in set(sources)}
    source_bytes = list(map(table.__getitem__, sources))
    header_bytes = list(map(_header_json, headers)) if any(headers) else [b""] * len(ids)
    source_lengths = list(map(len, source_bytes))
    header_lengths = list(map(len, header_bytes))
    payload_lengths = list(map(len, payloads))
    variable = map(add, map(add, source_lengths, header_lengths), payload_lengths)
    lengths = map(add, repeat(_AFTER_LENGTH), variable)
    heads = map(
        FRAME_HEAD.pack,
        lengths,
        ids,
        times,
        external_ids,
        external_times,
        segments,
        source_lengths,
        header_lengths,
        payload_lengths,
    )
    return list(map(b"".join, zip(heads, source_bytes, header_bytes, payloads, strict=True)))


def _header_json(headers: dict[str, str]) -> bytes:
    return orjson.dumps(headers) if headers else b""


def read_page_head(body: bytes, magic: bytes, version: int, what: str) -> tuple[int, int]:
    """The message count and ``last_id`` of a page head (this one's, or the batch page's of
    the same shape); ``CorruptData`` if it is short or of another magic or version."""
    size = len(body)
    if size < PAGE_HEAD.size:
        raise CorruptData(f"{what}: {size} bytes is shorter than its {PAGE_HEAD.size}-byte head")
    found, found_version, _, count, last_id = PAGE_HEAD.unpack_from(body)
    if found != magic:
        raise CorruptData(f"{what}: bad magic {found!r}, expected {magic!r}")
    if found_version != version:
        raise CorruptData(f"{what}: unsupported format version {found_version}")
    return count, last_id


def decode_page(body: bytes) -> tuple[list[StoredMessage], int]:
    """The messages of a page and its ``last_id``; ``CorruptData`` if the bytes do not parse.

    Each message is the ``StoredMessage`` a JSON answer gives: ``data`` for a UTF-8 payload,
    ``data_b64`` for any other bytes.
    """
    size = len(body)
    count, last_id = read_page_head(body, MAGIC, VERSION, "binary page")
    messages: list[StoredMessage] = []
    append = messages.append
    unpack = FRAME_HEAD.unpack_from
    pos = PAGE_HEAD.size
    try:
        for _ in range(count):
            length, mid, time, external_id, external_time, segment, slen, hlen, plen = unpack(body, pos)
            start = pos + FRAME_HEAD.size
            pos += 4 + length
            headers_at = start + slen
            payload_at = headers_at + hlen
            if payload_at + plen > pos or pos > size:
                raise CorruptData(f"binary page: frame of message {mid} runs past its end")
            source = body[start:headers_at].decode()
            headers = orjson.loads(body[headers_at:payload_at]) if hlen else {}
            payload = body[payload_at : payload_at + plen]
            append(stored_of(mid, time, source, external_id, external_time, segment, payload, headers))
    except (struct.error, UnicodeDecodeError, orjson.JSONDecodeError) as exc:
        raise CorruptData(f"binary page: a frame does not parse: {exc}") from None
    if pos != size:
        raise CorruptData(f"binary page: {size - pos} bytes after the last of {count} frames")
    return messages, last_id
