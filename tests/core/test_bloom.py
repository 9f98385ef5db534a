"""The Bloom filter that summarises a block's dedup keys."""

from __future__ import annotations

import hashlib

import pytest

from capella.core.log.bloom import BloomFilter, dedup_key
from capella.errors import CorruptData


def filled(count: int, error_rate: float = 0.01) -> BloomFilter:
    bloom = BloomFilter(count, error_rate)
    for i in range(count):
        bloom.add(dedup_key("edge-1", i))
    return bloom


def test_every_added_key_is_found() -> None:
    bloom = filled(10_000)
    assert all(dedup_key("edge-1", i) in bloom for i in range(10_000))
    assert bloom.count == 10_000


@pytest.mark.parametrize("error_rate", [0.01, 0.001])
def test_false_positives_stay_within_twice_the_target(error_rate: float) -> None:
    bloom = filled(10_000, error_rate)
    trials = 50_000
    hits = sum(dedup_key("other", i) in bloom for i in range(trials))
    assert hits / trials <= 2 * error_rate


def test_an_empty_filter_holds_nothing() -> None:
    assert dedup_key("edge-1", 1) not in BloomFilter(100)


def test_serialization_round_trip() -> None:
    bloom = filled(1_000)
    again = BloomFilter.from_bytes(bloom.to_bytes())
    assert again.to_bytes() == bloom.to_bytes()
    assert (again.count, again.size, again.hashes) == (bloom.count, bloom.size, bloom.hashes)
    assert all(dedup_key("edge-1", i) in again for i in range(1_000))


def test_the_bytes_are_stable_across_processes() -> None:
    # A fixed digest: a change of hashing, key encoding or layout breaks filters already on
    # disk, so it must show up here and come with a format version bump.
    data = filled(100).to_bytes()
    assert hashlib.sha256(data).hexdigest() == (
        "64dcfe09728c9e4b97cd61f91955e15657bf7df5d0e8611b40f767f16845a329"
    )


def test_dedup_key_layout() -> None:
    assert dedup_key("edge-1", -2) == bytes.fromhex("feffffffffffffff") + b"edge-1"
    assert dedup_key("a", 1) != dedup_key("a\x00", 1)


def test_every_bit_flip_and_truncation_of_the_bytes_is_corrupt() -> None:
    data = filled(20).to_bytes()
    for bit in range(len(data) * 8):
        broken = bytearray(data)
        broken[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(CorruptData):
            BloomFilter.from_bytes(bytes(broken))
    for cut in range(len(data)):
        with pytest.raises(CorruptData):
            BloomFilter.from_bytes(data[:cut])


def test_a_bad_error_rate_is_refused() -> None:
    with pytest.raises(ValueError, match="error_rate"):
        BloomFilter(10, 1.5)
