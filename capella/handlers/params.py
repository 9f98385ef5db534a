"""Reading a handler's ``params`` object with errors that name the field."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from capella.errors import InvalidRequest
from capella.units import parse_duration, parse_size

# The original API took durations in nanoseconds; no sane interval is 31,700 years of seconds.
NANOSECOND_THRESHOLD = 10**12
# As [secrets.NAME] in the configuration allows.
_SECRET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


class Params:
    """A handler's ``params`` object, read field by field."""

    def __init__(self, data: object, allowed: Iterable[str]) -> None:
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise InvalidRequest("params must be an object", field="params")
        if unknown := sorted(set(data) - set(allowed)):
            raise InvalidRequest(f"params.{unknown[0]}: unknown parameter", field=f"params.{unknown[0]}")
        self._data: dict[str, Any] = data

    def has(self, name: str) -> bool:
        return self._data.get(name) is not None

    def raw(self, name: str) -> Any:
        return self._data.get(name)

    def duration(self, name: str, default: float | None = None, *, positive: bool = True) -> float | None:
        value = self._data.get(name)
        if value is None:
            return default
        return duration(value, f"params.{name}", positive=positive)

    def size(self, name: str) -> int | None:
        value = self._data.get(name)
        if value is None:
            return None
        try:
            size = parse_size(value)
        except ValueError as exc:
            raise InvalidRequest(f"params.{name}: {exc}", field=f"params.{name}") from None
        if size <= 0:
            raise InvalidRequest(f"params.{name} must be greater than 0", field=f"params.{name}")
        return size

    def integer(self, name: str, default: int | None = None, *, low: int = 1) -> int | None:
        value = self._data.get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise InvalidRequest(f"params.{name} must be an integer ≥ {low}", field=f"params.{name}")
        return value


def duration(value: object, field: str, *, positive: bool = True) -> float:
    """Seconds from ``"30s"``, a number of seconds, or the original's nanosecond integers."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= NANOSECOND_THRESHOLD:
        seconds = value / 1e9
    else:
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            raise InvalidRequest(f"{field}: {exc}", field=field) from None
    if positive and seconds <= 0:
        raise InvalidRequest(f"{field} must be greater than 0", field=field)
    return seconds


def segment_ranges(value: object, field_name: str) -> tuple[tuple[int, int], ...] | None:
    """Inclusive ``[lo, hi]`` segment ranges from a JSON list (``None`` stays ``None``: every segment)."""
    if value is None:
        return None
    if not isinstance(value, list) or not value:
        raise InvalidRequest(f"{field_name} must be a non-empty list of [lo, hi] pairs", field=field_name)
    ranges = []
    for item in value:
        if (
            not isinstance(item, list)
            or len(item) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in item)
            or item[0] > item[1]
        ):
            raise InvalidRequest(f"{field_name}: {item!r} is not a [lo, hi] pair", field=field_name)
        ranges.append((item[0], item[1]))
    return tuple(ranges)


def refuse_env_params(data: object, replaced: Mapping[str, str]) -> None:
    """A 400 naming the replacement for a ``*_env`` param, which named a server variable."""
    if not isinstance(data, dict):
        return
    for old, new in replaced.items():
        if old in data:
            raise InvalidRequest(
                f"params.{old} is no longer accepted: a definition may not name the server's "
                f"environment variables. Ask the operator to declare the secret "
                f'([secrets.NAME] env = "VAR" in the configuration) and give params.{new} = "NAME"',
                field=f"params.{old}",
            )


def secret_name(params: Params, name: str) -> str | None:
    value = params.raw(name)
    if value is None:
        return None
    if not isinstance(value, str) or not _SECRET_NAME.fullmatch(value):
        raise InvalidRequest(
            f"params.{name} must name a secret declared in [secrets] (letters, digits, '_', '.', '-')",
            field=f"params.{name}",
        )
    return value
