"""The shared object: keys that sort by time, a layout that reads back, and bytes that lie."""

from __future__ import annotations

import itertools
import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capella.errors import CorruptData, InvalidRequest
from capella.records import record_batch
from capella.shared.object import (
    TAIL,
    Placed,
    build,
    index_length,
    key_time,
    object_key,
    queue_ranges,
    read_footer,
    read_index,
    verify,
)

NOW = 1_796_000_000.123  # 2026-11-29 UTC


def batch(n: int, tag: str = "m") -> bytes:
    return record_batch.encode([f"{tag}-{i}".encode() for i in range(n)])


def mixed(rng: random.Random, queues: int = 4, batches: int = 12) -> list[tuple[str, bytes]]:
    names = [f"q{i}" for i in range(queues)]
    return [
        (rng.choice(names), batch(rng.randint(1, 20), f"b{i}-{rng.randbytes(4).hex()}"))
        for i in range(batches)
    ]


# --- keys --------------------------------------------------------------------------------


def test_a_key_names_the_day_the_node_and_a_ulid() -> None:
    key = object_key("node-a", NOW, bytes(10))
    day = time.gmtime(NOW)
    assert key == f"shared/{day.tm_year}/{day.tm_mon:02d}/{day.tm_mday:02d}/node-a/{key.split('/')[-1]}"
    ulid = key.split("/")[-1].removesuffix(".cpo")
    assert len(ulid) == 26 and ulid.endswith("0" * 16)
    assert set(ulid) <= set("0123456789ABCDEFGHJKMNPQRSTVWXYZ")
    assert key_time(key) == round(NOW * 1000) / 1000


def test_the_ulid_is_the_spec_s_encoding() -> None:
    # The ULID spec's example: 01ARZ3NDEKTSV4RRFFQ69G5FAV, the time 1469922850259 ms.
    key = object_key("n", 1469922850.259, bytes.fromhex("d6764c61efb99302bd5b"))
    assert key == "shared/2016/07/30/n/01ARZ3NDEKTSV4RRFFQ69G5FAV.cpo"
    assert key_time(key) == 1469922850.259
    assert object_key("n", 0.0, bytes(10)) == "shared/1970/01/01/n/00000000000000000000000000.cpo"


def test_keys_sort_by_time_whatever_their_randomness() -> None:
    rng = random.Random(7)
    times = sorted(NOW + rng.uniform(0, 3600) for _ in range(200))
    keys = [object_key("node-b", t, rng.randbytes(10)) for t in times]
    distinct = [k for k, t in zip(keys, times, strict=True) if round(t * 1000) != round(times[0] * 1000)]
    assert sorted(distinct) == distinct
    assert [key_time(k) for k in keys] == [round(t * 1000) / 1000 for t in times]


def test_randomness_comes_from_the_system_unless_given() -> None:
    assert object_key("n", NOW) != object_key("n", NOW)
    assert object_key("n", NOW, b"\x01" * 10) == object_key("n", NOW, b"\x01" * 10)


@pytest.mark.parametrize(
    "key",
    [
        "",
        "shared/2026/11/29/node-a/01JDQ8Z9X0ABCDEFGHJKMNPQRS",  # no suffix
        "other/2026/11/29/node-a/01JDQ8Z9X0ABCDEFGHJKMNPQRS.cpo",
        "shared/2026/11/29/01JDQ8Z9X0ABCDEFGHJKMNPQRS.cpo",  # no node
        "shared/2026/11/29/node-a/01JDQ8Z9X0ABCDEFGHJKMNPQR.cpo",  # 25 characters
        "shared/2026/11/29/node-a/01JDQ8Z9X0ABCDEFGHJKMNPQRI.cpo",  # I is not Crockford
        "shared/2026/11/29/node-a/81JDQ8Z9X0ABCDEFGHJKMNPQRS.cpo",  # more than 128 bits
        "shared/2026/11/28/node-a/01JDQ8Z9X0ABCDEFGHJKMNPQRS.cpo",  # not its ULID's day
        "q/blocks/00000000000000000001-00000000000000000009.blk",
    ],
)
def test_key_time_is_none_for_what_is_not_an_object_key(key: str) -> None:
    assert key_time(key) is None


def test_key_time_reads_a_key_whose_day_is_its_ulid_s() -> None:
    key = object_key("node-a", NOW, b"\x42" * 10)
    assert key_time(key) is not None
    assert key_time(key.replace(".cpo", ".blk")) is None


@pytest.mark.parametrize(
    ("node", "now", "rand"),
    [("", NOW, None), ("a/b", NOW, None), ("..", NOW, None), ("n", -1.0, None), ("n", float("nan"), None),
     ("n", 2.0**48, None), ("n", NOW, b"short")],
)  # fmt: skip
def test_a_key_nobody_could_read_back_is_refused(node: str, now: float, rand: bytes | None) -> None:
    with pytest.raises(InvalidRequest):
        object_key(node, now, rand)


# --- layout ------------------------------------------------------------------------------


def test_batches_are_grouped_by_queue_in_order_and_read_back() -> None:
    given_batches = [
        ("b", batch(3, "b1")),
        ("a", batch(1, "a1")),
        ("b", batch(2, "b2")),
        ("a", batch(5, "a2")),
    ]
    data, placed = build(given_batches)

    assert [(p.queue, p.count) for p in placed] == [("b", 3), ("b", 2), ("a", 1), ("a", 5)]
    order = [given_batches[0], given_batches[2], given_batches[1], given_batches[3]]
    assert [data[p.offset : p.offset + p.size] for p in placed] == [raw for _, raw in order]
    assert placed[0].offset == 0
    assert all(p.offset + p.size == q.offset for p, q in itertools.pairwise(placed))
    assert read_index(data) == placed == verify(data)


def test_a_queue_s_batches_are_one_range_that_reads_as_batches() -> None:
    rng = random.Random(3)
    given_batches = mixed(rng)
    data, placed = build(given_batches)
    ranges = queue_ranges(placed)

    assert list(ranges) == list(dict.fromkeys(q for q, _ in given_batches))
    for queue, where in ranges.items():
        mine = [raw for q, raw in given_batches if q == queue]
        assert data[where.offset : where.offset + where.size] == b"".join(mine)
        # Unstamped batches all have base id 0, so they are read one by one (read_all wants ids to grow).
        found, pos = [], where.offset
        while pos < where.offset + where.size:
            found.append(record_batch.read(data, pos, where.offset + where.size))
            pos = found[-1].end
        assert [b.raw() for b in found] == mine
        assert where.count == sum(b.count for b in found)


def test_the_index_reads_from_the_object_s_end_alone() -> None:
    data, placed = build(mixed(random.Random(5)))
    tail = data[-TAIL.size :]
    need = index_length(tail) + TAIL.size
    assert read_footer(data[-need:], len(data)) == placed
    with pytest.raises(CorruptData, match="does not fit"):
        read_footer(data[-need + 1 :], len(data))


def test_an_object_of_no_batches_reads_back_empty() -> None:
    data, placed = build([])
    assert placed == [] == read_index(data)
    assert len(data) == 8 + TAIL.size


def test_queue_names_of_any_script_read_back() -> None:
    data, _ = build([("zürich-☃", batch(1)), ("東京", batch(2))])
    assert [p.queue for p in read_index(data)] == ["zürich-☃", "東京"]


@pytest.mark.parametrize(
    "raw",
    [b"", b"junk", batch(2) + b"\0", batch(2)[:-1], b"\xff" * 40],
)
def test_what_is_not_one_whole_record_batch_is_refused(raw: bytes) -> None:
    with pytest.raises(CorruptData, match="queue 'q'"):
        build([("ok", batch(1)), ("q", raw)])


def test_a_bad_queue_name_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="bad queue name"):
        build([("", batch(1))])


def test_placed_is_the_segment_row_s_shape() -> None:
    _, placed = build([("q", batch(4))])
    assert placed == [Placed("q", 0, len(batch(4)), 4)]


# --- bytes that lie ----------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**32 - 1), st.data())
def test_any_damage_to_an_object_raises_corrupt_data(seed: int, data: st.DataObject) -> None:
    good, _ = build(mixed(random.Random(seed), queues=3, batches=data.draw(st.integers(1, 6))))
    index_at = len(good) - TAIL.size - index_length(good)
    bad = bytearray(good)
    kind = data.draw(st.sampled_from(["flip_index", "flip_any", "cut_end", "cut_front", "extend", "garbage"]))
    if kind == "flip_index":  # the index and the tail are under the CRC or checked outright
        at = data.draw(st.integers(index_at, len(bad) - 1))
        bad[at] ^= data.draw(st.integers(1, 255))
    elif kind == "flip_any":  # batches carry their own CRCs: verify catches them
        at = data.draw(st.integers(0, len(bad) - 1))
        bad[at] ^= data.draw(st.integers(1, 255))
    elif kind == "cut_end":
        bad = bad[: data.draw(st.integers(0, len(bad) - 1))]
    elif kind == "cut_front":
        bad = bad[data.draw(st.integers(1, len(bad))) :]
    elif kind == "extend":
        bad = bad[:index_at] + data.draw(st.binary(min_size=1, max_size=40)) + bad[index_at:]
    else:
        bad = bytearray(data.draw(st.binary(max_size=200)))
    raw = bytes(bad)
    if kind == "flip_any" and raw[:index_at] != good[:index_at]:
        with pytest.raises(CorruptData):
            verify(raw)
        return
    with pytest.raises(CorruptData):
        read_index(raw)


def test_every_truncation_of_a_small_object_is_corrupt_data() -> None:
    good, _ = build([("a", batch(1)), ("b", batch(2)), ("a", batch(1))])
    for cut in range(len(good)):
        with pytest.raises(CorruptData):
            read_index(good[:cut])
        with pytest.raises(CorruptData):
            read_index(good[cut + 1 :])
