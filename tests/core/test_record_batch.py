"""The record batch: round trips in every form, stamping, cutting, paging, and bytes that lie."""

from __future__ import annotations

import contextlib
import random
import struct
import zlib
from itertools import chain

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.batches import SOURCES, TIMES, drafts, stored

from capella.errors import CorruptData, InvalidMessage
from capella.records import record_batch
from capella.records.record_batch import (
    Fields,
    cut,
    decode_given,
    encode,
    encode_fields,
    page_messages,
    read,
    read_all,
    scan,
    select,
    stamp,
)


def messages(fields: Fields) -> list[tuple[object, ...]]:
    return list(zip(*fields, strict=True))


@settings(max_examples=80, deadline=None)
@given(drafts(), st.integers(0, 2**63), TIMES, SOURCES)
def test_a_stamped_batch_reads_back_with_every_default_filled(
    columns: dict[str, list[object]], base_id: int, time: float, source: str
) -> None:
    produced = read(encode(**columns))  # type: ignore[arg-type]
    batch = read(stamp(produced, base_id, time, source))
    f = batch.fields()
    n = len(columns["payloads"])
    assert (batch.base_id, batch.count, batch.last_id) == (base_id, n, base_id + n - 1)
    assert f.ids == list(range(base_id, base_id + n))
    assert f.times == [time] * n
    assert f.sources == [source if s is None else s for s in columns["sources"]]
    assert f.external_ids == [
        i if e is None else e for i, e in zip(f.ids, columns["external_ids"], strict=True)
    ]
    assert f.external_times == [time if t is None else t for t in columns["external_times"]]
    assert f.segments == columns["segments"]
    assert f.payloads == columns["payloads"]
    assert f.headers == columns["headers"]
    # Stamping rewrites the head and keeps the producer's body, byte for byte.
    assert batch.raw()[batch.body - batch.start :] == produced.raw()[produced.body - produced.start :]


@settings(max_examples=80, deadline=None)
@given(stored())
def test_stored_messages_round_trip_through_batches(fields: Fields) -> None:
    batches = encode_fields(fields)
    found = read_all(b"".join(batches))
    assert len(found) == len(batches)
    got = [m for batch in found for m in messages(batch.fields())]
    assert got == messages(fields)


def test_defaults_take_no_room() -> None:
    """256-byte messages with every field at its default: 4 bytes each past the payload."""
    payloads = [random.Random(i).randbytes(256) for i in range(1000)]
    data = encode(payloads, sources=[None] * 1000, external_ids=[None] * 1000, segments=[0] * 1000)
    assert len(data) == record_batch.HEAD.size + 1000 * (256 + 4)
    assert read(data).flags == 0


@settings(max_examples=60, deadline=None)
@given(drafts(), st.data())
def test_select_cuts_messages_out_and_renumbers_the_rest(
    columns: dict[str, list[object]], data: st.DataObject
) -> None:
    n = len(columns["payloads"])
    keep = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    batch = read(stamp(read(encode(**columns)), 100, 5.0, "here"))  # type: ignore[arg-type]
    cut = select(batch, keep, base_id=100)
    if not any(keep):
        assert cut is None
        return
    assert cut is not None
    got = read(cut).fields()
    kept = [i for i, k in enumerate(keep) if k]
    assert got.ids == list(range(100, 100 + len(kept)))
    assert got.payloads == [columns["payloads"][i] for i in kept]
    # A default external id follows the new id; a given one stays.
    given_ids = [columns["external_ids"][i] for i in kept]
    assert got.external_ids == [mid if e is None else e for mid, e in zip(got.ids, given_ids, strict=True)]
    assert got.external_times == [
        5.0 if columns["external_times"][i] is None else columns["external_times"][i] for i in kept
    ]
    assert got.sources == ["here" if columns["sources"][i] is None else columns["sources"][i] for i in kept]


@settings(max_examples=150, deadline=None)
@given(drafts(max_size=12), st.data())
def test_a_cut_holds_its_messages_as_they_were_and_reads_as_select_makes_it(
    columns: dict[str, list[object]], data: st.DataObject
) -> None:
    # Columns sliced, not decoded and encoded again: the same messages, ids and given values
    # as select's re-encoding, every column present or not, every skip and length.
    n = len(columns["payloads"])
    skip = data.draw(st.integers(0, n - 1))
    take = data.draw(st.integers(1, n - skip))
    batch = read(stamp(read(encode(**columns)), 100, 5.0, "here"))  # type: ignore[arg-type]
    sliced = read(cut(batch, skip, take))
    keep = [skip <= i < skip + take for i in range(n)]
    made = select(batch, keep, base_id=100 + skip)
    assert made is not None
    got, expected = decode_given(sliced), decode_given(read(made))
    assert got[0] == expected[0] and got[0].ids == list(range(100 + skip, 100 + skip + take))
    assert got[0] == Fields(*(column[skip : skip + take] for column in batch.fields()))
    # What the producer gave stays given, what it left to default stays default.
    assert got[1:] == tuple(None if g is None else g[skip : skip + take] for g in decode_given(batch)[1:])
    assert sliced.flags == batch.flags and len(sliced.data) <= len(batch.raw())


def test_a_cut_of_a_whole_batch_is_the_batch_and_a_cut_past_it_is_refused() -> None:
    batch = read(stamp(read(encode([b"a", b"b", b"c"])), 7, 1.0, "here"))
    assert cut(batch, 0, 3) == batch.raw()
    for skip, take in ((0, 0), (2, 2), (3, 1), (-1, 2)):
        with pytest.raises(ValueError, match="cannot cut"):
            cut(batch, skip, take)


@settings(max_examples=60, deadline=None)
@given(stored(max_size=14), st.integers(-1, 2**40 + 100), st.integers(1, 20))
def test_a_page_is_whole_batches_and_cut_edges(fields: Fields, after: int, limit: int) -> None:
    batches = read_all(b"".join(encode_fields(fields)))
    page = page_messages(batches, after, limit)
    got = [m for raw in page for m in messages(read(bytes(raw)).fields())]
    assert got == [m for m in messages(fields) if m[0] > after][:limit]  # type: ignore[operator]
    whole = {b.raw() for b in batches}
    # Only the first and the last batch of a page may be re-framed.
    assert all(raw in whole for raw in page[1:-1])


def test_a_scan_stops_at_a_torn_tail() -> None:
    first = encode([b"a", b"b"], base_id=1)
    second = encode([b"c"], base_id=3)
    data = first + second
    for torn in range(len(first), len(data)):
        found = scan(data[:torn])
        assert [b.base_id for b in found.batches] == [1]
        assert found.end == len(first)
        assert bool(found.reason) == (torn > len(first))
    assert [b.base_id for b in scan(data).batches] == [1, 3]
    assert "does not follow" in scan(second + first).reason


def test_out_of_range_values_are_refused_when_encoding() -> None:
    with pytest.raises(InvalidMessage):
        encode([])
    with pytest.raises(InvalidMessage):
        encode([b"x"], external_ids=[2**63])
    with pytest.raises(InvalidMessage):
        encode([b"x"], sources=["\ud800"])


def reframed(body: bytes, flags: int, count: int) -> bytes:
    """A batch whose checksums are right around any body: what only the body's checks can catch."""
    return record_batch._framed(flags, count, 1, 0.0, "s", body, zlib.crc32(body))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.integers(0, 0x3F), st.integers(0, 40))
def test_a_body_that_lies_raises_corrupt_data(body: bytes, flags: int, count: int) -> None:
    try:
        batch = read(reframed(body, flags, count))
    except CorruptData:
        return
    # A cut reads only what it slices, and refuses what it cannot read as CorruptData alone.
    halves = [(0, count)] if count == 1 else [(0, count // 2), (count // 2, count - count // 2)]
    parts = []
    for skip, take in halves:
        with contextlib.suppress(CorruptData):
            parts.append(read(cut(batch, skip, take)))
    try:
        f = batch.fields()
    except CorruptData:
        return
    # Whatever parsed is self-consistent, and its halves are its messages.
    assert len(f.payloads) == count and sum(map(len, f.payloads)) <= len(body)
    assert [m for p in parts for m in messages(p.fields())] == messages(f)


@settings(max_examples=300, deadline=None)
@given(drafts(max_size=4), st.data())
def test_any_damage_to_a_batch_raises_corrupt_data(
    columns: dict[str, list[object]], data: st.DataObject
) -> None:
    good = encode(**columns)  # type: ignore[arg-type]
    bad = bytearray(good)
    kind = data.draw(st.sampled_from(["flip", "cut", "extend", "length"]))
    if kind == "flip":
        at = data.draw(st.integers(0, len(bad) - 1))
        bad[at] ^= data.draw(st.integers(1, 255))
    elif kind == "cut":
        bad = bad[: data.draw(st.integers(0, len(bad) - 1))]
    elif kind == "extend":
        bad += data.draw(st.binary(min_size=1, max_size=8))
    else:
        struct.pack_into("<I", bad, 0, data.draw(st.integers(0, 2**32 - 1)))
    raw = bytes(bad)
    if kind == "extend":
        # The batch itself is intact; what follows it is not a batch.
        assert read(raw).raw() == good
        with pytest.raises(CorruptData):
            read_all(raw)
        return
    if raw[:4] == good[:4] and kind == "length":
        return
    with pytest.raises(CorruptData):
        read_all(raw)
        read(raw).fields()


def test_many_batches_in_one_buffer_chain() -> None:
    batches = [encode([b"m%d" % i] * (i + 1), base_id=100 * i + 1) for i in range(5)]
    found = read_all(b"".join(batches))
    assert list(chain.from_iterable(b.fields().ids for b in found))[:4] == [1, 101, 102, 201]


@settings(max_examples=80, deadline=None)
@given(drafts(), SOURCES)
def test_the_extent_is_the_sources_and_segment_range_of_the_messages(
    columns: dict[str, list[object]], source: str
) -> None:
    batch = read(stamp(read(encode(**columns)), 1, 0.0, source))  # type: ignore[arg-type]
    f = batch.fields()
    found = record_batch.extent(batch)
    assert found.sources == list(dict.fromkeys(f.sources))
    assert (found.min_segment, found.max_segment) == (min(f.segments), max(f.segments))


@settings(max_examples=40, deadline=None)
@given(drafts())
def test_decode_given_tells_the_explicit_values_from_the_defaults(columns: dict[str, list[object]]) -> None:
    batch = read(encode(**columns))  # type: ignore[arg-type]
    fields, external_ids, external_times = record_batch.decode_given(batch)
    assert fields == batch.fields()
    given_ids, given_times = columns["external_ids"], columns["external_times"]
    assert external_ids == (None if given_ids.count(None) == len(given_ids) else given_ids)
    assert external_times == (None if given_times.count(None) == len(given_times) else given_times)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.binary(max_size=40), min_size=1, max_size=8),
    st.integers(0, 63),
    st.integers(0, 2**32 - 1),
)
def test_payload_sizes_agree_with_a_decode_of_a_plain_batch(
    payloads: list[bytes], at: int, length: int
) -> None:
    # The produce check reads only the lengths of a plain batch; it must refuse exactly what
    # the decode refuses, and give the lengths the decode gives.
    good = record_batch.read(record_batch.encode(payloads))
    assert record_batch.payload_sizes(good) == [len(p) for p in payloads]
    # One payload length (at a random position) set to a random value, checksum made to match.
    n = len(payloads)
    index = at % n
    body = bytearray(good.data[good.body : good.end])
    struct.pack_into("<I", body, 4 * index, length)
    lying = record_batch.read(reframed(bytes(body), 0, n))
    try:
        decoded = lying.fields().payloads
    except CorruptData as exc:
        with pytest.raises(CorruptData) as refused:
            record_batch.payload_sizes(lying)
        assert refused.value.message == exc.message
    else:
        assert record_batch.payload_sizes(lying) == [len(p) for p in decoded]


def test_payload_sizes_reads_only_plain_batches() -> None:
    batch = record_batch.read(record_batch.encode([b"a"], segments=[3]))
    with pytest.raises(ValueError, match="without optional columns"):
        record_batch.payload_sizes(batch)
