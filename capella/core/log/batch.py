"""A run of stored messages in the forms a read serves: ``LogMessage`` objects, JSON objects, binary frames.

A sealed block's contents are a ``Batch`` in the block store's cache; a read of the open
block, or a filtered read, makes a short-lived one. Each form is made on first use, in bulk
from the columns, and kept with the batch, so a page is a slice of a list; the block store
drops the rendered forms of all but the last few blocks read (``RENDERED_BLOCKS``).

The JSON objects are byte for byte what ``orjson.dumps(stored_message(m))`` gives, made with
one orjson call per column and one join per message instead of a dict per message: numbers
are rendered as a list and split at the commas (a number has none), a source once per
distinct source, and when no payload needs an escape (all ASCII, and orjson rendering them as
one string escaped nothing) each is copied between quotes as it is. A batch holding a payload
that is not UTF-8 falls back to ``stored_message``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import repeat
from typing import Any, TypeVar, cast

import orjson

from capella.core.log.codec import Columns, columns_of, columns_of_records, messages_of
from capella.core.message import LogMessage, stored_message
from capella.kernels import KERNELS
from capella.records.record_batch import RecordBatch, encode_fields, read_all
from capella.wire.frames import encode_frames

# Payloads ``_plain`` checks in one piece.
_CHECKED_AT_ONCE = 512

T = TypeVar("T")


class Batch:
    """Messages in id order; ``ids`` is their ids (a list, or a ``range`` with no gap), for bisecting."""

    __slots__ = ("_columns", "_forms", "_frames", "_json", "_made_records", "_messages", "_records", "ids")

    def __init__(
        self,
        ids: Sequence[int],
        *,
        columns: Columns | None = None,
        messages: list[LogMessage] | None = None,
        records: list[RecordBatch] | None = None,
    ) -> None:
        self.ids = ids
        self._columns = columns
        self._messages = messages
        self._records = records
        self._made_records = False
        self._json: list[bytes] | None = None
        self._frames: list[bytes] | None = None
        # Forms a front door makes of the batch (``form``), by the callable that keys each.
        self._forms: dict[Callable[[Batch], Any], Any] | None = None

    @classmethod
    def of_records(cls, records: list[RecordBatch]) -> Batch:
        """The messages of record batches as stored (a block of format 2, a journal's batches).

        Their ids are a ``range`` when they follow each other with no gap, as in every block
        written since the last crash: a block of 10,000 messages keeps no list of 10,000 ints.
        """
        count = sum(r.count for r in records)
        if records and records[-1].last_id - records[0].base_id + 1 == count:
            return cls(range(records[0].base_id, records[-1].last_id + 1), records=records)
        return cls([i for r in records for i in range(r.base_id, r.base_id + r.count)], records=records)

    @classmethod
    def of_columns(cls, columns: Columns) -> Batch:
        return cls(columns.ids, columns=columns)

    @classmethod
    def of_messages(cls, messages: list[LogMessage], ids: Sequence[int] | None = None) -> Batch:
        return cls([m.id for m in messages] if ids is None else ids, messages=messages)

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def messages(self) -> list[LogMessage]:
        if self._messages is None:
            self._messages = messages_of(self.columns)
        return self._messages

    @property
    def columns(self) -> Columns:
        if self._columns is None:
            if self._records is not None:
                self._columns = columns_of_records(self._records)
            else:
                self._columns = columns_of(self.messages)
        return self._columns

    def record_batches(self) -> list[RecordBatch]:
        """The messages as record batches: as stored when they came as batches, else made once."""
        if self._records is None:
            self._records = read_all(b"".join(encode_fields(self.columns)))
            self._made_records = True
        return self._records

    def json(self) -> list[bytes]:
        """Each message as its StoredMessage JSON object (``stored_message``, rendered).

        Stored record batches go straight to JSON in the C kernel where it is built
        (``capella.kernels``), with no columns in between; the rest in bulk from the columns.
        """
        if self._json is None:
            if KERNELS is not None and self._records is not None and not self._made_records:
                self._json = [obj for r in self._records for obj in _record_json(r)]
            else:
                self._json = _columns_json(self.columns, lambda: self.messages)
        return self._json

    @property
    def rendered(self) -> bool:
        """Whether the batch holds a rendered form now."""
        return self._json is not None or self._frames is not None or self._made_records or bool(self._forms)

    def holds(self, form: Callable[[Batch], object]) -> bool:
        """Whether the batch holds what ``form`` (``Batch.json``, ``frames``, ``record_batches``,
        or the key of a ``Batch.form``) answers, so that calling it costs nothing: stored record
        batches are their own form."""
        if form is Batch.json:
            return self._json is not None
        if form is Batch.frames:
            return self._frames is not None
        if form is Batch.record_batches:
            return self._records is not None
        return self._forms is not None and form in self._forms

    def drop_forms(self) -> None:
        """Forget the rendered forms (the next read that wants one renders it again).

        A batch of stored record batches forgets its columns and messages too: they are
        decoded from the batches again when asked, and otherwise its payloads would be in
        memory twice (in the block's bytes and in the columns).
        """
        self._json = self._frames = self._forms = None
        if self._made_records:
            self._records = None
            self._made_records = False
        elif self._records is not None:
            self._columns = self._messages = None

    def form(self, make: Callable[[Batch], T], key: Callable[[Batch], object] | None = None) -> T:
        """What ``make(self)`` answers, made on first use and kept until ``drop_forms``: a form a
        front door reads in (the Kafka listener's record batches) without core knowing it.

        Kept under ``key`` (``make`` by default): a door's own function that calls ``form``
        keys it by itself, so that it can be a read's ``render`` and ``holds(it)`` answers.
        """
        key = make if key is None else key
        forms = self._forms
        if forms is None:
            forms = self._forms = {}
        elif key in forms:
            return cast(T, forms[key])
        made = forms[key] = make(self)
        return made

    def frames(self) -> list[bytes]:
        """Each message as a frame of the binary read format (``capella.wire.frames``)."""
        if self._frames is None:
            self._frames = encode_frames(*self.columns)
        return self._frames


def _record_json(r: RecordBatch) -> list[bytes]:
    """The JSON objects of one stored record batch: the kernel's, or Python's where it leaves them."""
    assert KERNELS is not None
    rendered = KERNELS.batch_json(r.data, r.body, r.end, r.flags, r.count, r.base_id, r.base_time, r.source)
    if rendered is not None:
        return rendered
    columns = columns_of_records([r])
    return _columns_json(columns, lambda: messages_of(columns))


def _columns_json(c: Columns, messages: Callable[[], list[LogMessage]]) -> list[bytes]:
    """The JSON objects of ``c``: in bulk, or one message at a time when a payload is not UTF-8."""
    rendered = json_objects(c)
    if rendered is None:
        rendered = [orjson.dumps(stored_message(m)) for m in messages()]
    return rendered


def json_objects(c: Columns) -> list[bytes] | None:
    """The StoredMessage JSON objects of ``c`` made in bulk; None when a payload is not UTF-8."""
    n = len(c.ids)
    if not n:
        return []
    if _plain(c.payloads):
        data: Sequence[bytes] = c.payloads
        data_open, data_close = b',"data":"', b'"}'
    else:
        try:
            texts = list(map(bytes.decode, c.payloads))
        except UnicodeDecodeError:
            return None
        data = list(map(orjson.dumps, texts))
        data_open, data_close = b',"data":', b"}"
    ids = _numbers(c.ids)
    times = _numbers(c.times)
    external_ids = ids if c.external_ids is c.ids else _numbers(c.external_ids)
    external_times = times if c.external_times is c.times else _numbers(c.external_times)
    segments = _numbers(c.segments) if any(c.segments) else b"0"
    distinct = {s: orjson.dumps(s) for s in set(c.sources)}
    sources = distinct.popitem()[1] if len(distinct) == 1 else list(map(distinct.__getitem__, c.sources))
    headers = list(map(orjson.dumps, c.headers)) if any(c.headers) else b"{}"
    return _joined(
        [
            b'{"id":',
            ids,
            b',"time":',
            times,
            b',"source":',
            sources,
            b',"external_id":',
            external_ids,
            b',"external_time":',
            external_times,
            b',"segment":',
            segments,
            b',"headers":',
            headers,
            data_open,
            data,
            data_close,
        ]
    )


def _plain(payloads: Sequence[bytes]) -> bool:
    """Whether every payload goes into a JSON string as it is: ASCII in which orjson escapes
    nothing (an escape of '"', '\\' or a control character lengthens the string).

    0.045 µs per message, against 0.11 for a check of each byte; a few hundred payloads at a
    time, so that the copies stay small next to the block (the whole block at once raised the
    peak RSS of the ``versus`` run by 10 MB).
    """
    for start in range(0, len(payloads), _CHECKED_AT_ONCE):
        chunk = b"".join(payloads[start : start + _CHECKED_AT_ONCE])
        if not chunk.isascii() or len(orjson.dumps(chunk.decode("ascii"))) != len(chunk) + 2:
            return False
    return True


def _joined(parts: list[bytes | Sequence[bytes]]) -> list[bytes]:
    """Per message, the join of ``parts``: a bytes part is the same for every message, a
    sequence holds one piece per message. Neighbouring constant parts are joined first,
    since every piece costs a little in every message."""
    merged: list[bytes | Sequence[bytes]] = []
    for part in parts:
        if isinstance(part, bytes) and merged and isinstance(merged[-1], bytes):
            merged[-1] += part
        else:
            merged.append(part)
    columns = [repeat(part) if isinstance(part, bytes) else part for part in merged]
    return list(map(b"".join, zip(*columns, strict=False)))  # the repeats are endless


def _numbers(values: Sequence[int] | Sequence[float]) -> list[bytes]:
    """Each number as orjson renders it: one call for the list, split at the commas."""
    return orjson.dumps(values)[1:-1].split(b",")
