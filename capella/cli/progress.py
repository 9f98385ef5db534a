"""A progress line on a terminal for long CLI operations; nothing when stderr is not a terminal."""

from __future__ import annotations

import os
import stat
import sys
import time
from typing import BinaryIO, TextIO

# Redraw at most this often: a terminal cannot show more, and drawing costs.
REDRAW_SECONDS = 0.2


class Progress:
    """``exported 120,000 of 300,000 messages (40 %), 52,000/s`` on one line, redrawn in place.

    Without a total, a regular file being ``reading`` gives the share instead: how far into it the
    reader is (``produced 120,000 messages (40 % of the file)``).
    """

    def __init__(
        self,
        verb: str,
        total: int | None = None,
        stream: TextIO | None = None,
        reading: BinaryIO | None = None,
    ) -> None:
        self.verb = verb
        self.total = total
        self._reading = reading if reading is not None and _size(reading) else None
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
        shown = f"{self.verb} {self.done:,}{of} messages"
        if self._reading is not None:
            shown += f" ({min(100, 100 * self._reading.tell() // _size(self._reading))} % of the file)"
        self._stream.write(f"\r{shown}, {rate:,.0f}/s\x1b[K")
        self._stream.flush()


def _size(f: BinaryIO) -> int:
    """The size of a regular file; 0 for a pipe or a terminal, whose end is unknown."""
    try:
        info = os.fstat(f.fileno())
    except (OSError, ValueError):
        return 0
    return info.st_size if stat.S_ISREG(info.st_mode) else 0
