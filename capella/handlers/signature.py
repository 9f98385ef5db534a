"""The signature of a pushed request: HMAC-SHA256 over a timestamp and the body.

The push handler sends ``Capella-Signature: t=<UNIX seconds>,v1=<hex digest>`` where the
digest is ``HMAC-SHA256(secret, "<t>." + body)``. Signing the timestamp with the body lets a
receiver refuse an old request replayed by someone who recorded it: it checks the digest
and that ``t`` is within a tolerance of its own clock. Both functions are pure (the time is
passed in); docs/push.md shows the same check in a receiver that does not use Capella.
"""

from __future__ import annotations

import hashlib
import hmac

HEADER = "Capella-Signature"
# How far a receiver's clock and the timestamp may be apart (seconds) by default.
TOLERANCE = 300.0


def sign(secret: bytes, body: bytes, timestamp: int) -> str:
    """The ``Capella-Signature`` value for ``body`` sent at ``timestamp``."""
    digest = hmac.new(secret, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


def verify(secret: bytes, body: bytes, header: str, now: float, tolerance: float = TOLERANCE) -> bool:
    """Whether ``header`` signs ``body`` with ``secret`` at a time within ``tolerance`` of ``now``."""
    fields: dict[str, list[str]] = {}
    for part in header.split(","):
        key, sep, value = part.strip().partition("=")
        if sep:
            fields.setdefault(key, []).append(value)
    stamps = fields.get("t", [])
    if len(stamps) != 1 or not stamps[0].isdigit():
        return False
    timestamp = int(stamps[0])
    if abs(now - timestamp) > tolerance:
        return False
    expected = sign(secret, body, timestamp).rpartition("v1=")[2]
    # A sender that rotates its secret may sign with both for a while: any v1 may match.
    return any(hmac.compare_digest(expected, given) for given in fields.get("v1", []))
