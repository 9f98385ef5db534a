"""The rules the OpenAPI document states only in words, as schemathesis hooks.

JSON Schema cannot say that a range's low end is not above its high end, that a time is at
most ten years ahead, or which mounts a server has; the document says so in descriptions, and
the server refuses what breaks them (400). ``test_schemathesis_finds_no_disagreement``
(test_fuzz.py) loads this module (``SCHEMATHESIS_HOOKS``) so that schemathesis does not send
such a request as one the document allows: everything else it generates is checked.
"""

from __future__ import annotations

import re
import time
from typing import Any

import schemathesis

from capella.units import parse_duration, parse_size
from capella.wire.fields import DURATION_PATTERN, SIZE_PATTERN

TEN_YEARS = 10 * 365 * 86_400
# The mounts of the server under test (its capella.toml): [mounts.default] only.
MOUNTS = {"default"}
DURATION = re.compile(DURATION_PATTERN)
SIZE = re.compile(SIZE_PATTERN)


@schemathesis.hook
def filter_case(ctx: schemathesis.HookContext, case: schemathesis.Case) -> bool:
    """False for a case that breaks a rule the document states in words."""
    query = case.query or {}
    if isinstance(query.get("segments"), str) and not ranges_in_order(query["segments"]):
        return False
    return not breaks_a_rule(case.body)


def breaks_a_rule(value: Any) -> bool:
    """Whether a body, at any depth, holds a reversed range, a time too far ahead, a number
    too large for the server, or a mount the server does not have."""
    if isinstance(value, list):
        return any(breaks_a_rule(item) for item in value)
    if not isinstance(value, dict):
        return isinstance(value, str) and too_large(value)
    segments = value.get("segments")
    if (
        isinstance(segments, dict)
        and _numbers(segments.get("min"), segments.get("max"))
        and segments["min"] > segments["max"]
    ):
        return True
    if isinstance(segments, str) and not ranges_in_order(segments):
        return True
    if too_far(value.get("delay"), value.get("deliver_at")):
        return True
    mounts = value.get("mounts")
    if isinstance(mounts, dict):
        named = [mounts.get("meta")]
        if isinstance(mounts.get("marks"), dict):
            named += list(mounts["marks"].values())
        if any(isinstance(name, str) and name not in MOUNTS for name in named):
            return True
    return any(breaks_a_rule(item) for item in value.values())


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


def too_far(delay: object, deliver_at: object) -> bool:
    """A delivery more than ten years ahead."""
    if isinstance(delay, str) and DURATION.fullmatch(delay):
        delay = parse_duration(delay) if not too_large(delay) else float("inf")
    if _numbers(delay) and float(delay) > TEN_YEARS:  # type: ignore[arg-type]
        return True
    return _numbers(deliver_at) and float(deliver_at) > time.time() + TEN_YEARS  # type: ignore[arg-type]


def too_large(text: str) -> bool:
    """A duration or a size in text that the document's pattern takes but whose value no
    number holds ("9" * 400)."""
    for pattern, parse in ((DURATION, parse_duration), (SIZE, parse_size)):
        if pattern.fullmatch(text):
            try:
                parse(text)
            except ValueError:
                return True
    return False


def _numbers(*values: object) -> bool:
    return all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
