"""Budgets of failed logins by key (a client address, a user name): token buckets, bounded in memory.

A key starts with ``burst`` tokens and earns them back evenly, ``burst`` per ``window``. A
password check takes one before it runs and a check that succeeds gives it back, so only
failures spend the budget, and checks still running count too (a hundred sent at once cannot
all slip in before the first one fails). A key whose bucket is full again holds no state and
is forgotten; past ``size`` keys the least recently used one is dropped. The clock is passed
in.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Hashable
from dataclasses import dataclass

KEYS = 10_000


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float


class Throttle:
    """Token buckets of ``burst`` tokens, refilled at ``burst / window`` per second."""

    def __init__(self, burst: int, window: float, *, size: int = KEYS) -> None:
        self._burst = float(burst)
        self._rate = burst / window
        self._size = size
        self._buckets: dict[Hashable, _Bucket] = {}

    def __len__(self) -> int:
        return len(self._buckets)

    def wait(self, key: Hashable, now: float) -> float:
        """Seconds until ``key`` has a token; 0 when it has one now."""
        bucket = self._buckets.get(key)
        if bucket is None:
            return 0.0
        tokens = self._level(bucket, now)
        return 0.0 if tokens >= 1.0 else (1.0 - tokens) / self._rate

    def spent(self, key: Hashable, now: float) -> bool:
        """Whether ``key`` has spent any of its budget that it has not earned back yet."""
        bucket = self._buckets.get(key)
        return bucket is not None and self._level(bucket, now) < self._burst

    def take(self, key: Hashable, now: float) -> float:
        """Take a token from ``key`` (check ``wait`` first); the tokens left."""
        bucket = self._buckets.pop(key, None)  # re-inserted last: the most recently used
        if bucket is None:
            if len(self._buckets) >= self._size:
                del self._buckets[next(iter(self._buckets))]
            bucket = _Bucket(self._burst, now)
        bucket.tokens = self._level(bucket, now) - 1.0
        bucket.at = now
        self._buckets[key] = bucket
        return bucket.tokens

    def give(self, key: Hashable, now: float) -> None:
        """Give back the token a successful check took."""
        bucket = self._buckets.get(key)
        if bucket is None:
            return
        bucket.tokens = self._level(bucket, now) + 1.0
        bucket.at = now
        if bucket.tokens >= self._burst:
            del self._buckets[key]

    def _level(self, bucket: _Bucket, now: float) -> float:
        return min(self._burst, bucket.tokens + max(0.0, now - bucket.at) * self._rate)


def client_key(address: str) -> str:
    """The budget key of a client address: IPv4 as it is, IPv6 by its /64.

    One IPv6 host usually holds a whole /64, so a key per address would give it 2**64 budgets.
    """
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address  # not an IP (a Unix socket): one key
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)
