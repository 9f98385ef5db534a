"""The C kernels (capella/kernels.py) against their pure-Python equivalents, on generated input.

``make test`` runs this module twice: with the kernels built (``CAPELLA_EXPECT_EXTENSIONS=1``:
their absence is a failure, not a skip) and with ``CAPELLA_NO_EXTENSIONS=1``, where the
module checks that the switch leaves them out.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec.structs import replace
from support.batches import PAYLOADS, SOURCES, drafts, stored

from capella.core.log.batch import Batch
from capella.core.log.codec import columns_of_records, messages_of
from capella.core.message import stored_message
from capella.errors import CorruptData
from capella.kernels import KERNELS, crc32
from capella.records import record_batch
from capella.records.record_batch import RecordBatch, encode, encode_fields, read, read_all, stamp
from capella.wire import batch_page
from capella.wire.messages import StoredMessage, stored_of

SWITCHED_OFF = os.environ.get("CAPELLA_NO_EXTENSIONS", "") not in ("", "0")

# Times orjson writes as repr does (plain decimals): the kernel renders these itself.
PLAIN_TIMES = st.floats(1e-4, 1e16, exclude_max=True) | st.floats(-1e16, -1e-4, exclude_min=True)
TEXTS = st.text(max_size=300).map(str.encode)


def test_the_switch_and_the_build() -> None:
    if SWITCHED_OFF:
        assert KERNELS is None
    elif os.environ.get("CAPELLA_EXPECT_EXTENSIONS") == "1":
        assert KERNELS is not None, "capella._kernels was not built: pip install -e . needs gcc and Python.h"


kernels = pytest.mark.skipif(KERNELS is None, reason="the C kernels are not built or switched off")


def python_json(r: RecordBatch) -> list[bytes]:
    """What the API renders for each message of ``r``: the definition the kernel must match."""
    return [orjson.dumps(stored_message(m)) for m in messages_of(columns_of_records([r]))]


def kernel_json(r: RecordBatch) -> list[bytes] | None:
    assert KERNELS is not None
    return KERNELS.batch_json(r.data, r.body, r.end, r.flags, r.count, r.base_id, r.base_time, r.source)


def python_messages(r: RecordBatch) -> list[StoredMessage]:
    """What the client makes of each message of ``r`` in a binary page (``decode_page``'s Python path)."""
    return list(map(stored_of, *r.fields()))


def kernel_messages(r: RecordBatch) -> list[StoredMessage] | None:
    assert KERNELS is not None
    return KERNELS.batch_messages(
        StoredMessage, r.data, r.body, r.end, r.flags, r.count, r.base_id, r.base_time, r.source
    )


# Each kernel, and the Python path it must agree with.
KINDS: dict[str, tuple[Callable[[RecordBatch], list[Any] | None], Callable[[RecordBatch], list[Any]]]] = {
    "json": (kernel_json, python_json),
    "messages": (kernel_messages, python_messages),
}


@kernels
@settings(max_examples=300, deadline=None)
@given(stored(max_size=12))
def test_a_rendered_batch_is_what_python_renders_or_left_to_it(fields: record_batch.Fields) -> None:
    for r in read_all(b"".join(encode_fields(fields))):
        rendered = kernel_json(r)
        assert rendered is None or rendered == python_json(r)


@kernels
@settings(max_examples=200, deadline=None)
@given(drafts(max_size=10), PLAIN_TIMES, st.data())
def test_a_cut_batch_renders_and_decodes_as_its_slice_of_the_whole(
    columns: dict[str, list[object]], base_time: float, data: st.DataObject
) -> None:
    # A page's edge (record_batch.cut) keeps the source table whole and columns the slice
    # leaves at their defaults (a bitmap with no bit set): both kernels read it as Python does.
    n = len(columns["payloads"])
    columns["payloads"] = [data.draw(TEXTS) for _ in range(n)]
    columns["external_times"] = [data.draw(st.none() | PLAIN_TIMES) for _ in range(n)]
    whole = read(stamp(read(encode(**columns)), 50, base_time, "edge"))  # type: ignore[arg-type]
    skip = data.draw(st.integers(0, n - 1))
    take = data.draw(st.integers(1, n - skip))
    part = read(record_batch.cut(whole, skip, take))
    assert kernel_json(part) == python_json(part) == python_json(whole)[skip : skip + take]
    assert kernel_messages(part) == python_messages(part) == python_messages(whole)[skip : skip + take]


@kernels
@settings(max_examples=300, deadline=None)
@given(drafts(max_size=10), st.integers(0, 2**63), PLAIN_TIMES, SOURCES, st.data())
def test_utf8_messages_with_plain_times_are_all_rendered_by_the_kernel(
    columns: dict[str, list[object]], base_id: int, base_time: float, source: str, data: st.DataObject
) -> None:
    # Every field that can be given, given or not; payloads of any text, escapes included.
    n = len(columns["payloads"])
    columns["payloads"] = [data.draw(TEXTS) for _ in range(n)]
    columns["external_times"] = [data.draw(st.none() | PLAIN_TIMES | st.just(0.0)) for _ in range(n)]
    r = read(stamp(read(encode(**columns)), base_id, base_time, source))  # type: ignore[arg-type]
    assert kernel_json(r) == python_json(r)


@kernels
@settings(max_examples=200, deadline=None)
@given(st.lists(PAYLOADS, min_size=1, max_size=10))
def test_a_payload_that_is_not_utf8_is_left_to_python(payloads: list[bytes]) -> None:
    r = read(stamp(read(encode(payloads)), 1, 1_800_000_000.5, "edge"))
    rendered = kernel_json(r)
    readable = all(_utf8(p) for p in payloads)
    assert (rendered is not None) == readable
    if rendered is not None:
        assert rendered == python_json(r)


# UTF-8 at its edges: each first byte's range, overlong forms, surrogates, past U+10FFFF, cut short.
EDGES = [
    b"\x7f", b"\xc2\x80", b"\xdf\xbf", b"\xc0\xaf", b"\xc1\xbf", b"\xe0\xa0\x80", b"\xe0\x9f\xbf",
    b"\xed\x9f\xbf", b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xee\x80\x80", b"\xef\xbf\xbf",
    b"\xf0\x90\x80\x80", b"\xf0\x8f\xbf\xbf", b"\xf4\x8f\xbf\xbf", b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80",
    b"\xe2\x82", b"\xf0\x9f\x98", b"\x80", b"\xbf", b"\xff", b"\xe2\x28\xa1", b"\x00", b"\x1f", b'"', b"\\",
]  # fmt: skip


@kernels
@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.sampled_from(EDGES) | st.binary(max_size=9)).map(b"".join), min_size=1))
def test_the_kernel_takes_exactly_the_utf8_python_takes(payloads: list[bytes]) -> None:
    r = read(stamp(read(encode(payloads)), 1, 2.5, "edge"))
    rendered = kernel_json(r)
    assert (rendered is not None) == all(map(_utf8, payloads))
    if rendered is not None:
        assert rendered == python_json(r)


@kernels
@pytest.mark.parametrize("time", [0.0, -0.0, 1e-4, 0.00012, 123.456, 1_795_690_850.0, 9999999999999998.0])
def test_times_at_the_edges_of_the_plain_notation(time: float) -> None:
    r = read(stamp(read(encode([b"x"], external_times=[time])), 5, time, "s"))
    assert kernel_json(r) == python_json(r)


@kernels
@pytest.mark.parametrize("time", [1e16, 1e-5, 5e-324, 1.5e300, float("inf"), float("-inf")])
def test_times_orjson_writes_otherwise_are_left_to_python(time: float) -> None:
    r = read(stamp(read(encode([b"x"])), 5, time, "s"))
    assert kernel_json(r) is None
    r = read(stamp(read(encode([b"x"], external_times=[time])), 5, 1.5, "s"))
    assert kernel_json(r) is None


def reframed(body: bytes, flags: int, count: int) -> bytes:
    return record_batch._framed(flags, count, 1, 2.5, "s", body, zlib.crc32(body))


@kernels
@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200), st.integers(0, 0x3F), st.integers(1, 40))
def test_a_body_that_lies_is_left_to_python_which_refuses_it(
    kind: str, body: bytes, flags: int, count: int
) -> None:
    kernel, python = KINDS[kind]
    try:
        r = read(reframed(body, flags, count))
    except CorruptData:
        return
    try:
        expected: list[Any] | None = python(r)
    except CorruptData:
        expected = None
    made = kernel(r)
    assert made is None or made == expected


@kernels
@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=300, deadline=None)
@given(drafts(max_size=6), st.data())
def test_a_damaged_body_is_never_read_past_its_end(
    kind: str, columns: dict[str, list[object]], data: st.DataObject
) -> None:
    """The kernels trust nothing they are given: any offsets, any count, any bytes."""
    raw = encode(**columns)  # type: ignore[arg-type]
    good = read(raw)
    body = data.draw(st.integers(-5, len(raw) + 5))
    end = data.draw(st.integers(-5, len(raw) + 5))
    count = data.draw(st.sampled_from([good.count, good.count + 1, max(1, good.count - 1), 2**24, 2**32 - 1]))
    made = KINDS[kind][0](replace(good, body=body, end=end, count=count))
    if made is not None:
        assert 0 <= body <= end <= len(raw) and len(made) == count


@kernels
@pytest.mark.parametrize("kind", KINDS)
def test_a_full_source_table_is_read_to_its_last_entry(kind: str) -> None:
    """65,535 entries (the u16 count's most): a counter of the table's width would wrap."""
    last = 0xFFFF
    body = b"".join(
        [
            struct.pack("<I", 1),  # one payload of 1 byte
            struct.pack("<H", last),
            struct.pack("<H", 0) * (last - 1),  # empty sources, then the last one
            struct.pack("<H", 4) + b"last",
            struct.pack("<H", last),  # the message's source: the table's last entry
            b"x",
        ]
    )
    r = read(record_batch._framed(record_batch.FLAG_SOURCES, 1, 1, 2.5, "s", body, zlib.crc32(body)))
    kernel, python = KINDS[kind]
    assert kernel(r) == python(r)
    assert python_messages(r)[0].source == "last"


@kernels
def test_a_header_map_with_a_repeated_key_is_left_to_python() -> None:
    good = read(stamp(read(encode([b"x"], headers=[{"ab": "1", "cd": "2"}])), 1, 2.5, "s"))
    assert kernel_json(good) == python_json(good)
    raw = good.data.replace(b"\x02\x00cd", b"\x02\x00ab")
    body = raw[good.body : good.end]
    twice = read(record_batch._framed(good.flags, 1, 1, 2.5, "s", body, zlib.crc32(body)))
    with pytest.raises(CorruptData):
        python_json(twice)
    assert kernel_json(twice) is None
    assert kernel_messages(good) == python_messages(good)
    assert kernel_messages(twice) is None


@kernels
@settings(max_examples=300, deadline=None)
@given(stored(max_size=12))
def test_made_messages_are_what_python_makes_or_left_to_it(fields: record_batch.Fields) -> None:
    for r in read_all(b"".join(encode_fields(fields))):
        made = kernel_messages(r)
        assert (made is not None) == all(map(_utf8, r.fields().payloads))
        if made is not None:
            assert made == python_messages(r)
            assert [m.headers for m in made] == r.fields().headers
            # Each message its own headers: changing one changes no other.
            assert len({id(m.headers) for m in made}) == len(made)


@kernels
@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.sampled_from(EDGES) | st.binary(max_size=9)).map(b"".join), min_size=1))
def test_made_messages_take_exactly_the_utf8_python_takes(payloads: list[bytes]) -> None:
    r = read(stamp(read(encode(payloads, headers=[{"k": "v"}] * len(payloads))), 1, 2.5, "edge"))
    made = kernel_messages(r)
    assert (made is not None) == all(map(_utf8, payloads))
    assert made is None or made == python_messages(r)


@kernels
def test_an_error_in_make_is_raised() -> None:
    r = read(stamp(read(encode([b"x", b"y"])), 1, 2.5, "s"))

    def make(*fields: object) -> object:
        raise ValueError("no")

    assert KERNELS is not None
    with pytest.raises(ValueError, match="no"):
        KERNELS.batch_messages(make, r.data, r.body, r.end, r.flags, r.count, 1, 2.5, "s")


def test_a_batch_renders_the_same_with_the_kernel_or_without() -> None:
    """``Batch.json`` of stored record batches, whichever path the process takes."""
    payloads = [b"plain", "zürich ☃".encode(), b'quote " and \\ and \n', b"\xff\xfe not utf-8"]
    raw = [
        stamp(read(encode(payloads[:3], segments=[0, 7, -1], headers=[{}, {"k": "v"}, {}])), 1, 1.25, "edge"),
        stamp(read(encode(payloads)), 4, 2.5, "edge"),
    ]
    records = [read(b) for b in raw]
    expected = [obj for r in records for obj in python_json(r)]
    assert Batch.of_records(records).json() == expected


def test_a_page_decodes_the_same_with_the_kernel_or_without() -> None:
    """``decode_page`` (the client's binary read), whichever path the process takes."""
    raw = [
        stamp(read(encode([b"a", b"b"], sources=["dc", None], headers=[{"k": "v"}, {}])), 1, 1.25, "edge"),
        stamp(read(encode([b"ok", b"\xff not utf-8"], external_ids=[None, 9])), 3, 2.5, "edge"),
    ]
    page = batch_page.page_head(4, 4) + b"".join(raw)
    messages, last_id = batch_page.decode_page(page)
    assert last_id == 4
    assert messages == [m for b in raw for m in python_messages(read(b))]
    assert messages[3].data_b64 and messages[3].external_id == 9 and messages[0].source == "dc"


@kernels
@settings(max_examples=300)
@given(st.binary(max_size=2000), st.integers(0, 2**32 - 1), st.integers(0, 63))
def test_crc32_is_zlibs_for_every_length_start_and_running_value(data: bytes, value: int, start: int) -> None:
    """Every length crosses the fold's 64-byte entry and 16-byte steps; a start off the
    buffer's alignment and a running value (the head-then-source chain) are both taken."""
    assert KERNELS is not None
    view = memoryview(data)[min(start, len(data)) :]
    assert KERNELS.crc32(view, value) == zlib.crc32(view, value)
    assert KERNELS.crc32(view) == zlib.crc32(view)


@kernels
def test_crc32_of_a_block_sized_buffer_is_zlibs_and_takes_only_buffers() -> None:
    """Past 5 KiB the kernel lets go of the GIL, as zlib does; a str is refused as by zlib."""
    assert KERNELS is not None
    data = bytes(range(256)) * 12_000 + b"tail"
    assert KERNELS.crc32(data) == zlib.crc32(data)
    assert KERNELS.crc32(data[7:], 0xFFFFFFFF) == zlib.crc32(data[7:], 0xFFFFFFFF)
    assert KERNELS.crc32(b"") == 0 and KERNELS.crc32(b"", 1234) == 1234
    with pytest.raises(TypeError):
        KERNELS.crc32("text")  # type: ignore[arg-type]


def test_the_checksum_in_use_is_zlibs() -> None:
    """``capella.kernels.crc32`` (every record batch and block check) gives zlib's values,
    whichever path the process takes, so formats written either way read either way."""
    data = b"record batch " * 1000
    assert crc32(data) == zlib.crc32(data) and crc32(data[3:], 99) == zlib.crc32(data[3:], 99)
    if KERNELS is not None and KERNELS.FAST_CRC32:
        assert crc32 is KERNELS.crc32


def _utf8(payload: bytes) -> bool:
    try:
        payload.decode()
    except UnicodeDecodeError:
        return False
    return True
