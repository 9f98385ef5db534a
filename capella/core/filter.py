"""Which messages an operator means: by source, segment, header or a field of a JSON payload.

``MessageFilter`` is a value; ``matches`` is a pure function over one message. A JSON field
is a dotted path (``customer.id``; a number step indexes a list) compared for equality with
a JSON value, so ``42`` matches the number and ``"42"`` the string. A payload that is not
JSON, or has no such field, does not match.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

_MISSING = object()


class Filterable(Protocol):
    """What a filter looks at: a stored ``Message`` or a ``DelayedMessage`` one alike."""

    source: str
    segment: int
    headers: dict[str, str]
    payload: bytes


@dataclass(frozen=True, slots=True)
class MessageFilter:
    source: str | None = None
    segments: tuple[tuple[int, int], ...] | None = None
    headers: tuple[tuple[str, str], ...] = ()
    fields: tuple[tuple[tuple[str, ...], Any], ...] = ()

    @property
    def empty(self) -> bool:
        return self.source is None and self.segments is None and not self.headers and not self.fields


def matches(f: MessageFilter, m: Filterable) -> bool:
    if f.source is not None and m.source != f.source:
        return False
    if f.segments is not None and not any(lo <= m.segment <= hi for lo, hi in f.segments):
        return False
    for name, value in f.headers:
        if m.headers.get(name) != value:
            return False
    if f.fields:
        try:
            document = orjson.loads(m.payload)
        except orjson.JSONDecodeError:
            return False
        for path, expected in f.fields:
            found = field_of(document, path)
            # True == 1 in Python, not in JSON: a boolean only matches a boolean.
            if (
                found is _MISSING
                or found != expected
                or isinstance(found, bool) != isinstance(expected, bool)
            ):
                return False
    return True


def field_of(document: Any, path: Sequence[str]) -> Any:
    """The value at ``path`` in a parsed JSON document, or a private marker when there is none."""
    here = document
    for step in path:
        if isinstance(here, dict):
            if step not in here:
                return _MISSING
            here = here[step]
        elif isinstance(here, list) and step.isdigit() and int(step) < len(here):
            here = here[int(step)]
        else:
            return _MISSING
    return here


def parse_path(text: str) -> tuple[str, ...]:
    return tuple(text.split("."))
