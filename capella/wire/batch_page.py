"""Record batches over HTTP: the binary produce body and the binary read page (format 2).

A producer sends ``Content-Type: application/vnd.capella.batch``: one or more record batches
(``capella.records.record_batch``) back to back. A reader asks for ``Accept:
application/vnd.capella.batches`` and gets a 20-byte page head (``CPP2``) and then record
batches: the server's cached bytes for whole batches, re-framed only at a page's edges.
docs/format.md ("Binary read page, format 2") describes the head; all integers are
little-endian. ``decode_page`` turns a page into the ``StoredMessage`` structs a JSON answer
decodes to, so the client's two forms give equal values.
"""

from __future__ import annotations

from capella.errors import CorruptData
from capella.kernels import KERNELS
from capella.records import record_batch
from capella.wire import frames
from capella.wire.frames import read_page_head
from capella.wire.messages import StoredMessage, stored_of

BATCH_MEDIA_TYPE = "application/vnd.capella.batch"
PAGE_MEDIA_TYPE = "application/vnd.capella.batches"
MAGIC = b"CPP2"
VERSION = 2

# magic, version, flags (0), message count, last_id: the CPM1 head's shape.
PAGE_HEAD = frames.PAGE_HEAD


def page_head(count: int, last_id: int) -> bytes:
    """The head of a page of ``count`` messages whose reader goes on after ``last_id``."""
    return PAGE_HEAD.pack(MAGIC, VERSION, 0, count, last_id)


def decode_page(body: bytes) -> tuple[list[StoredMessage], int]:
    """The messages of a page and its ``last_id``; ``CorruptData`` if the bytes do not parse.

    Each message is the ``StoredMessage`` a JSON answer gives: ``data`` for a UTF-8 payload,
    ``data_b64`` for any other bytes.
    """
    count, last_id = read_page_head(body, MAGIC, VERSION, "batch page")
    messages: list[StoredMessage] = []
    for b in record_batch.read_all(body, PAGE_HEAD.size):
        made = None
        if KERNELS is not None:
            made = KERNELS.batch_messages(
                StoredMessage, b.data, b.body, b.end, b.flags, b.count, b.base_id, b.base_time, b.source
            )
        messages += map(stored_of, *b.fields()) if made is None else made
    if len(messages) != count:
        raise CorruptData(f"batch page: its head counts {count} messages, its batches hold {len(messages)}")
    return messages, last_id
