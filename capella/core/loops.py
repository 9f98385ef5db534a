"""Background loops that never die silently.

``keep_running`` runs a loop body until it returns. When the body raises, the failure is logged
(with its traceback when it is not a ``CapellaError``, which are expected: a full disk),
counted in ``TaskFailures`` (``capella_task_failures_total``), handed to the owner's ``report``
(a queue's ``last_error``), and the body starts again after ``backoff``. Only cancellation
ends a supervised loop early. Bodies are written to be restartable: they look at what is
left to do (pending writes, full blocks) before they wait for more.

``Loop`` runs such a body only while it has work: an idle queue holds no task at all (1,000
idle queues used to hold 3,000 waiting tasks, ~15 MB).

``first_of`` (wait for whichever event comes first) and ``retrieve`` (a task whose error is
read elsewhere) are the two small asyncio steps such loops and their callers share.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from capella.backoff import backoff
from capella.errors import CapellaError

log = logging.getLogger(__name__)

# A restart waits 0.1 s, 0.2 s, 0.4 s ... at most 2 s: a storage fault that clears is noticed
# within a few seconds, and a loop that fails at once cannot spin.
RESTART_BASE = 0.1
RESTART_CAP = 2.0


class TaskFailures:
    """Failed runs of background tasks by task name, since the process started."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def add(self, task: str) -> None:
        self.counts[task] = self.counts.get(task, 0) + 1


def _ignore(message: str) -> None:
    pass


async def keep_running(
    task: str,
    body: Callable[[], Awaitable[None]],
    *,
    failures: TaskFailures,
    report: Callable[[str], None] = _ignore,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
    base: float = RESTART_BASE,
    cap: float = RESTART_CAP,
) -> None:
    """Run ``body`` until it returns, restarting it after ``backoff`` whenever it raises.

    ``sleep`` waits between restarts (a queue passes one that wakes early when it closes);
    a body that ran longer than ``cap`` before it failed starts a new streak of failures.
    """
    streak = 0
    while True:
        started = clock()
        try:
            await body()
            return
        except Exception as exc:
            streak = 1 if clock() - started > cap else streak + 1
            delay = backoff(streak, base, cap)
            failures.add(task)
            if isinstance(exc, CapellaError):
                report(exc.message)
                # The first failure of a streak and then every power of two: a fault that
                # lasts an hour leaves a dozen lines, not thousands.
                level = logging.WARNING if streak & (streak - 1) == 0 else logging.DEBUG
                log.log(
                    level,
                    "task failed task=%s failures=%d retry_in=%.2fs: %s",
                    task,
                    streak,
                    delay,
                    exc.message,
                )
            else:
                report(f"{task} crashed: {exc!r}")
                log.error(
                    "task crashed task=%s failures=%d restart_in=%.2fs", task, streak, delay, exc_info=exc
                )
            await sleep(delay)


class Loop:
    """A supervised body that runs only while it has work.

    ``start`` runs ``body`` under ``keep_running`` unless it runs already; the body returns once
    nothing is left to do (it checks without awaiting, so work added later always finds either
    a running body that will see it or a finished task that ``start`` replaces). Between
    restarts it waits for the backoff, or less when ``stopping`` or ``wake`` is set.
    ``finish`` lets a running body end and refuses later starts.
    """

    def __init__(
        self,
        task: str,
        body: Callable[[], Awaitable[None]],
        *,
        failures: TaskFailures,
        report: Callable[[str], None],
        stopping: asyncio.Event,
        wake: asyncio.Event | None = None,
    ) -> None:
        self.name = task
        self.task: asyncio.Task[None] | None = None
        self._body = body
        self._failures = failures
        self._report = report
        self._stopping = stopping
        self._wake = wake
        self._finished = False

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()

    def start(self) -> None:
        if self.running or self._finished:
            return
        self.task = asyncio.create_task(
            keep_running(
                self.name, self._body, failures=self._failures, report=self._report, sleep=self._pause
            ),
            name=self.name,
        )

    async def _pause(self, seconds: float) -> None:
        waits = [self._stopping.wait(), *([self._wake.wait()] if self._wake is not None else [])]
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await first_of(*waits)

    async def finish(self) -> None:
        """Wake the body so it sees its owner is stopping, wait for it, and start it no more.

        It is never cancelled: cancelling one mid-write would leave a half-written temporary
        file and an open descriptor behind.
        """
        self._finished = True
        task = self.task
        if task is None:
            return
        if self._wake is not None:
            self._wake.set()
        (result,) = await asyncio.gather(task, return_exceptions=True)
        if isinstance(result, BaseException):
            log.error("background task failed task=%s", self.name, exc_info=result)


async def first_of(*waits: Awaitable[object]) -> None:
    """Return when the first of ``waits`` finishes; the others are cancelled."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


def retrieve(task: asyncio.Future[Any]) -> None:
    """A done callback for a task whose error someone else reads (or nobody needs).

    It only keeps asyncio from logging the error as never retrieved.
    """
    if not task.cancelled():
        task.exception()
