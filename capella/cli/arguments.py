"""Value types, and the options, that more than one command takes."""

from __future__ import annotations

import argparse

from capella.cli.command import Arg, arg


def pair(text: str) -> tuple[str, str]:
    """``NAME=VALUE`` (a header filter, a JSON field filter); the value may be empty or hold ``=``."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def pairs(flag: str, dest: str, metavar: str, help: str) -> Arg:
    """A repeatable ``NAME=VALUE`` option: its values a list of ``(name, value)`` in ``dest``."""
    return arg(flag, dest=dest, action="append", type=pair, default=[], metavar=metavar, help=help)


# Which messages a command means: ``--source`` and ``--header NAME=VALUE`` (into ``headers``).
MESSAGE_FILTERS = (
    arg("--source", metavar="S", help="only messages from this source"),
    pairs("--header", "headers", "NAME=VALUE", "only messages with this header value (repeat)"),
)


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
