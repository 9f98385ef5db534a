"""Waiting for something that has no event of its own: poll with a deadline, never sleep blind.

``until`` fails the test when the deadline passes; ``eventually`` answers whether it came true.
A check may be a plain function or a coroutine function. ``until_blocking`` is for tests that
are not async (a browser, a blocking client).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

Check = Callable[[], object] | Callable[[], Awaitable[object]]

DEFAULT_WITHIN = 10.0
EVERY = 0.02


async def eventually(check: Check, within: float = DEFAULT_WITHIN, every: float = EVERY) -> bool:
    """Poll ``check`` until it is true or ``within`` seconds pass; answers whether it came true."""
    deadline = time.monotonic() + within
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(every)


async def until(check: Check, within: float = DEFAULT_WITHIN, what: str = "", every: float = EVERY) -> None:
    """Poll ``check`` until it is true; fail the test after ``within`` seconds."""
    if not await eventually(check, within, every):
        raise AssertionError(f"timed out after {within}s waiting for {what or 'the condition'}")


def until_blocking(
    check: Callable[[], object], within: float = DEFAULT_WITHIN, what: str = "", every: float = 0.1
) -> None:
    """``until`` for code that is not async: polls ``check`` with ``time.sleep``."""
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what or 'the condition'}")
        time.sleep(every)
