"""Value types for command-line options that more than one command takes."""

from __future__ import annotations

import argparse

from capella.cli.command import Arg, arg


def message_filters() -> tuple[Arg, ...]:
    """``--source`` and ``--header NAME=VALUE`` (into ``headers``): which messages a command means."""
    return (
        arg("--source", metavar="S", help="only messages from this source"),
        arg(
            "--header",
            dest="headers",
            action="append",
            type=pair,
            default=[],
            metavar="NAME=VALUE",
            help="only messages with this header value (repeat)",
        ),
    )


def pair(text: str) -> tuple[str, str]:
    """``NAME=VALUE`` (a header filter, a JSON field filter); the value may be empty or hold ``=``."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def moment(text: str) -> float | str:
    """A time: UNIX seconds stay a number; anything else goes as text (RFC 3339) for the server."""
    try:
        return float(text)
    except ValueError:
        return text


def positive(text: str) -> int:
    if not text.isdigit() or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return int(text)
