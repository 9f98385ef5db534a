"""Retention: which of a queue's oldest messages go, by age, count and size.

One rule for both kinds of queue, cut where the queue's units begin (a local queue's sealed
blocks, a shared queue's segments: never inside one), from the oldest end: a unit goes while
it is at least ``max_age`` old (its newest message's time: a block's seal time, a segment's
commit time), or while the queue holds more than ``max_messages`` messages or ``max_bytes``
bytes. So what is kept is at most ``max_messages`` messages and ``max_bytes`` bytes, and the
oldest unit kept is younger than ``max_age``. A local queue applies it to its sealed blocks
(``expired``); a shared queue asks PostgreSQL for the same cut (``Catalog.retention_cut``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class Unit(Protocol):
    """A block (or segment) as the rule sees it."""

    @property
    def count(self) -> int: ...

    @property
    def bytes(self) -> int: ...

    @property
    def sealed(self) -> float: ...


@dataclass(frozen=True, slots=True)
class Retention:
    """What an expire handler keeps; None: no limit of that kind."""

    max_age: float | None = None
    max_bytes: int | None = None
    max_messages: int | None = None

    def before(self, now: float) -> float | None:
        """Units stamped before this time are too old (None: no age limit)."""
        return None if self.max_age is None else now - self.max_age

    def expired(self, units: Sequence[Unit], messages: int, size: int, now: float) -> int:
        """How many of ``units`` (oldest first) go, given the queue's total ``messages`` and ``size``."""
        gone = 0
        for unit in units:
            too_old = self.max_age is not None and now - unit.sealed >= self.max_age
            too_big = self.max_bytes is not None and size > self.max_bytes
            too_many = self.max_messages is not None and messages > self.max_messages
            if not (too_old or too_big or too_many):
                break
            gone += 1
            messages -= unit.count
            size -= unit.bytes
        return gone
