"""Durations and sizes as people write them: ``"30s"``, ``"10m"``, ``"16MiB"``, ``"512k"``.

- ``parse_duration(value)`` → seconds (float) from text or a number of seconds.
- ``parse_size(value)`` → bytes (int) from text or a number of bytes.

Both raise ``ValueError`` with a short reason; each caller wraps it once in its own error
(``InvalidConfig`` naming the file and key, ``InvalidRequest`` naming the field).
"""

from __future__ import annotations

import math
import re

# Sizes end up in stored JSON definitions, and orjson writes no integer past 64 bits.
MAX_SIZE = 2**63 - 1

# Blanks and digits are ASCII's alone: the document's patterns say the same, and JSON Schema's
# checkers (ECMA-262) and Python's re read \s and \d differently outside ASCII.
BLANK = r"[ \t\n\r\f\v]"
DIGIT = "[0-9]"
_DURATION = re.compile(rf"^{BLANK}*({DIGIT}+(?:\.{DIGIT}+)?){BLANK}*(ns|us|ms|s|m|h|d)?{BLANK}*$")
# Seconds per unit; below a second, units per second (a division is rounded once, so
# "60000000000ns" is 60 s exactly, as the document's bounds read it).
_SUBSECOND_UNITS = {"ns": 1e9, "us": 1e6, "ms": 1e3}
_DURATION_UNITS = {
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
    "d": 86400.0,
    None: 1.0,
}
_SIZE = re.compile(rf"^{BLANK}*({DIGIT}+(?:\.{DIGIT}+)?){BLANK}*([kmgt]i?b?|b)?{BLANK}*$", re.IGNORECASE)


def parse_duration(value: object) -> float:
    """Seconds from ``"30s"``, ``"10m"``, ``"32d"``, ``"250ms"`` or a number of seconds."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration, got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION.match(value)):
        unit = m.group(2)
        if unit in _SUBSECOND_UNITS:
            seconds = float(m.group(1)) / _SUBSECOND_UNITS[unit]
        else:
            seconds = float(m.group(1)) * _DURATION_UNITS[unit]
    else:
        raise ValueError(f"expected a duration like '30s', '10m' or '2d', got {value!r}")
    # Enough digits overflow to inf, which JSON cannot hold: a stored definition would read back null.
    if not math.isfinite(seconds):
        raise ValueError("must be a finite duration")
    if seconds < 0:
        raise ValueError("must not be negative")
    return seconds


def parse_size(value: object) -> int:
    """Bytes from ``"16MiB"``, ``"8MB"``, ``"512k"`` or a number of bytes."""
    if isinstance(value, bool):
        raise ValueError(f"expected a size, got {value!r}")
    if isinstance(value, int):
        size = value
    elif isinstance(value, float) and value.is_integer():
        # A whole number written with a point (7865.0) is an integer to JSON Schema too.
        size = int(value)
    elif isinstance(value, str) and (m := _SIZE.match(value)):
        unit = (m.group(2) or "").lower()
        base = 1024 if "i" in unit else 1000
        letter = unit[:1] if unit not in ("b", "") else ""
        power = " kmgt".index(letter) if letter else 0
        scaled = float(m.group(1)) * (base**power)
        # Checked before int(): enough digits make the float inf, and int(inf) raises.
        if scaled > MAX_SIZE:
            raise ValueError(f"larger than {MAX_SIZE} bytes")
        # A positive size under one byte ("0.5", "0.0001k") is one byte, not 0.
        size = 1 if 0 < scaled < 1 else int(scaled)
    else:
        raise ValueError(f"expected a size like '16MiB' or '512k', got {value!r}")
    if size < 0:
        raise ValueError("must not be negative")
    if size > MAX_SIZE:
        raise ValueError(f"larger than {MAX_SIZE} bytes")
    return size
