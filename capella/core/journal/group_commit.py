"""Pipelined group commit: callers wait until their changes are durable and share the flushes.

The owner counts its changes; a caller that wants its change durable waits for that count.
One flush runs at a time, in a task of its own (so a caller that stops waiting does not stop
it), and covers everything changed before it started. Whoever changes something while a
flush is in flight waits for the next one, which starts as soon as the current one returns:
the next group gathers during the fsync, and the loop does not answer anyone in between.
Callers are answered in the order of their changes, never before a flush that covers them
returned.

A flush that fails fails the callers that were waiting when it started, with its error. The
owner keeps what the flush did not save (and cuts its file back to what is durable), so
callers that came later are served by the next flush, which writes it again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable

from capella.errors import CapellaError, ShuttingDown


class GroupCommit:
    """Waiters for a count of changes, and the flush task that serves them.

    ``flush`` writes everything changed so far and answers the count of changes that is now
    durable; it raises the storage error when it cannot. The task exists only while somebody
    waits, so an idle owner holds no task.
    """

    def __init__(self, flush: Callable[[], Awaitable[int]], owner: str) -> None:
        self.durable = 0  # changes known to be durable
        self._flush = flush
        self._owner = owner
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._task: asyncio.Task[None] | None = None

    @property
    def flushing(self) -> bool:
        return self._task is not None

    def advance(self, count: int) -> None:
        """Changes up to ``count`` became durable another way (a snapshot covers them)."""
        self.durable = max(self.durable, count)

    async def wait(self, target: int) -> None:
        """Return once the first ``target`` changes are durable, or raise why they are not."""
        if self.durable >= target:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((target, waiter))
        if self._task is None:
            self._task = asyncio.create_task(self._run())
        await waiter

    async def _run(self) -> None:
        try:
            while self._release():
                batch = [w for _, w in self._waiters]
                try:
                    self.advance(await self._flush())
                except Exception as exc:
                    # The storage error, or a bug: the callers it failed report it as it is.
                    for w in batch:
                        if not w.done():
                            w.set_exception(exc)
        except asyncio.CancelledError as exc:
            # Closing: nobody else would answer the waiters.
            fail((w for _, w in self._waiters), exc, self._owner)
            raise
        finally:
            self._task = None

    def _release(self) -> bool:
        """Answer the waiters the durable count covers, in order; ``True`` while others wait."""
        durable = self.durable
        waiting: list[tuple[int, asyncio.Future[None]]] = []
        for target, waiter in self._waiters:
            if waiter.done():
                continue  # failed by an earlier flush, or its caller stopped waiting
            if target <= durable:
                waiter.set_result(None)
            else:
                waiting.append((target, waiter))
        self._waiters = waiting
        return bool(waiting)


def fail(waiters: Iterable[asyncio.Future[None]], exc: BaseException, owner: str) -> None:
    """Answer the waiters of a failed flush: its storage error, or a generic one for anything else."""
    if isinstance(exc, CapellaError):
        error: BaseException = exc
    elif isinstance(exc, asyncio.CancelledError):
        error = ShuttingDown(f"{owner} is closing")
    else:
        error = CapellaError(f"{owner}: the flush failed unexpectedly ({exc!r})")
    for w in waiters:
        if not w.done():
            w.set_exception(error)
