"""A progress line on a terminal for long CLI operations; nothing when stderr is not a terminal."""

from __future__ import annotations

import sys
import time
from typing import TextIO

# Redraw at most this often: a terminal cannot show more, and drawing costs.
REDRAW_SECONDS = 0.2


class Progress:
    """``exported 120,000 of 300,000 messages (40 %), 52,000/s`` on one line, redrawn in place."""

    def __init__(self, verb: str, total: int | None = None, stream: TextIO | None = None) -> None:
        self.verb = verb
        self.total = total
        self.done = 0
        self._stream = sys.stderr if stream is None else stream
        self._shown = self._stream.isatty()
        self._started = time.monotonic()
        self._drawn = 0.0

    def add(self, count: int) -> None:
        self.done += count
        now = time.monotonic()
        if self._shown and now - self._drawn >= REDRAW_SECONDS:
            self._drawn = now
            self._draw(now)

    def finish(self) -> None:
        if self._shown:
            self._draw(time.monotonic())
            self._stream.write("\n")
            self._stream.flush()

    def _draw(self, now: float) -> None:
        rate = self.done / max(now - self._started, 1e-9)
        of = ""
        if self.total:
            of = f" of {self.total:,} ({min(100, 100 * self.done // self.total)} %)"
        self._stream.write(f"\r{self.verb} {self.done:,}{of} messages, {rate:,.0f}/s\x1b[K")
        self._stream.flush()
