"""Record batches over HTTP: the binary produce body and the binary read page (format 2).

A producer sends ``Content-Type: application/vnd.capella.batch``: one or more record batches
(``capella.wire.record_batch``) back to back. A reader asks for ``Accept:
application/vnd.capella.batches`` and gets a 20-byte page head (``CPP2``) and then record
batches: the server's cached bytes for whole batches, re-framed only at a page's edges.
docs/format.md ("Binary read page, format 2") describes the head; all integers are
little-endian. ``decode_page`` turns a page into the ``StoredMessage`` structs a JSON answer
decodes to, so the client's two forms give equal values.
"""

from __future__ import annotations

import struct
from base64 import b64encode

from capella.errors import CorruptData
from capella.wire import record_batch
from capella.wire.messages import StoredMessage

BATCH_MEDIA_TYPE = "application/vnd.capella.batch"
PAGE_MEDIA_TYPE = "application/vnd.capella.batches"
MAGIC = b"CPP2"
VERSION = 2

# magic, version, flags (0), message count, last_id: the CPM1 head's shape.
PAGE_HEAD = struct.Struct("<4sHHIQ")


def page_head(count: int, last_id: int) -> bytes:
    """The head of a page of ``count`` messages whose reader goes on after ``last_id``."""
    return PAGE_HEAD.pack(MAGIC, VERSION, 0, count, last_id)


def decode_page(body: bytes) -> tuple[list[StoredMessage], int]:
    """The messages of a page and its ``last_id``; ``CorruptData`` if the bytes do not parse.

    Each message is the ``StoredMessage`` a JSON answer gives: ``data`` for a UTF-8 payload,
    ``data_b64`` for any other bytes.
    """
    size = len(body)
    if size < PAGE_HEAD.size:
        raise CorruptData(f"batch page: {size} bytes is shorter than its {PAGE_HEAD.size}-byte head")
    magic, version, _, count, last_id = PAGE_HEAD.unpack_from(body)
    if magic != MAGIC:
        raise CorruptData(f"batch page: bad magic {magic!r}, expected {MAGIC!r}")
    if version != VERSION:
        raise CorruptData(f"batch page: unsupported format version {version}")
    messages: list[StoredMessage] = []
    append = messages.append
    for batch in record_batch.read_all(body, PAGE_HEAD.size):
        f = batch.fields()
        for mid, time, source, external_id, external_time, segment, payload, headers in zip(*f, strict=True):
            try:
                text = payload.decode()
            except UnicodeDecodeError:
                append(
                    StoredMessage(
                        mid,
                        time,
                        source,
                        external_id,
                        external_time,
                        segment,
                        headers,
                        data_b64=b64encode(payload).decode("ascii"),
                    )
                )
            else:
                append(StoredMessage(mid, time, source, external_id, external_time, segment, headers, text))
    if len(messages) != count:
        raise CorruptData(f"batch page: its head counts {count} messages, its batches hold {len(messages)}")
    return messages, last_id
