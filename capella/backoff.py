"""The one backoff rule of the code base: how long to wait after the n-th failure in a row.

Every retry loop uses it (background tasks, handler passes, work-queue retries, S3 reads, the
client's stream reconnects), so "correct at any failure count" is proven once. The exponent is
capped before the power is taken: ``0.1 * 2**1100`` would raise ``OverflowError`` long before
the cap applied, which is how a loop that retried a full disk for a while once died.
"""

from __future__ import annotations

# 2.0**62 is far past any cap in seconds and still an exact, finite float.
_MAX_EXPONENT = 62


def backoff(failures: int, base: float, cap: float) -> float:
    """Seconds to wait after ``failures`` failures in a row: 0, then base, 2·base, 4·base … ≤ cap."""
    if failures <= 0:
        return 0.0
    return min(cap, base * 2.0 ** min(failures - 1, _MAX_EXPONENT))
