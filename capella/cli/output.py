"""How the CLI prints: plain text for people, JSON (``--json``) for programs."""

from __future__ import annotations

import sys
from typing import Any

import orjson


def print_json(value: Any, *, pretty: bool = False) -> None:
    """One JSON document on a line (or indented with ``pretty``); bytes values are dropped."""
    option = orjson.OPT_INDENT_2 if pretty else 0
    sys.stdout.write(orjson.dumps(_without_bytes(value), option=option).decode() + "\n")


def print_payload(message: dict[str, Any]) -> None:
    """A message's payload on one line: its text, or its raw bytes when it is not UTF-8."""
    if "data" in message:
        sys.stdout.write(str(message["data"]) + "\n")
        return
    sys.stdout.flush()
    sys.stdout.buffer.write(bytes(message["payload"]) + b"\n")
    sys.stdout.buffer.flush()


def print_table(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        sys.stdout.write(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )
        sys.stdout.write("\n")


def error(message: str) -> None:
    sys.stderr.write(f"capella: {message}\n")


def _without_bytes(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_bytes(v) for k, v in value.items() if not isinstance(v, bytes)}
    if isinstance(value, list):
        return [_without_bytes(v) for v in value]
    return value
