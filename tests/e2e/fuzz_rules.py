"""What the OpenAPI document cannot state at all, as schemathesis hooks.

``test_schemathesis_finds_no_disagreement`` (test_fuzz.py) loads this module
(``SCHEMATHESIS_HOOKS``) so that schemathesis does not send a request as one the document
allows when no document could say whether it is. Every bound that JSON Schema can say is in
the document itself (numbers, patterns, lengths, durations and sizes in text: issue 34), and
these hooks skip only the rest, each for its reason:

1. **A range's order** (``segments`` in a query or a body, ``[lo, hi]`` pairs, an archive
   condition's ``from_age`` below ``to_age``): JSON Schema compares a value with constants,
   never with another value.
2. **A retry policy's delay not above its max_delay**, which may be the one the subscription
   already has: a rule across fields and across requests.
3. **Times relative to now** (``external_time`` not in the future, ``deliver_at`` at most ten
   years ahead): the document is the same at every moment; it states the fixed bound (no later
   than 9999) and the rest in words.
4. **What the server holds**: its mounts ([mounts.NAME]), the secrets its operator declared
   ([secrets.NAME]), the files it may read (``ca_file``, a dsn's ssl files): another server's
   differ, so no document lists them. ``map_case`` points a handler's queues and dead-letter
   queues, and an archive mark, at objects the run created, for the same reason.
5. **Keeping the run's own objects**: a DELETE of the run's queues, or a queue narrowed to a
   segment range, would make later valid requests fail for reasons of state, not of the document.
6. **What the server does not see**: a case that schemathesis calls invalid only in its
   ``Authorization`` header (authentication is off in this run) or in a query parameter
   generated as an empty list, which is sent as nothing.
"""

from __future__ import annotations

import re
import time
from typing import Any

import schemathesis

from capella.handlers.push import SECRET_PARAMS
from capella.units import parse_duration
from capella.wire import parse_time
from capella.wire.fields import DURATION_PATTERN

TEN_YEARS = 10 * 365 * 86_400
# The queues the test creates before the run: a handler or a dead-letter queue names an
# existing queue, which a generated name seldom is.
QUEUE, OTHER_QUEUE = "orders", "copies"
# The mounts of the server under test (its capella.toml): [mounts.default] only.
MOUNTS = {"default"}
DURATION = re.compile(DURATION_PATTERN)


@schemathesis.hook
def filter_case(ctx: schemathesis.HookContext, case: schemathesis.Case) -> bool:
    """False for a case that breaks a rule the document states in words, or that would make
    later valid requests fail (a queue narrowed to a segment range refuses writes outside it)."""
    query = case.query or {}
    if isinstance(query.get("segments"), str) and not ranges_in_order(query["segments"]):
        return False
    if in_the_future(query.get("external_time")):
        return False
    if case.method == "DELETE" and (case.path_parameters or {}).get("queue") in (QUEUE, OTHER_QUEUE):
        return False  # schemathesis reuses names from answers: the run's queues stay
    body = case.body
    queue_put = case.operation.label == "PUT /v1/queues/{queue}"
    if queue_put and isinstance(body, dict) and body.get("segments") is not None:
        return False
    if isinstance(body, dict) and isinstance(body.get("ca_file"), str):
        return False  # a PEM file on the server: the run has none
    if names_a_file(body):
        return False  # a dsn's sslrootcert, sslcert or sslkey: a file on the server (4)
    if names_a_secret(body):
        return False  # a secret the operator declared ([secrets.NAME]): the run has none
    if invalid_only_where_unseen(case):
        return False
    return not breaks_a_rule(body)


def invalid_only_where_unseen(case: schemathesis.Case) -> bool:
    """Whether a case labelled invalid is invalid only where the server cannot see it.

    That is the ``Authorization`` header (authentication is off in this run, so the server
    does not read it) and a query parameter generated as an empty list, which is sent as
    nothing: seed 20261123 sent ``header.{name}: []`` with a malformed Authorization to
    ``GET /v1/queues/{queue}/scheduled``, a valid request, and reported the 200 as a
    disagreement ("Schema-violating request accepted").
    """
    meta = case.meta
    if meta is None or meta.generation.mode is not schemathesis.GenerationMode.NEGATIVE:
        return False
    mutations = getattr(meta.phase.data, "mutations", ())
    query = case.query or {}

    def unseen(mutation: Any) -> bool:
        where = getattr(mutation.parameter_location, "value", mutation.parameter_location)
        if where == "header":
            return str(mutation.parameter).lower() == "authorization"
        return where == "query" and query.get(mutation.parameter) == []

    return bool(mutations) and all(map(unseen, mutations))


@schemathesis.hook
def map_case(ctx: schemathesis.HookContext, case: schemathesis.Case) -> schemathesis.Case:
    """A handler's queues and any dead-letter queue name the queues the server holds."""
    body = case.body
    if not isinstance(body, dict):
        return case
    if case.operation.label == "PUT /v1/handlers/{name}":
        # Only names the document allows become the run's: a case that is invalid on purpose
        # (an empty name) stays invalid.
        queues = body.get("queues")
        if isinstance(queues, list) and queues and all(isinstance(q, str) and q for q in queues):
            body["queues"] = [QUEUE]
        if isinstance(body.get("queue"), str) and body["queue"]:
            body["queue"] = QUEUE
        # Defined stopped: a started one's passes would reach for the generated hosts and
        # databases, and each later replace or drop waits (up to the supervisor's grace) for
        # a pass stuck in a connect; a run took minutes.
        # (A value that is not a boolean stays: the case is invalid on purpose.)
        if isinstance(body.get("started", True), bool):
            body["started"] = False
        params = body.get("params")
        if isinstance(params, dict):
            for name, queue in (("from", QUEUE), ("to", OTHER_QUEUE), ("dead_letter", OTHER_QUEUE)):
                if isinstance(params.get(name), str) and params[name]:
                    params[name] = queue
            # An archive condition's mark is one the queue maps to a mount (its description
            # says so): the run's queues map mark 0 only.
            conditions = params.get("conditions")
            for condition in conditions if isinstance(conditions, list) else ():
                mark = condition.get("mark") if isinstance(condition, dict) else None
                if _numbers(mark) and float(mark).is_integer() and 0 <= mark <= 255:  # 14.0 too
                    condition["mark"] = 0
    policy = body.get("policy")
    if isinstance(policy, dict) and isinstance(policy.get("dead_letter"), str) and policy["dead_letter"]:
        policy["dead_letter"] = OTHER_QUEUE
    return case


def breaks_a_rule(value: Any) -> bool:
    """Whether a body, at any depth, holds a reversed range (1: segments, an archive
    condition's ages), a retry delay above its cap (2), a time past a bound of now (3), or a
    mount the server does not have (4)."""
    if isinstance(value, list):
        return any(breaks_a_rule(item) for item in value)
    if not isinstance(value, dict):
        return False
    segments = value.get("segments")
    if (
        isinstance(segments, dict)
        and _numbers(segments.get("min"), segments.get("max"))
        and segments["min"] > segments["max"]
    ):
        return True
    if isinstance(segments, str) and not ranges_in_order(segments):
        return True
    if isinstance(segments, list) and not pairs_in_order(segments):
        return True
    if too_far(value.get("deliver_at")) or in_the_future(value.get("external_time")):
        return True
    if "to_age" in value and value["to_age"] is not None:
        # An archive condition's ages: from_age (default 0) below to_age.
        low, high = _seconds(value.get("from_age", 0)), _seconds(value["to_age"])
        if low is not None and high is not None and high <= low:
            return True
    policy = value.get("policy")
    if isinstance(policy, dict) and retries_out_of_order(policy):
        return True
    if "max_delay" in value and retries_out_of_order(value):
        return True
    mounts = value.get("mounts")
    if isinstance(mounts, dict):
        named = [mounts.get("meta")]
        if isinstance(mounts.get("marks"), dict):
            named += list(mounts["marks"].values())
        if any(isinstance(name, str) and name not in MOUNTS for name in named):
            return True
    return any(breaks_a_rule(item) for item in value.values())


def retries_out_of_order(policy: dict[str, Any]) -> bool:
    """A retry policy's delay must not be above its max_delay, which may be the one the
    subscription already has: only a policy that gives both, in order, is sure to pass."""
    if "delay" not in policy and "max_delay" not in policy:
        return False
    delay, cap = (_seconds(policy.get(name)) for name in ("delay", "max_delay"))
    return delay is None or cap is None or delay > cap


def _seconds(value: object) -> float | None:
    if isinstance(value, str) and DURATION.fullmatch(value):
        try:
            return parse_duration(value)
        except ValueError:
            return None  # past what a float holds: the document's bounds refuse it
    if not _numbers(value):
        return None
    try:
        return float(value)  # type: ignore[arg-type]
    except OverflowError:
        return float("inf")


def _time(value: object) -> float | None:
    if isinstance(value, str):
        try:
            return parse_time(float(value) if value.strip().replace(".", "", 1).isdigit() else value)
        except ValueError:
            return None  # not a time: the document refuses it too
    return _seconds(value)


def pairs_in_order(pairs: list[Any]) -> bool:
    """A copy handler's ``segments``: ``[lo, hi]`` pairs, lo not above hi."""
    return all(not (isinstance(p, list) and len(p) == 2 and _numbers(*p) and p[0] > p[1]) for p in pairs)


def ranges_in_order(text: str) -> bool:
    """``segments=0-9,20-29``: every range's low end is not above its high end."""
    for part in text.split(","):
        part = part.strip()
        cut = next((i for i in range(1, len(part)) if part[i] == "-" and part[i - 1].isdigit()), -1)
        try:
            low = int(part if cut < 0 else part[:cut])
            high = low if cut < 0 else int(part[cut + 1 :])
        except ValueError:
            return True  # not a range at all: the document refuses it too
        if low > high or not -(2**63) <= low <= high < 2**63:
            return False
    return True


DSN_FILE = re.compile(r"[?&](sslrootcert|sslcert|sslkey)=[^&]")


def names_a_file(value: Any) -> bool:
    """Whether a body holds a dsn naming a file."""
    if isinstance(value, list):
        return any(names_a_file(item) for item in value)
    if not isinstance(value, dict):
        return False
    dsn = value.get("dsn")
    return (isinstance(dsn, str) and DSN_FILE.search(dsn) is not None) or any(
        names_a_file(v) for v in value.values()
    )


def names_a_secret(value: Any) -> bool:
    """Whether a body names a declared secret (``token_secret``; a push handler's ``secret``,
    ``token`` or ``basic``)."""
    if isinstance(value, list):
        return any(names_a_secret(item) for item in value)
    if not isinstance(value, dict):
        return False
    named = any(
        isinstance(v, str) and (k in SECRET_PARAMS or k.endswith("_secret")) for k, v in value.items()
    )
    return named or any(names_a_secret(v) for v in value.values())


def in_the_future(when: object) -> bool:
    """An external time must not be in the future."""
    at = _time(when)
    return at is not None and at > time.time()


def too_far(deliver_at: object) -> bool:
    """A delivery more than ten years ahead."""
    at = _time(deliver_at)
    return at is not None and at > time.time() + TEN_YEARS


def _numbers(*values: object) -> bool:
    return all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
