"""The JSON contract shared by the HTTP API and the client (see docs/api.md).

- ``dumps(value)`` → bytes: orjson, with non-JSON values (paths, enums) rendered by ``str``.
- ``loads(data, what)`` → the parsed value, or ``InvalidRequest`` naming ``what``.
- ``parse_time(value)`` → UNIX seconds from a JSON number or an RFC 3339 string.
- ``payload_fields(payload)`` → ``("data", text)`` for valid UTF-8, else ``("data_b64", base64)``.
- ``decode_payload(data, data_b64)`` → the payload bytes from exactly one of the two fields.
- ``INT64_MIN`` / ``INT64_MAX``: the range of ids, external ids and segments.

Every request and answer body is a msgspec struct in the modules of this package (decoded
straight from the JSON bytes, unknown fields refused; the OpenAPI schemas are generated from
them): ``fields`` (the shared field types: ids, times, durations, sizes, names), ``messages``,
``queues``, ``work``, the handlers' (``params``, ``upkeep``, ``copy``, ``push``,
``postgres``, ``handlers``, ``handler_status``), ``clusters``, ``auth`` and ``health``, each a
``struct.Struct`` (its repr leaves out what is not set, as the JSON does). The binary forms
(docs/format.md): ``frames``, the binary read format of messages; ``batch_page``, record
batches (``capella.records.record_batch``) as a produce body and as a read page. The
documents Capella saves (``capella.storage.catalog``) are the structs of ``records``.
"""

from __future__ import annotations

import binascii
import math
import re
from base64 import b64decode, b64encode
from datetime import datetime
from typing import Any

import orjson

from capella.errors import InvalidRequest
from capella.wire.fields import INT64_MAX, INT64_MIN

__all__ = ["INT64_MAX", "INT64_MIN"]

JSON = "application/json"
NDJSON = "application/x-ndjson"

_RFC3339 = re.compile(r"(\d{4}-\d{2}-\d{2})[Tt ](\d{2}:\d{2}:\d{2})(?:\.(\d+))?([Zz]|[+-]\d{2}:\d{2})")


def dumps(value: Any) -> bytes:
    """JSON bytes; anything orjson does not know is rendered with ``str``."""
    return orjson.dumps(value, default=str)


def loads(data: bytes | str, what: str = "body") -> Any:
    """Parse JSON, turning a syntax error into ``InvalidRequest`` that names ``what``."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"{what} is not valid JSON: {exc}") from None


def parse_time(value: object) -> float:
    """UNIX seconds from a JSON number or an RFC 3339 string (``2024-05-01T12:00:00Z``).

    Raises ``ValueError`` with a short reason; callers wrap it in their own error.
    """
    if isinstance(value, bool):
        raise ValueError("expected a number or an RFC 3339 string, got a boolean")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        m = _RFC3339.fullmatch(value.strip())
        if m is None:
            raise ValueError(f"expected an RFC 3339 time like 2024-05-01T12:00:00Z, got {value!r}")
        date, clock, fraction, offset = m.groups()
        # fromisoformat takes at most microseconds; RFC 3339 allows any number of digits.
        micro = f".{fraction[:6]}" if fraction else ""
        zone = "+00:00" if offset in ("Z", "z") else offset
        try:
            seconds = datetime.fromisoformat(f"{date}T{clock}{micro}{zone}").timestamp()
        except ValueError:
            raise ValueError(f"not a valid date and time: {value!r}") from None
    else:
        raise ValueError(f"expected a number or an RFC 3339 string, got {type(value).__name__}")
    if not math.isfinite(seconds):
        raise ValueError("time must be finite")
    return seconds


def payload_fields(payload: bytes) -> tuple[str, str]:
    """The JSON field for a payload: ``data`` when it is valid UTF-8, else ``data_b64``."""
    try:
        return "data", payload.decode()
    except UnicodeDecodeError:
        return "data_b64", b64encode(payload).decode("ascii")


def decode_payload(data: object, data_b64: object) -> bytes:
    """Payload bytes from exactly one of ``data`` (text) and ``data_b64`` (standard base64).

    Raises ``ValueError`` with a short reason; callers wrap it in their own error.
    """
    if data is not None:
        if data_b64 is not None:
            raise ValueError("give either data or data_b64, not both")
        if not isinstance(data, str):
            raise ValueError("data: expected a string")
        return data.encode()
    if data_b64 is None:
        raise ValueError("a message needs data or data_b64")
    if not isinstance(data_b64, str):
        raise ValueError("data_b64: expected a base64 string")
    try:
        return b64decode(data_b64, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("data_b64: not valid base64") from None
