"""The retry policy of an ack-mode subscription, and the pure rules that apply it.

``retry_delay`` says how long a failed message waits before it may be claimed again;
``parse_policy`` reads the ``policy`` object of ``PUT .../subscriptions/{name}``, naming the
bad field in every error.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from capella.backoff import backoff
from capella.core.definition import check_name
from capella.errors import InvalidRequest
from capella.units import parse_duration

BACKOFFS = ("fixed", "exponential")
MAX_LEASE = 12 * 3600.0
MAX_ATTEMPTS = 1_000_000


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How claims are leased and failures retried.

    ``max_attempts`` counts claims (0: no limit); the claim after the last failed one goes to
    the dead letters instead. A retry waits ``delay`` (``fixed``) or ``delay * 2**(n-1)``
    after the n-th failure (``exponential``), never more than ``max_delay``, spread by
    ``± jitter`` of itself so that workers failing together do not come back together.
    """

    lease: float = 30.0
    max_attempts: int = 5
    backoff: str = "exponential"
    delay: float = 1.0
    max_delay: float = 300.0
    jitter: float = 0.1
    dead_letter: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "lease": self.lease,
            "max_attempts": self.max_attempts,
            "backoff": self.backoff,
            "delay": self.delay,
            "max_delay": self.max_delay,
            "jitter": self.jitter,
            "dead_letter": self.dead_letter,
        }


def retry_delay(policy: RetryPolicy, failures: int, rand: float) -> float:
    """Seconds before a message that failed ``failures`` times may be claimed again.

    ``rand`` is a number in [0, 1) from the caller, so the rule stays a pure function.
    """
    if policy.backoff == "fixed":
        base = min(policy.delay, policy.max_delay)
    else:
        base = backoff(max(failures, 1), policy.delay, policy.max_delay)
    spread = base * policy.jitter * (2.0 * rand - 1.0)
    return max(0.0, min(base + spread, policy.max_delay))


def exhausted(policy: RetryPolicy, attempts: int) -> bool:
    """Whether a message that failed after ``attempts`` claims goes to the dead letters."""
    return policy.max_attempts > 0 and attempts >= policy.max_attempts


def parse_policy(data: object, base: RetryPolicy) -> RetryPolicy:
    """Apply the fields present in ``data`` on top of ``base``."""
    if not isinstance(data, dict):
        raise InvalidRequest("policy must be an object", field="policy")
    allowed = {"lease", "max_attempts", "backoff", "delay", "max_delay", "jitter", "dead_letter"}
    if unknown := sorted(set(data) - allowed):
        raise InvalidRequest(f"unknown field 'policy.{unknown[0]}'", field=f"policy.{unknown[0]}")
    policy = base
    if "lease" in data:
        lease = _seconds(data["lease"], "lease")
        if not 0 < lease <= MAX_LEASE:
            raise InvalidRequest("policy.lease must be more than 0 and at most 12h", field="policy.lease")
        policy = replace(policy, lease=lease)
    if "max_attempts" in data:
        value = data["max_attempts"]
        if type(value) is not int or not 0 <= value <= MAX_ATTEMPTS:
            raise InvalidRequest(
                f"policy.max_attempts must be an integer from 0 (no limit) to {MAX_ATTEMPTS}",
                field="policy.max_attempts",
            )
        policy = replace(policy, max_attempts=value)
    if "backoff" in data:
        if data["backoff"] not in BACKOFFS:
            raise InvalidRequest("policy.backoff must be fixed or exponential", field="policy.backoff")
        policy = replace(policy, backoff=data["backoff"])
    if "delay" in data:
        policy = replace(policy, delay=_seconds(data["delay"], "delay"))
    if "max_delay" in data:
        policy = replace(policy, max_delay=_seconds(data["max_delay"], "max_delay"))
    if "jitter" in data:
        value = data["jitter"]
        if type(value) not in (int, float) or not 0 <= value <= 1:
            raise InvalidRequest("policy.jitter must be a number from 0 to 1", field="policy.jitter")
        policy = replace(policy, jitter=float(value))
    if "dead_letter" in data:
        value = data["dead_letter"]
        if value is not None:
            try:
                check_name(value, "dead-letter queue")
            except InvalidRequest as exc:
                raise InvalidRequest(exc.message, field="policy.dead_letter") from None
        policy = replace(policy, dead_letter=value)
    if policy.delay > policy.max_delay:
        raise InvalidRequest("policy.delay must not be more than policy.max_delay", field="policy.delay")
    return policy


def _seconds(value: object, name: str) -> float:
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise InvalidRequest(f"policy.{name}: {exc}", field=f"policy.{name}") from None
    if seconds != seconds or seconds > 10 * 365 * 86_400:
        raise InvalidRequest(f"policy.{name} must be a finite duration", field=f"policy.{name}")
    return seconds
