"""How the CLI prints: plain text for people, JSON (``--json``) for programs.

For people, times are ISO 8601 in UTC (``utc``) and sizes are binary units (``size``); the
JSON keeps the server's raw values (UNIX seconds, bytes) for programs to compute with.
"""

from __future__ import annotations

import base64
import sys
from datetime import UTC, datetime
from typing import Any

import msgspec
import orjson
from msgspec import UnsetType

from capella.wire.messages import StoredMessage


def print_json(value: Any, *, pretty: bool = False) -> None:
    """One JSON document on a line (or indented with ``pretty``).

    ``value`` may hold the client's wire structs: they print as the JSON the server sent.
    """
    option = orjson.OPT_INDENT_2 if pretty else 0
    sys.stdout.write(orjson.dumps(msgspec.to_builtins(value), option=option).decode() + "\n")


def print_payload(message: StoredMessage) -> None:
    """A message's payload on one line: its text, or its raw bytes when it is not UTF-8."""
    if not isinstance(message.data, UnsetType):
        sys.stdout.write(message.data + "\n")
        return
    sys.stdout.flush()
    sys.stdout.buffer.write(message.payload + b"\n")
    sys.stdout.buffer.flush()


def print_table(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        sys.stdout.write(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )
        sys.stdout.write("\n")


def print_fields(fields: list[tuple[str, object]]) -> None:
    """One ``name  value`` line per field, the values lined up: a ``show`` for people."""
    width = max(len(name) for name, _ in fields)
    for name, value in fields:
        sys.stdout.write(f"{name.ljust(width)}  {value}\n")


def utc(seconds: float | None) -> str:
    """A UNIX time as people read it, in UTC: ``2026-11-25T10:00:00Z`` (``-`` for none)."""
    if seconds is None:
        return "-"
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def size(count: int) -> str:
    """A byte count as people read it: ``512 B``, ``1.2 MiB``."""
    if count < 1024:
        return f"{count} B"
    value = float(count)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024:
            return f"{value:.1f} {unit}"
    return f"{value / 1024:.1f} TiB"


def created(value: bool, otherwise: str = "updated") -> str:
    """The word for what a create-or-update did (the API answers 201 or 200): never just "saved"."""
    return "created" if value else otherwise


def text_of(message: Any, width: int = 40) -> str:
    """A message's payload for one table cell: its text on one line, shortened, or its size."""
    data = getattr(message, "data", msgspec.UNSET)
    if data is msgspec.UNSET:
        return f"<{len(base64.b64decode(message.data_b64))} bytes>"
    text = str(data).replace("\n", " ")
    return text if len(text) <= width else text[: width - 1] + "…"


def error(message: str) -> None:
    sys.stderr.write(f"capella: {message}\n")
