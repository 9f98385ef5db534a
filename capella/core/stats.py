"""Counters, histograms and findings the core keeps; ``metrics.py`` and the stats read them."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

FLUSH_BOUNDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


@dataclass(slots=True)
class Histogram:
    """Observations counted per bucket; ``counts`` is per bucket (not cumulative), last is +Inf."""

    bounds: tuple[float, ...] = FLUSH_BOUNDS
    counts: list[int] = field(default_factory=list)
    sum: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1


@dataclass(slots=True)
class ProtocolStats:
    """A front door's counters since the process started (the Kafka listener's), kept by the
    door and read by ``metrics.py`` through ``Cluster.doors``."""

    connections: int = 0
    open_connections: int = 0
    refused_connections: int = 0
    closed_by_error: int = 0
    sign_in_failures: int = 0
    requests: dict[str, int] = field(default_factory=dict)  # by API name
    errors: dict[tuple[str, int], int] = field(default_factory=dict)  # by (API name, error code)

    def request(self, api: str) -> None:
        self.requests[api] = self.requests.get(api, 0) + 1

    def error(self, api: str, code: int) -> None:
        self.errors[(api, code)] = self.errors.get((api, code), 0) + 1


@dataclass(slots=True)
class QueueCounters:
    """Monotonic counters of one queue since the process started."""

    produced: int = 0
    duplicates: int = 0
    read: int = 0
    produce_requests: int = 0
    read_requests: int = 0
    flushes: int = 0
    sealed_blocks: int = 0


@dataclass(slots=True)
class Recovery:
    """What recovery found (and quarantines found later); shown in the queue's stats."""

    truncated_bytes: int = 0
    quarantined: list[str] = field(default_factory=list)
    gaps: list[tuple[int, int]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "truncated_bytes": self.truncated_bytes,
            "quarantined_blocks": list(self.quarantined),
            "gaps": [{"from_id": lo, "to_id": hi} for lo, hi in self.gaps],
        }


@dataclass(slots=True)
class SharedStats:
    """A node's shared-queue counters since the process started (``capella.shared``)."""

    flushes: int = 0
    objects: int = 0
    puts: int = 0
    put_bytes: int = 0
    gets: int = 0
    get_bytes: int = 0
    duplicates: int = 0
    compactions: int = 0
    compacted_objects: int = 0
    garbage_objects: int = 0
    notifications: int = 0
    failures: dict[str, int] = field(default_factory=dict)  # by step: put, commit, listen...
    flush_seconds: Histogram = field(default_factory=Histogram)
    commit_seconds: Histogram = field(default_factory=Histogram)
