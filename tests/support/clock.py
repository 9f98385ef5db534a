"""A clock that tests move by hand: core code takes its clock as a parameter."""

from __future__ import annotations


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now
