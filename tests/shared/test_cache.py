"""The object cache: an LRU by bytes, pins for a node's own objects, a read policy, one GET per miss."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.clock import Clock
from support.faults import FaultProxy
from support.servers import S3Server

from capella.errors import CorruptData, InvalidRequest, KeyNotFound
from capella.shared.cache import ObjectCache
from capella.storage import Journal, Storage, open_storage
from capella.storage.memory import MemoryStorage


class CountingStorage:
    """A storage that counts its reads and can hold them until released (a test double of the
    *storage*, around a real provider)."""

    def __init__(self, inner: Storage) -> None:
        self.inner = inner
        self.gets: Counter[str] = Counter()
        self.ranges: Counter[tuple[str, int, int]] = Counter()
        self.gate = asyncio.Event()
        self.gate.set()
        self.waiting = 0

    async def get(self, key: str) -> bytes:
        self.gets[key] += 1
        await self._held()
        return await self.inner.get(key)

    async def get_range(self, key: str, start: int, length: int) -> bytes:
        self.ranges[key, start, length] += 1
        await self._held()
        return await self.inner.get_range(key, start, length)

    async def put(self, key: str, value: bytes) -> None:
        await self.inner.put(key, value)

    async def delete(self, key: str) -> None:
        await self.inner.delete(key)

    async def list(self, prefix: str) -> list[str]:
        return await self.inner.list(prefix)

    async def journal(self, key: str, *, truncate_to: int | None = None) -> Journal:
        return await self.inner.journal(key, truncate_to=truncate_to)

    async def close(self) -> None:
        await self.inner.close()

    async def _held(self) -> None:
        self.waiting += 1
        try:
            await asyncio.wait_for(self.gate.wait(), 5.0)
        finally:
            self.waiting -= 1


@pytest.fixture
async def store() -> CountingStorage:
    storage = CountingStorage(MemoryStorage())
    for name, size in [("a", 1000), ("b", 1000), ("big", 50_000)]:
        await storage.put(name, bytes(range(256)) * (size // 256) + bytes(size % 256))
    return storage


async def released(store: CountingStorage, waiters: int) -> None:
    """Let the held GETs go once ``waiters`` of them wait (bounded: 2 s)."""
    for _ in range(200):
        if store.waiting >= waiters:
            break
        await asyncio.sleep(0.01)
    assert store.waiting == waiters
    store.gate.set()


# --- the LRU and the pins ----------------------------------------------------------------


def test_the_least_recently_used_goes_first_by_bytes(clock: Clock) -> None:
    cache = ObjectCache(100, clock)
    for key in "abc":
        cache.put(key, b"x" * 40)
    assert cache.get("a") is None
    assert cache.get("b") == b"x" * 40  # now the most recent
    cache.put("d", b"y" * 40)
    assert (cache.get("c"), cache.get("b"), cache.get("d")) == (None, b"x" * 40, b"y" * 40)
    stats = cache.stats
    assert (stats.entries, stats.bytes, stats.hits, stats.misses) == (2, 80, 3, 2)


def test_an_object_larger_than_the_cache_is_not_kept(clock: Clock) -> None:
    cache = ObjectCache(100, clock)
    cache.put("k", b"small")
    cache.put("k", b"x" * 101)
    assert cache.get("k") is None
    assert (cache.stats.entries, cache.stats.bytes) == (0, 0)


def test_a_put_replaces_and_counts_bytes_once(clock: Clock) -> None:
    cache = ObjectCache(100, clock)
    cache.put("k", b"x" * 60)
    cache.put("k", b"y" * 30)
    assert cache.get("k") == b"y" * 30
    assert cache.stats.bytes == 30


def test_pinned_objects_stay_until_their_time_then_are_ordinary(clock: Clock) -> None:
    cache = ObjectCache(100, clock)
    cache.pin("own-1", b"p" * 60, until=clock.now + 5)
    for key in "abcd":
        cache.put(key, b"x" * 30)  # pressure: only one fits beside the pin
    assert cache.get("own-1") == b"p" * 60
    assert [cache.get(k) is not None for k in "abcd"] == [False, False, False, True]
    assert cache.stats.pinned == 1

    clock.now += 5
    assert cache.stats.pinned == 0
    cache.put("e", b"x" * 30)
    cache.put("f", b"x" * 30)  # the old pin is now the least recently used
    assert cache.get("own-1") is None
    assert cache.get("f") is not None


def test_pins_may_exceed_the_bound_and_the_lru_gives_way(clock: Clock) -> None:
    cache = ObjectCache(100, clock)
    cache.put("a", b"x" * 50)
    cache.pin("own-1", b"p" * 80, until=clock.now + 1)
    cache.pin("own-2", b"p" * 80, until=clock.now + 2)
    assert cache.get("a") is None
    assert cache.stats.bytes == 160
    clock.now += 1.5
    assert cache.get("own-1") is None  # ordinary again, and 80 + 80 > 100
    assert cache.get("own-2") is not None


def test_a_pin_in_the_past_is_an_ordinary_put_and_a_repin_keeps_the_later_time(clock: Clock) -> None:
    cache = ObjectCache(100, clock)
    cache.pin("k", b"x", until=clock.now)
    assert cache.stats.pinned == 0 and cache.get("k") == b"x"
    cache.pin("k", b"x", until=clock.now + 10)
    cache.pin("k", b"x", until=clock.now + 1)
    clock.now += 5
    assert cache.stats.pinned == 1


def test_discard_forgets_pinned_and_ordinary_entries(clock: Clock) -> None:
    cache = ObjectCache(100, clock)
    cache.put("a", b"1")
    cache.pin("b", b"22", until=clock.now + 9)
    cache.discard("a")
    cache.discard("b")
    cache.discard("never")
    assert (cache.get("a"), cache.get("b"), cache.stats.bytes) == (None, None, 0)


def test_a_negative_bound_is_refused(clock: Clock) -> None:
    with pytest.raises(InvalidRequest):
        ObjectCache(-1, clock)


# --- fetch: the read policy --------------------------------------------------------------


async def test_a_node_s_own_pinned_object_is_read_without_a_get(clock: Clock, store: CountingStorage) -> None:
    cache = ObjectCache(10_000, clock)
    data = await store.inner.get("a")
    cache.pin("a", data, until=clock.now + 5)
    assert await cache.fetch("a", 10, 20, store, size=1000, whole_below=0) == data[10:30]
    assert not store.gets and not store.ranges


async def test_an_object_below_the_limit_is_got_whole_once_for_every_read(
    clock: Clock, store: CountingStorage
) -> None:
    cache = ObjectCache(10_000, clock)
    data = await store.inner.get("a")
    for start in range(0, 1000, 100):
        assert (
            await cache.fetch("a", start, 100, store, size=1000, whole_below=4096)
            == data[start : start + 100]
        )
    assert store.gets == {"a": 1} and not store.ranges
    stats = cache.stats
    assert (stats.whole_gets, stats.range_gets, stats.fetched_bytes, stats.hits, stats.misses) == (
        1,
        0,
        1000,
        9,
        1,
    )


async def test_a_large_or_unsized_object_is_read_by_ranges_and_not_kept(
    clock: Clock, store: CountingStorage
) -> None:
    cache = ObjectCache(10_000, clock)
    big = await store.inner.get("big")
    assert await cache.fetch("big", 100, 50, store, size=50_000, whole_below=4096) == big[100:150]
    assert await cache.fetch("big", 100, 50, store, size=50_000, whole_below=4096) == big[100:150]
    assert (
        await cache.fetch("a", 0, 10, store, size=None, whole_below=4096) == (await store.inner.get("a"))[:10]
    )
    assert store.ranges == {("big", 100, 50): 2, ("a", 0, 10): 1} and not store.gets
    assert cache.stats.entries == 0


async def test_an_object_the_cache_cannot_hold_is_read_by_ranges(
    clock: Clock, store: CountingStorage
) -> None:
    cache = ObjectCache(500, clock)
    await cache.fetch("a", 0, 10, store, size=1000, whole_below=4096)
    assert store.ranges == {("a", 0, 10): 1} and not store.gets


async def test_concurrent_misses_of_one_object_make_one_get(clock: Clock, store: CountingStorage) -> None:
    cache = ObjectCache(10_000, clock)
    data = await store.inner.get("a")
    store.gate.clear()
    reads = [
        asyncio.create_task(cache.fetch("a", i * 10, 10, store, size=1000, whole_below=4096))
        for i in range(20)
    ]
    await released(store, 1)
    assert await asyncio.gather(*reads) == [data[i * 10 : i * 10 + 10] for i in range(20)]
    assert store.gets == {"a": 1}


async def test_concurrent_misses_of_one_range_make_one_ranged_get(
    clock: Clock, store: CountingStorage
) -> None:
    cache = ObjectCache(10_000, clock)
    store.gate.clear()
    reads = [
        asyncio.create_task(cache.fetch("big", 7, 70, store, size=None, whole_below=0)) for _ in range(10)
    ]
    other = asyncio.create_task(cache.fetch("big", 8, 70, store, size=None, whole_below=0))
    await released(store, 2)
    assert len(set(await asyncio.gather(*reads))) == 1
    await other
    assert store.ranges == {("big", 7, 70): 1, ("big", 8, 70): 1}


async def test_a_failed_get_fails_every_waiter_and_the_next_miss_tries_again(
    clock: Clock, store: CountingStorage
) -> None:
    cache = ObjectCache(10_000, clock)
    store.gate.clear()
    reads = [
        asyncio.create_task(cache.fetch("gone", 0, 10, store, size=100, whole_below=4096)) for _ in range(5)
    ]
    await released(store, 1)
    for read in reads:
        with pytest.raises(KeyNotFound):
            await read
    await store.put("gone", b"back again")
    assert await cache.fetch("gone", 0, 4, store, size=10, whole_below=4096) == b"back"
    assert store.gets == {"gone": 2}


async def test_a_cancelled_reader_does_not_cancel_the_get_for_the_others(
    clock: Clock, store: CountingStorage
) -> None:
    cache = ObjectCache(10_000, clock)
    store.gate.clear()
    first = asyncio.create_task(cache.fetch("a", 0, 10, store, size=1000, whole_below=4096))
    second = asyncio.create_task(cache.fetch("a", 10, 10, store, size=1000, whole_below=4096))
    for _ in range(200):
        if store.waiting:
            break
        await asyncio.sleep(0.01)
    first.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await first
    store.gate.set()
    assert await second == (await store.inner.get("a"))[10:20]
    assert store.gets == {"a": 1}
    assert cache.get("a") is not None


async def test_a_range_past_the_end_answers_as_the_storage_does(clock: Clock, store: CountingStorage) -> None:
    cache = ObjectCache(10_000, clock)
    assert await cache.fetch("a", 990, 100, store, size=1000, whole_below=4096) == await store.get_range(
        "a", 990, 100
    )
    with pytest.raises(CorruptData, match="starts at byte"):
        await cache.fetch("a", 1000, 1, store, size=1000, whole_below=4096)
    with pytest.raises(InvalidRequest):
        await cache.fetch("a", 0, 0, store, size=1000, whole_below=4096)


@pytest.mark.s3
async def test_concurrent_misses_against_s3_make_one_get_on_the_wire(
    clock: Clock, s3_server: S3Server, proxy: FaultProxy
) -> None:
    """Counted where moto sees them: every request through the fault proxy, by kind."""
    bucket = await asyncio.to_thread(s3_server.create_bucket)
    store = open_storage("s3", s3_server.mount_options(bucket, endpoint_url=proxy.url))
    with proxy.faulty():
        try:
            value = bytes(range(256)) * 4096  # 1 MiB
            await store.put("shared/o.cpo", value)
            cache = ObjectCache(8 * 1024 * 1024, clock)
            reads = [
                cache.fetch("shared/o.cpo", i * 4096, 4096, store, size=len(value), whole_below=4 << 20)
                for i in range(32)
            ]
            assert await asyncio.gather(*reads) == [value[i * 4096 : (i + 1) * 4096] for i in range(32)]
            assert (
                await cache.fetch("shared/o.cpo", 5, 5, store, size=len(value), whole_below=0) == value[5:10]
            )
            assert proxy.bucket_calls[bucket] == {"PUT": 1, "GET": 1}

            other = ObjectCache(8 * 1024 * 1024, clock)
            ranged = [other.fetch("shared/o.cpo", 64, 64, store, size=None, whole_below=0) for _ in range(8)]
            assert set(await asyncio.gather(*ranged)) == {value[64:128]}
            assert proxy.bucket_calls[bucket] == {"PUT": 1, "GET": 1, "GET range": 1}
        finally:
            await store.close()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["put", "pin", "get", "discard", "tick"]), st.integers(0, 5),
                          st.integers(1, 70)), max_size=60))  # fmt: skip
def test_the_byte_count_and_the_bound_hold_under_any_calls(calls: list[tuple[str, int, int]]) -> None:
    clock = Clock()
    cache = ObjectCache(100, clock)
    pins: dict[str, float] = {}  # what must be there: key -> until
    for op, k, n in calls:
        key = f"k{k}"
        if op == "put":
            cache.put(key, bytes(n))
        elif op == "pin":
            cache.pin(key, bytes(n), until=clock.now + n / 10)
            pins[key] = max(pins.get(key, 0.0), clock.now + n / 10)
        elif op == "get":
            cache.get(key)
        elif op == "discard":
            cache.discard(key)
            pins.pop(key, None)
        else:
            clock.now += n / 20
        live = {key for key, until in pins.items() if until > clock.now}
        held = {key: cache.get(key) for key in (f"k{i}" for i in range(6))}
        present = {key: data for key, data in held.items() if data is not None}
        stats = cache.stats
        assert stats.bytes == sum(map(len, present.values()))
        assert stats.entries == len(present)
        assert live <= set(present)
        assert stats.pinned == len(live)
        pinned_bytes = sum(len(present[key]) for key in live)
        assert stats.bytes <= max(100, pinned_bytes)
