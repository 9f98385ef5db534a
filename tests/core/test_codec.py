"""The journal and sealed block formats, 1 and 2: round trips, torn tails and corruption."""

from __future__ import annotations

import random
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.codec import decode_block, encode_block_v1, encode_record_v1

from capella.core.log.codec import (
    JOURNAL_HEADER,
    JOURNAL_HEADER_V1,
    block_keys,
    block_records,
    columns_of,
    decode_journal,
    encode_block,
    index_entry,
)
from capella.core.log.open_block import OpenBlock
from capella.core.message import LogMessage
from capella.errors import CorruptData, InvalidMessage
from capella.records.record_batch import Fields, encode, encode_fields, framed, read, read_all

I64 = st.integers(-(2**63), 2**63 - 1)
U64 = st.integers(0, 2**64 - 1)
TIMES = st.floats(allow_nan=False)
SOURCES = st.text(max_size=12) | st.sampled_from(["edge-1", "dc-eu", "zürich-☃", ""])
HEADERS = st.dictionaries(st.text(max_size=8), st.text(max_size=16), max_size=3)
# Mostly small payloads, sometimes one past 64 KiB to cross any 16-bit length.
PAYLOADS = st.binary(max_size=300) | st.integers(65_536, 70_000).map(lambda n: random.Random(n).randbytes(n))


def message(mid: int = 1, **fields: object) -> LogMessage:
    values: dict[str, object] = {
        "time": 1_700_000_000.0 + mid * 1e-5,
        "source": "edge-1",
        "external_id": mid,
        "external_time": 1_700_000_000.0 + mid * 1e-5,
        "segment": 0,
        "payload": b"p%d" % mid,
    }
    values.update(fields)
    return LogMessage(id=mid, **values)  # type: ignore[arg-type]


@st.composite
def messages(draw: st.DrawFn, max_size: int = 6) -> list[LogMessage]:
    """Messages with strictly increasing ids and anything else in its full range."""
    ids = sorted(draw(st.sets(U64, max_size=max_size)))
    return [
        LogMessage(
            id=mid,
            time=draw(TIMES),
            source=draw(SOURCES),
            external_id=draw(I64),
            external_time=draw(TIMES),
            segment=draw(I64),
            payload=draw(PAYLOADS),
            headers=draw(HEADERS),
        )
        for mid in ids
    ]


def journal(msgs: list[LogMessage]) -> tuple[bytes, list[int]]:
    """A format 1 journal holding ``msgs`` and the offset at which each frame ends."""
    frames = [encode_record_v1(m) for m in msgs]
    ends = [len(JOURNAL_HEADER_V1)]
    for frame in frames:
        ends.append(ends[-1] + len(frame))
    return JOURNAL_HEADER_V1 + b"".join(frames), ends


def flip(data: bytes, bit: int) -> bytes:
    out = bytearray(data)
    out[bit // 8] ^= 1 << (bit % 8)
    return bytes(out)


def resign(block: bytes) -> bytes:
    """The block with its CRC recomputed, to reach the checks behind the checksum."""
    return block[:-4] + struct.pack("<I", zlib.crc32(block[:-4]))


def small_block() -> list[LogMessage]:
    return [
        message(3, headers={"trace": "ab", "ü": ""}),
        message(4, source="dc-eu", external_id=-7, segment=-2),
        message(9, external_time=12.5, payload=b""),
    ]


# --- journal -----------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(messages())
def test_journal_round_trip(msgs: list[LogMessage]) -> None:
    data, _ = journal(msgs)
    scan = decode_journal(data)
    assert scan.messages == msgs
    assert (scan.valid_length, scan.torn, scan.reason) == (len(data), False, "")


@settings(max_examples=15, deadline=None)
@given(messages(max_size=4).filter(lambda ms: all(len(m.payload) < 1000 for m in ms)))
def test_every_truncation_keeps_exactly_the_complete_records(msgs: list[LogMessage]) -> None:
    data, ends = journal(msgs)
    for cut in range(len(JOURNAL_HEADER_V1), len(data) + 1):
        scan = decode_journal(data[:cut])
        complete = sum(end <= cut for end in ends) - 1
        assert scan.messages == msgs[:complete]
        assert scan.valid_length == ends[complete]
        assert scan.torn == (cut != ends[complete])


@pytest.mark.parametrize("header", [JOURNAL_HEADER, JOURNAL_HEADER_V1])
def test_a_torn_journal_header_scans_as_empty(header: bytes) -> None:
    for cut in range(len(header)):
        scan = decode_journal(header[:cut])
        assert (scan.messages, scan.valid_length, scan.torn) == ([], 0, cut > 0)


@pytest.mark.parametrize("bit", range(len(JOURNAL_HEADER) * 8))
def test_a_bad_journal_header_is_corrupt(bit: int) -> None:
    with pytest.raises(CorruptData, match="journal"):
        decode_journal(flip(JOURNAL_HEADER_V1, bit) + encode_record_v1(message()))
    with pytest.raises(CorruptData, match="journal"):
        decode_journal(flip(JOURNAL_HEADER, bit) + batches_of([message()])[0])


def test_every_bit_flip_in_the_last_frame_is_detected() -> None:
    msgs = [message(1), message(2, headers={"k": "v"}), message(5, source="zürich", payload=b"x" * 40)]
    data, ends = journal(msgs)
    for bit in range(ends[-2] * 8, len(data) * 8):
        scan = decode_journal(flip(data, bit))
        assert scan.messages == msgs[:-1]
        assert scan.valid_length == ends[-2]
        assert scan.torn and scan.reason


@settings(max_examples=40, deadline=None)
@given(messages(max_size=4).filter(bool), st.data())
def test_a_random_bit_flip_in_the_last_frame_is_detected(msgs: list[LogMessage], data: st.DataObject) -> None:
    raw, ends = journal(msgs)
    bit = data.draw(st.integers(ends[-2] * 8, len(raw) * 8 - 1))
    scan = decode_journal(flip(raw, bit))
    assert scan.messages == msgs[:-1]
    assert scan.valid_length == ends[-2]


def test_the_scan_stops_at_an_id_that_does_not_increase() -> None:
    data, ends = journal([message(5), message(5), message(6)])
    scan = decode_journal(data)
    assert [m.id for m in scan.messages] == [5]
    assert scan.valid_length == ends[1]
    assert scan.torn and "does not follow" in scan.reason


def test_zero_fill_after_the_last_frame_is_a_torn_tail() -> None:
    data, ends = journal([message(1)])
    scan = decode_journal(data + bytes(64))
    assert [m.id for m in scan.messages] == [1]
    assert scan.valid_length == ends[-1]
    assert scan.torn


@pytest.mark.parametrize(
    "bad",
    [
        message(-1),
        message(1, external_id=2**63),
        message(1, segment=-(2**63) - 1),
        message(1, source="x" * 70_000),
        message(1, source="\ud800"),
        message(1, headers={"k" * 70_000: "v"}),
    ],
)
def test_a_message_that_cannot_be_stored_is_refused(bad: LogMessage) -> None:
    with pytest.raises(InvalidMessage):
        encode_record_v1(bad)


# --- sealed block ------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(messages(max_size=12))
def test_block_round_trip(msgs: list[LogMessage]) -> None:
    block = encode_block_v1(msgs)
    assert decode_block(block) == msgs
    assert block_keys(block) == ([m.id for m in msgs], [m.key for m in msgs])


def test_decoded_payloads_are_bytes_even_from_a_bytearray() -> None:
    decoded = decode_block(bytearray(encode_block_v1(small_block())))
    assert decoded == small_block()
    assert all(type(m.payload) is bytes for m in decoded)


def test_every_truncation_and_extension_of_a_block_is_corrupt() -> None:
    block = encode_block_v1(small_block())
    for cut in range(len(block)):
        with pytest.raises(CorruptData):
            decode_block(block[:cut])
    for extra in (b"\x00", b"\x00" * 4, block[-16:]):
        with pytest.raises(CorruptData, match="truncated or extended"):
            decode_block(block + extra)


def test_every_bit_flip_of_a_block_is_corrupt() -> None:
    block = encode_block_v1(small_block())
    for bit in range(len(block) * 8):
        with pytest.raises(CorruptData):
            decode_block(flip(block, bit))
        with pytest.raises(CorruptData):
            block_keys(flip(block, bit))


@settings(max_examples=60, deadline=None)
@given(messages(max_size=8).filter(lambda ms: sum(len(m.payload) for m in ms) < 5000), st.data())
def test_a_random_cut_or_bit_flip_of_a_block_is_corrupt(msgs: list[LogMessage], data: st.DataObject) -> None:
    block = encode_block_v1(msgs)
    with pytest.raises(CorruptData):
        decode_block(block[: data.draw(st.integers(0, len(block) - 1))])
    with pytest.raises(CorruptData):
        decode_block(flip(block, data.draw(st.integers(0, len(block) * 8 - 1))))


def test_a_block_that_passes_its_checksum_but_not_its_framing_is_corrupt() -> None:
    block = encode_block_v1(small_block())
    # Claim one message more, and make the last id disagree, each with a valid CRC.
    more = block[:8] + struct.pack("<I", 4) + block[12:]
    wrong_last = block[:24] + struct.pack("<Q", 10) + block[32:]
    for bad in (more, wrong_last):
        with pytest.raises(CorruptData, match="metadata"):
            decode_block(resign(bad))


def test_an_empty_block_round_trips() -> None:
    assert decode_block(encode_block_v1([])) == []


def test_block_ids_must_increase() -> None:
    with pytest.raises(ValueError, match="increasing"):
        encode_block_v1([message(2), message(2)])


def test_ten_thousand_random_payloads_cost_at_most_293_bytes_each() -> None:
    rnd = random.Random(7)
    msgs = [message(i, payload=rnd.randbytes(256)) for i in range(1, 10_001)]
    block = encode_block_v1(msgs)
    assert len(block) / len(msgs) <= 293
    assert decode_block(block) == msgs


# --- format 2: journal of record batches, sealed block of record batches -----------------


def batches_of(msgs: list[LogMessage]) -> list[bytes]:
    """``msgs`` as record batches (one per run of consecutive ids with one time)."""
    return encode_fields(Fields._make(columns_of(msgs))) if msgs else []


def journal_v2(msgs: list[LogMessage]) -> tuple[bytes, list[int], list[list[LogMessage]]]:
    """A format 2 journal holding ``msgs``, where each batch ends, and the messages of each batch."""
    batches = batches_of(msgs)
    ends = [len(JOURNAL_HEADER)]
    groups: list[list[LogMessage]] = []
    for raw in batches:
        ends.append(ends[-1] + len(raw))
        count = read(raw).count
        done = sum(map(len, groups))
        groups.append(msgs[done : done + count])
    return JOURNAL_HEADER + b"".join(batches), ends, groups


def block_v2(msgs: list[LogMessage]) -> bytes:
    return encode_block(read_all(b"".join(batches_of(msgs))))[0]


def run_of(first: int, n: int, **fields: object) -> list[LogMessage]:
    """``n`` messages with consecutive ids from ``first`` and one time: one batch."""
    return [message(i, time=5.0, external_time=5.0, **fields) for i in range(first, first + n)]


@settings(max_examples=60, deadline=None)
@given(messages())
def test_journal_v2_round_trip(msgs: list[LogMessage]) -> None:
    data, _, _ = journal_v2(msgs)
    scan = decode_journal(data)
    assert scan.messages == msgs
    assert (scan.valid_length, scan.torn, scan.reason, scan.version) == (len(data), False, "", 2)
    assert b"".join(b.raw() for b in scan.batches) == data[len(JOURNAL_HEADER) :]


def test_every_truncation_of_a_v2_journal_keeps_exactly_the_complete_batches() -> None:
    msgs = [*run_of(1, 3), *run_of(10, 2, source="dc-eu", headers={"k": "v"}), *run_of(20, 1, segment=4)]
    data, ends, groups = journal_v2(msgs)
    assert len(groups) == 3
    for cut in range(len(JOURNAL_HEADER), len(data) + 1):
        scan = decode_journal(data[:cut])
        complete = sum(end <= cut for end in ends) - 1
        assert scan.messages == [m for group in groups[:complete] for m in group]
        assert scan.valid_length == ends[complete]
        assert scan.torn == (cut != ends[complete])


def test_every_bit_flip_in_the_last_v2_batch_is_detected() -> None:
    msgs = [*run_of(1, 2), *run_of(5, 3, source="zürich", payload=b"x" * 40)]
    data, ends, groups = journal_v2(msgs)
    for bit in range(ends[-2] * 8, len(data) * 8):
        scan = decode_journal(flip(data, bit))
        assert scan.messages == groups[0]
        assert scan.valid_length == ends[-2]
        assert scan.torn and scan.reason


@settings(max_examples=60, deadline=None)
@given(messages(max_size=12))
def test_block_v2_round_trip(msgs: list[LogMessage]) -> None:
    block = block_v2(msgs)
    assert decode_block(block) == msgs
    assert block_keys(block) == ([m.id for m in msgs], [m.key for m in msgs])
    records = block_records(block)
    assert records is not None
    assert b"".join(r.raw() for r in records) == b"".join(batches_of(msgs))


def test_the_sealed_block_holds_the_batches_byte_for_byte_and_serves_them_from_its_bytes() -> None:
    raw = b"".join(batches_of(small_block()))
    block, placed = encode_block(read_all(raw))
    assert raw in block
    assert all(r.data is block for r in placed)
    assert block_records(block) == placed
    assert block_records(encode_block_v1(small_block())) is None


def test_every_truncation_extension_and_bit_flip_of_a_v2_block_is_corrupt() -> None:
    block = block_v2(small_block())
    for cut in range(len(block)):
        with pytest.raises(CorruptData):
            decode_block(block[:cut])
    for extra in (b"\x00", b"\x00" * 4, block[-16:]):
        with pytest.raises(CorruptData):
            decode_block(block + extra)
    for bit in range(len(block) * 8):
        with pytest.raises(CorruptData):
            decode_block(flip(block, bit))
        with pytest.raises(CorruptData):
            block_keys(flip(block, bit))


@given(messages(max_size=12))
def test_a_block_assembled_from_the_entries_made_as_its_batches_came_is_the_encoded_block(
    msgs: list[LogMessage],
) -> None:
    # The open block makes each batch's index entry when the batch is added; sealing only
    # joins them, and must give the block that encoding the batches in one go gives.
    raw = batches_of(msgs)
    block = OpenBlock(first_id=1, opened_at=0.0, journal_key="j", own="here")
    for data in raw:
        block.add_batch(framed(data))
    assert [b.data for b in block.batches] == raw
    assert block.pending == raw
    assembled = block.sealed()
    assert assembled == encode_block(read_all(b"".join(raw)))[0]
    assert decode_block(assembled) == msgs


def test_a_journaled_batch_is_indexed_but_not_pending_again() -> None:
    raw = batches_of(small_block())
    block = OpenBlock(first_id=3, opened_at=0.0, journal_key="j", own="here")
    for batch in read_all(JOURNAL_HEADER + b"".join(raw), len(JOURNAL_HEADER)):
        alone = batch.alone()
        assert alone.start == 0 and alone.raw() == batch.raw() and alone.fields() == batch.fields()
        block.add_batch(alone, journaled=True)
    assert block.pending == []
    assert decode_block(block.sealed()) == small_block()


@given(messages(max_size=8))
def test_framed_reads_what_read_reads_from_a_batch_just_made(msgs: list[LogMessage]) -> None:
    for data in batches_of(msgs):
        assert framed(data) == read(data)


def test_an_index_entry_says_where_its_batch_starts() -> None:
    batch = read(batches_of(run_of(5, 3, segment=4))[0])
    here, later = index_entry(batch, 0), index_entry(batch, 1000)
    assert here != later and len(here) == len(later)


def test_an_open_block_refuses_a_batch_whose_ids_do_not_follow_and_keeps_its_own() -> None:
    # Sealing joins the batches as they are, unchecked: the order is checked as each comes.
    first, second = (read(batches_of(run)[0]) for run in (run_of(5, 3), run_of(9, 2)))
    block = OpenBlock(first_id=5, opened_at=0.0, journal_key="j", own="here")
    block.add_batch(first.alone())
    for stale in (first.alone(), read(batches_of(run_of(7, 1))[0]).alone()):
        with pytest.raises(ValueError, match="increasing"):
            block.add_batch(stale)
    assert (
        list(block.ids) == [5, 6, 7]
        and len(block.batches) == 1
        and block.index == index_entry(first, 0)
        and block.pending == [first.data]
    )
    block.add_batch(second.alone())
    assert decode_block(block.sealed()) == run_of(5, 3) + run_of(9, 2)


def test_v2_block_ids_must_increase() -> None:
    with pytest.raises(ValueError, match="increasing"):
        encode_block([read(batches_of(run_of(2, 1))[0])] * 2)


def test_an_empty_v2_block_round_trips() -> None:
    assert decode_block(encode_block([])[0]) == []


def test_ten_thousand_random_payloads_in_batches_of_100_cost_at_most_293_bytes_each() -> None:
    rnd = random.Random(7)
    batches = [
        encode(
            [rnd.randbytes(256) for _ in range(100)], base_id=first, base_time=1.7e9 + first, source="edge-1"
        )
        for first in range(1, 10_001, 100)
    ]
    block, _ = encode_block(read_all(b"".join(batches)))
    assert len(block) / 10_000 <= 293
    assert len(decode_block(block)) == 10_000
