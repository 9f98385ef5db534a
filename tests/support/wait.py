"""Waiting for something that has no event of its own: poll with a deadline, never sleep blind.

``until`` fails the test when the deadline passes; ``eventually`` answers whether it came true.
``holds`` is the other side: a check that must stay true for a stretch of time (a stopped
handler that must not run), failing as soon as it does not. ``parked`` waits until a task of
this loop waits inside a named coroutine (a long poll parked before its message comes);
``sealed`` until a queue has sealed its blocks.
A check may be a plain function or a coroutine function. ``until_blocking`` and
``holds_blocking`` are for tests that are not async (a browser, a blocking client).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

from capella.core.queue import Queue

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


async def holds(check: Check, seconds: float, what: str = "", every: float = EVERY) -> None:
    """Poll ``check`` for ``seconds``; fail the test the first time it is false."""
    deadline = time.monotonic() + seconds
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if not result:
            raise AssertionError(f"{what or 'the condition'} stopped holding")
        if time.monotonic() >= deadline:
            return
        await asyncio.sleep(every)


def awaiting(task: asyncio.Task[object]) -> list[str]:
    """The qualified names of the coroutines ``task`` is suspended in, outermost first (none
    for a task that has not started yet or whose wait is over)."""
    names: list[str] = []
    awaited: object = task.get_coro()
    while (inner := getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)) is not None:
        names.append(getattr(awaited, "__qualname__", ""))
        awaited = inner
    if isinstance(awaited, asyncio.Future) and awaited.done():
        return []  # woken already: it is about to run on, not waiting
    return names


async def parked(coroutine: str, within: float = DEFAULT_WITHIN, count: int = 1) -> None:
    """Wait until ``count`` tasks of this loop are suspended in the coroutine named ``coroutine``
    (its qualified name, e.g. ``"Queue.wait_for"``): the waiter is in place before what wakes it."""

    def waiting() -> bool:
        return sum(coroutine in awaiting(task) for task in asyncio.all_tasks()) >= count

    await until(waiting, within, f"{count} task(s) parked in {coroutine}")


async def sealed(queue: Queue, blocks: int, within: float = DEFAULT_WITHIN) -> None:
    """Wait until ``queue`` holds ``blocks`` sealed blocks or more (the sealer sets no event a
    test can see)."""
    await until(
        lambda: len(queue.sealed_blocks()) >= blocks, within, f"{blocks} sealed blocks in {queue.name}"
    )


def until_blocking(
    check: Callable[[], object], within: float = DEFAULT_WITHIN, what: str = "", every: float = 0.1
) -> None:
    """``until`` for code that is not async: polls ``check`` with ``time.sleep``."""
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what or 'the condition'}")
        time.sleep(every)


def holds_blocking(check: Callable[[], object], seconds: float, what: str = "", every: float = 0.1) -> None:
    """``holds`` for code that is not async: polls ``check`` with ``time.sleep``."""
    deadline = time.monotonic() + seconds
    while check():
        if time.monotonic() >= deadline:
            return
        time.sleep(every)
    raise AssertionError(f"{what or 'the condition'} stopped holding")
