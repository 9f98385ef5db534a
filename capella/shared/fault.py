"""What stops this node's shared queues now: PostgreSQL or S3 unreachable, by part, since when.

A failed call notes its part (``failed("postgres", message)``); the next call of that part that
succeeds clears it (``ok("postgres")``). The node's loops keep probing a failed part, so a fault
clears by itself once PostgreSQL or S3 answer again, also when no write comes to show it.
``/readyz`` and every shared queue's status read ``text`` and ``since``.
"""

from __future__ import annotations

from collections.abc import Callable

POSTGRES = "postgres"
S3 = "s3"


class Faults:
    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._now: dict[str, tuple[str, float]] = {}

    def failed(self, part: str, message: str) -> None:
        """``part`` failed with ``message``; the time of its first failure is kept."""
        since = self._now[part][1] if part in self._now else self._clock()
        self._now[part] = (message, since)

    def ok(self, part: str) -> None:
        self._now.pop(part, None)

    def __contains__(self, part: str) -> bool:
        return part in self._now

    @property
    def parts(self) -> list[str]:
        return sorted(self._now)

    @property
    def text(self) -> str | None:
        """The messages of every failing part, or None when nothing fails."""
        if not self._now:
            return None
        return "; ".join(self._now[part][0] for part in sorted(self._now))

    @property
    def since(self) -> float:
        """When the oldest fault began (0.0 when nothing fails)."""
        return min((since for _, since in self._now.values()), default=0.0)
