"""Floods logged as counts: an event counted, and one line per window saying how many happened.

A front door refuses or closes connections by the thousand under attack; one log line each
would fill the disk. The first event of a window is logged at once, the rest are summed into
one line when the window ends (``LOG_EVERY``), so none goes unreported.
"""

from __future__ import annotations

import asyncio
import logging

# Floods are logged as one line with a count, at most this often.
LOG_EVERY = 10.0


class Tally:
    """Counts an event and logs ``message % (count, limit)`` on ``log``, at most once per
    ``LOG_EVERY`` seconds.

    The first event is logged at once; later ones are summed into one line per window, so a
    flood of a thousand refusals is a handful of lines and none goes unreported.
    """

    __slots__ = ("_count", "_limit", "_log", "_message", "_window")

    def __init__(self, message: str, limit: float, log: logging.Logger) -> None:
        self._message = message
        self._limit = limit
        self._log = log
        self._count = 0
        self._window: asyncio.TimerHandle | None = None

    def add(self, loop: asyncio.AbstractEventLoop) -> None:
        self._count += 1
        if self._window is None:
            self._report(loop)

    def close(self) -> None:
        if self._window is not None:
            self._window.cancel()
            self._window = None
        if self._count:
            self._log.warning(self._message, self._count, self._limit)
            self._count = 0

    def _report(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self._count:
            self._window = None
            return
        self._log.warning(self._message, self._count, self._limit)
        self._count = 0
        self._window = loop.call_later(LOG_EVERY, self._report, loop)
