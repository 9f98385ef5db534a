"""The retry policy of an ack-mode subscription, and the pure rules that apply it.

``retry_delay`` says how long a failed message waits before it may be claimed again.
``apply_policy`` lays a ``policy`` decoded into its wire struct (``wire/work.py``
``RetryPolicy``, the body of ``PUT .../subscriptions/{name}``) over the current policy
(``RetrySettings``: every value set), naming the bad field in every error; ``parse_policy``
decodes one first (a stored subscription, a push handler's params).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import msgspec
from msgspec import UNSET

from capella.backoff import backoff
from capella.core.definition import check_name
from capella.errors import InvalidRequest
from capella.units import parse_duration
from capella.wire import work as wire
from capella.wire.decode import decode
from capella.wire.fields import MAX_LEASE

BACKOFFS = ("fixed", "exponential")
MAX_ATTEMPTS = 1_000_000


@dataclass(frozen=True, slots=True)
class RetrySettings:
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

    def to_wire(self) -> wire.RetryPolicy:
        """The policy as answers show it: every field set."""
        return wire.RetryPolicy(
            lease=self.lease,
            max_attempts=self.max_attempts,
            backoff=self.backoff,  # type: ignore[arg-type]  # one of BACKOFFS
            delay=self.delay,
            max_delay=self.max_delay,
            jitter=self.jitter,
            dead_letter=self.dead_letter,
        )

    def to_dict(self) -> dict[str, Any]:
        """``to_wire`` as plain JSON values: the stored form."""
        stored: dict[str, Any] = msgspec.to_builtins(self.to_wire())
        return stored


def retry_delay(policy: RetrySettings, failures: int, rand: float) -> float:
    """Seconds before a message that failed ``failures`` times may be claimed again.

    ``rand`` is a number in [0, 1) from the caller, so the rule stays a pure function.
    """
    if policy.backoff == "fixed":
        base = min(policy.delay, policy.max_delay)
    else:
        base = backoff(max(failures, 1), policy.delay, policy.max_delay)
    spread = base * policy.jitter * (2.0 * rand - 1.0)
    return max(0.0, min(base + spread, policy.max_delay))


def exhausted(policy: RetrySettings, attempts: int) -> bool:
    """Whether a message that failed after ``attempts`` claims goes to the dead letters."""
    return policy.max_attempts > 0 and attempts >= policy.max_attempts


def parse_policy(data: object, base: RetrySettings) -> RetrySettings:
    """The ``policy`` object ``data`` (decoded here) over ``base``."""
    return apply_policy(decode(data, wire.RetryPolicy, at="policy"), base)


def apply_policy(body: wire.RetryPolicy, base: RetrySettings) -> RetrySettings:
    """The fields ``body`` gives over ``base``, each checked."""
    policy = base
    if body.lease is not UNSET:
        lease = _seconds(body.lease, "lease")
        if not 0 < lease <= MAX_LEASE:
            raise InvalidRequest("policy.lease must be more than 0 and at most 12h", field="policy.lease")
        policy = replace(policy, lease=lease)
    if body.max_attempts is not UNSET:
        if not 0 <= body.max_attempts <= MAX_ATTEMPTS:
            raise InvalidRequest(
                f"policy.max_attempts must be an integer from 0 (no limit) to {MAX_ATTEMPTS}",
                field="policy.max_attempts",
            )
        policy = replace(policy, max_attempts=body.max_attempts)
    if body.backoff is not UNSET:
        policy = replace(policy, backoff=body.backoff)
    if body.delay is not UNSET:
        policy = replace(policy, delay=_seconds(body.delay, "delay"))
    if body.max_delay is not UNSET:
        policy = replace(policy, max_delay=_seconds(body.max_delay, "max_delay"))
    if body.jitter is not UNSET:
        if not 0 <= body.jitter <= 1:
            raise InvalidRequest("policy.jitter must be a number from 0 to 1", field="policy.jitter")
        policy = replace(policy, jitter=body.jitter)
    if body.dead_letter is not UNSET:
        if body.dead_letter is not None:
            try:
                check_name(body.dead_letter, "dead-letter queue")
            except InvalidRequest as exc:
                raise InvalidRequest(exc.message, field="policy.dead_letter") from None
        policy = replace(policy, dead_letter=body.dead_letter)
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
