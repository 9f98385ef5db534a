"""The janitor of a shared cluster: deletes the objects nobody references any more.

Two kinds of garbage. An object is *dead* once no segment points into it (compacted into a
block, expired, or all duplicates): its row says since when, and it is deleted from S3
``garbage_grace`` after that, then its row (a reader holding older segment rows keeps reading
it meanwhile). An *orphan* has no row at all: its node died between the PUT and the commit.
Orphans are found by LISTing ``shared/``: the key tells when it was written
(``object.key_time``: no HEAD per key), and one older than ``orphan_after`` with no row will
never be committed (a flush commits within the write timeout; the configuration refuses an
``orphan_after`` shorter than that). The LIST runs every half ``orphan_after``.

One node at a time (a PostgreSQL advisory lock, no leader); each pass deletes at most
``PER_PASS`` objects of each kind.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import NamedTuple

from capella.config import SharedSettings
from capella.core.stats import SharedStats
from capella.errors import KeyNotFound
from capella.shared import object as objects
from capella.shared.cache import ObjectCache
from capella.shared.catalog import Catalog
from capella.storage import Storage

log = logging.getLogger(__name__)

PER_PASS = 1000
DELETES_AT_ONCE = 8


class Swept(NamedTuple):
    dead: int  # dead objects deleted (and their rows)
    orphans: int  # objects without a row deleted
    locked: bool  # False: another node's janitor holds the lock, nothing was done


class Janitor:
    def __init__(
        self,
        settings: SharedSettings,
        storage: Storage,
        catalog: Catalog,
        cache: ObjectCache,
        *,
        stats: SharedStats,
        clock: Callable[[], float],
    ) -> None:
        self._settings = settings
        self._storage = storage
        self._catalog = catalog
        self._cache = cache
        self._stats = stats
        self._clock = clock
        self._scanned: float | None = None  # when this node last LISTed for orphans

    async def run_once(self, *, scan: bool | None = None) -> Swept:
        """One pass; ``scan`` forces (or skips) the orphan LIST, else it runs when due."""
        async with self._catalog.janitor_lock() as got:
            if not got:
                return Swept(0, 0, False)
            dead = await self._dead()
            now = self._clock()
            if scan is None:
                scan = self._scanned is None or now - self._scanned >= self._settings.orphan_after / 2
            orphans = 0
            if scan:
                self._scanned = now
                orphans = await self._orphans(now)
            return Swept(dead, orphans, True)

    async def _dead(self) -> int:
        keys = await self._catalog.dead_objects(self._settings.garbage_grace, PER_PASS)
        if not keys:
            return 0
        await self._delete(keys)
        forgotten = await self._catalog.forget_objects(keys)
        self._stats.garbage_objects += forgotten
        log.info("shared garbage deleted objects=%d", forgotten)
        return forgotten

    async def _orphans(self, now: float) -> int:
        old: list[str] = []
        for key in await self._storage.list(objects.PREFIX):
            written = objects.key_time(key)
            # A key of another shape is none of ours: left alone.
            if written is not None and now - written > self._settings.orphan_after:
                old.append(key)
        orphans: list[str] = []
        for at in range(0, len(old), PER_PASS):
            chunk = old[at : at + PER_PASS]
            known = await self._catalog.known_keys(chunk)
            orphans += [key for key in chunk if key not in known]
            if len(orphans) >= PER_PASS:
                break
        orphans = orphans[:PER_PASS]
        if orphans:
            await self._delete(orphans)
            self._stats.garbage_objects += len(orphans)
            log.info("shared orphans deleted objects=%d (uploaded, never committed)", len(orphans))
        return len(orphans)

    async def _delete(self, keys: list[str]) -> None:
        gate = asyncio.Semaphore(DELETES_AT_ONCE)

        async def one(key: str) -> None:
            async with gate:
                with contextlib.suppress(KeyNotFound):
                    await self._storage.delete(key)
            self._cache.discard(key)

        await asyncio.gather(*(one(key) for key in keys))
