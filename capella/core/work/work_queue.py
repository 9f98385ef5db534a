"""Ack-mode subscriptions (work queues): claims with a lease, ack, nack, extend, retries, dead letters.

Competing consumers *claim* messages: each claimed message is leased to one of them until
``lease_until`` and comes with a *receipt* (``"<id>.<claim number>"``). The holder acks it
(done), nacks it (failed: retried after a delay, with its error text) or extends the lease.
A lease that runs out counts as a failure. After ``max_attempts`` claims that did not end in
an ack, the message is dead: it leaves the window, is kept for operators (and copied to the
dead-letter queue when the policy names one), and can be moved back.

The state (``capella.core.work.state``) is bounded: ``high`` is the highest id ever handed out,
and ids above it are simply the queue's log. Only messages at or below ``high`` that are not
finished have an entry (leased or waiting), so the state holds the window between the lowest
un-acked id and the highest claimed one, never the whole queue. Every change is a record in a ``ChangeLog``
(``<queue>/work/<subscription>/``), durable per save mode; a snapshot replaces the records
now and then.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from capella.core.journal.changelog import ChangeLog
from capella.core.message import Draft, LogMessage, SaveMode
from capella.core.work.retry import RetrySettings, exhausted, retry_delay
from capella.core.work.state import LEASED, WAITING, DeadEntry, Entry, WorkState
from capella.errors import CapellaError, InvalidRequest, LeaseLost, UnknownReceipt
from capella.storage import Storage, keys

log = logging.getLogger(__name__)

MAX_ERROR = 2048
# A snapshot is written once the log holds this many records more than the state has entries.
CHECKPOINT_RECORDS = 20_000
# An operator's listing of messages nobody claimed yet stops after this many and says where.
SCAN_LIMIT = 100_000
STATUSES = ("in_flight", "failed", "pending", "dead")

DeadLetter = Callable[[str, list[Draft]], Awaitable[None]]


class MessageLog(Protocol):
    """What a work queue needs from its queue."""

    name: str

    @property
    def last_id(self) -> int: ...

    async def read_after(
        self, after: int, limit: int, segments: Sequence[tuple[int, int]] | None = None
    ) -> tuple[list[LogMessage], int]: ...


@dataclass(slots=True)
class WorkCounters:
    claimed: int = 0
    redelivered: int = 0  # claims of a message that was claimed before
    acked: int = 0
    nacked: int = 0
    expired: int = 0
    dead_lettered: int = 0
    moved_back: int = 0
    deleted: int = 0


class Outcome(NamedTuple):
    """What became of one receipt: ``error`` is ``None`` when it worked."""

    receipt: str
    id: int
    error: CapellaError | None = None
    entry: Entry | None = None


_RECEIPT_PART = re.compile("[0-9]{1,19}")


def parse_receipt(text: object) -> tuple[int, int]:
    """``"<id>.<claims>"`` → (id, claims)."""
    if isinstance(text, str):
        head, _, tail = text.partition(".")
        # ASCII digits only: str.isdigit takes "²", which int() refuses.
        if _RECEIPT_PART.fullmatch(head) and _RECEIPT_PART.fullmatch(tail):
            return int(head), int(tail)
    raise InvalidRequest(f"receipts: {text!r} is not a receipt (id.claim)", field="receipts")


class WorkQueue:
    """One ack-mode subscription of a queue: claims, acks, nacks, extends, and their log."""

    def __init__(
        self,
        messages: MessageLog,
        name: str,
        policy: RetrySettings,
        storage: Storage,
        prefix: str,
        *,
        clock: Callable[[], float],
        dead_letter: DeadLetter,
        default_save: Callable[[], SaveMode] = lambda: SaveMode.IMMEDIATE,
        rand: Callable[[], float] = random.random,
        write_timeout: float,
    ) -> None:
        self.name = name
        self.policy = policy
        self.counters = WorkCounters()
        self.state = WorkState()
        # Set (and replaced) when a message may be claimable sooner: a long-polling claim takes
        # the current event and waits on it.
        self.changed = asyncio.Event()
        self._messages = messages
        self._prefix = prefix
        self._storage = storage
        self._log = ChangeLog(storage, prefix, write_timeout=write_timeout)
        self._clock = clock
        self._dead_letter = dead_letter
        self._default_save = default_save
        self._rand = rand
        self._lock = asyncio.Lock()

    async def open(self) -> None:
        document, records = await self._log.load()
        if document is not None:
            self.state.load(document)
        for record in records:
            self.state.apply(record)

    async def close(self) -> None:
        await self._log.close()

    async def destroy(self) -> None:
        await self._log.close()
        for key in await self._storage.list(keys.within(self._prefix)):
            await self._storage.delete(key)

    # --- consumers -----------------------------------------------------------------------

    async def claim(self, limit: int, lease: float | None, save: SaveMode) -> list[tuple[LogMessage, Entry]]:
        """Lease up to ``limit`` messages: retries that are due first, then new ones in id order."""
        seconds = self.policy.lease if lease is None else lease
        async with self._lock:
            now = self._clock()
            await self._expire(now)
            out: list[tuple[LogMessage, Entry]] = []
            ready = self.state.due(WAITING, now, limit)
            high = self.state.high
            try:
                for e in ready:
                    message = await self._message(e.id)
                    if message is not None:
                        out.append((message, e))
                    else:
                        # Its block expired meanwhile: there is nothing left to work on.
                        self.state.remove([e.id])
                if len(out) < limit:
                    messages, last = await self._messages.read_after(high, limit - len(out))
                    skipped = self.state.skipped
                    out.extend((m, Entry(m.id, WAITING, 0, 0, 0.0)) for m in messages if m.id not in skipped)
                    high = max(high, last)
            except BaseException:
                # Nothing was leased: the retries stay claimable.
                self.state.put_back(e for e in ready if self.state.entries.get(e.id) is e)
                self._take_records()
                raise
            until = now + seconds
            leased = [Entry(e.id, LEASED, e.claims + 1, e.attempts + 1, until, e.error) for _, e in out]
            self.state.lease(leased, high)
            self._take_records()
        self.counters.claimed += len(leased)
        self.counters.redelivered += sum(e.claims > 1 for e in leased)
        await self._log.save(save.resolve(self._default_save()))
        return [(m, e) for (m, _), e in zip(out, leased, strict=True)]

    async def ack(self, receipts: Sequence[tuple[int, int]], save: SaveMode) -> list[Outcome]:
        async with self._lock:
            outcomes = self._match(receipts, allow_waiting=True)
            done = [o.id for o in outcomes if o.error is None and o.entry is not None]
            if done:
                self.state.remove(done)
                self._take_records()
                self.counters.acked += len(done)
        await self._log.save(save.resolve(self._default_save()))
        return outcomes

    async def nack(
        self,
        receipts: Sequence[tuple[int, int]],
        delay: float | None,
        error: str | None,
        save: SaveMode,
    ) -> list[Outcome]:
        """Give claimed messages back: retried after ``delay`` (default: the backoff)."""
        error = None if error is None else error[:MAX_ERROR]
        async with self._lock:
            now = self._clock()
            outcomes = self._match(receipts, allow_waiting=False)
            failed = [o.entry for o in outcomes if o.error is None and o.entry is not None]
            await self._fail(failed, now, error, delay)
            self.counters.nacked += len(failed)
        await self._log.save(save.resolve(self._default_save()))
        # The entry as it is now: waiting for its retry, or None when it went to the dead letters.
        return [o._replace(entry=self.state.entries.get(o.id)) if o.error is None else o for o in outcomes]

    async def extend(
        self, receipts: Sequence[tuple[int, int]], lease: float | None, save: SaveMode
    ) -> list[Outcome]:
        seconds = self.policy.lease if lease is None else lease
        async with self._lock:
            now = self._clock()
            outcomes = self._match(receipts, allow_waiting=False)
            extended = [
                Entry(e.id, LEASED, e.claims, e.attempts, now + seconds, e.error)
                for o in outcomes
                if o.error is None and (e := o.entry) is not None
            ]
            if extended:
                self.state.lease(extended, self.state.high)
                self._take_records()
        await self._log.save(save.resolve(self._default_save()))
        by_id = {e.id: e for e in extended}
        return [o._replace(entry=by_id.get(o.id, o.entry)) for o in outcomes]

    def _match(self, receipts: Sequence[tuple[int, int]], *, allow_waiting: bool) -> list[Outcome]:
        state = self.state
        outcomes: list[Outcome] = []
        seen: set[int] = set()
        for mid, claims in receipts:
            receipt = f"{mid}.{claims}"
            e = state.entries.get(mid)
            if mid in seen:
                outcomes.append(Outcome(receipt, mid, InvalidRequest(f"receipt {receipt} is given twice")))
                continue
            seen.add(mid)
            if e is not None and e.claims == claims and (e.state == LEASED or allow_waiting):
                outcomes.append(Outcome(receipt, mid, None, e))
            elif e is not None and e.claims == claims:
                outcomes.append(Outcome(receipt, mid, LeaseLost(f"the lease of {receipt} ran out")))
            elif e is not None or mid in state.dead:
                where = "was claimed again" if e is not None else "is in the dead letters"
                outcomes.append(
                    Outcome(receipt, mid, LeaseLost(f"the lease of {receipt} is lost: it {where}"))
                )
            elif 0 < mid <= state.high and claims > 0:
                # Finished already (acked by this or a later claim, or deleted): nothing to do.
                outcomes.append(Outcome(receipt, mid, None, None))
            else:
                outcomes.append(Outcome(receipt, mid, UnknownReceipt(f"no claim has the receipt {receipt}")))
        return outcomes

    # --- failures, expiry and dead letters ------------------------------------------------

    async def expire(self) -> int:
        """Turn leases that ran out into failures; answers how many."""
        async with self._lock:
            count = await self._expire(self._clock())
        await self._log.save(SaveMode.MARK)
        return count

    async def _expire(self, now: float) -> int:
        expired = self.state.due(LEASED, now)
        if expired:
            self.counters.expired += len(expired)
            await self._fail(expired, now, "the lease ran out", None, start=None)
        return len(expired)

    async def _fail(
        self,
        entries: list[Entry],
        now: float,
        error: str | None,
        delay: float | None,
        *,
        start: float | None = 0.0,
    ) -> None:
        """Failed attempts: wait for a retry, or go to the dead letters when attempts are used up."""
        retry: list[Entry] = []
        dead: list[Entry] = []
        for e in entries:
            if exhausted(self.policy, e.attempts):
                dead.append(e)
                continue
            # After a lease ran out the delay counts from the end of the lease.
            base = e.until if start is None else now
            wait = delay if delay is not None else retry_delay(self.policy, e.attempts, self._rand())
            retry.append(Entry(e.id, WAITING, e.claims, e.attempts, max(now, base + wait), error or e.error))
        if retry:
            self.state.wait(retry)
            self._notify()
        if dead:
            await self._bury(dead, error, now)
        self._take_records()

    async def _bury(self, entries: list[Entry], error: str | None, now: float) -> None:
        target = self.policy.dead_letter
        if target is not None:
            drafts = []
            for e in entries:
                message = await self._message(e.id)
                if message is not None:
                    drafts.append(self._dead_draft(message, e, error or e.error))
            # Copied before it is recorded dead: a crash in between repeats the copy, which
            # the dead-letter queue's dedup absorbs (the copy keeps the message's identity).
            try:
                await self._dead_letter(target, drafts)
            except CapellaError as exc:
                log.error(
                    "dead-letter copy failed queue=%s subscription=%s target=%s",
                    self._messages.name,
                    self.name,
                    target,
                    exc_info=exc,
                )
        self.state.bury([DeadEntry(e.id, e.claims, e.attempts, error or e.error, now) for e in entries])
        self.counters.dead_lettered += len(entries)
        log.info(
            "dead-lettered queue=%s subscription=%s ids=%s",
            self._messages.name,
            self.name,
            ",".join(str(e.id) for e in entries[:20]),
        )

    def _dead_draft(self, m: LogMessage, e: Entry, error: str | None) -> Draft:
        headers = {
            **m.headers,
            "capella-dead-queue": self._messages.name,
            "capella-dead-subscription": self.name,
            "capella-dead-id": str(m.id),
            "capella-attempts": str(e.attempts),
            "capella-last-error": error or "",
        }
        return Draft(m.payload, m.source, m.external_id, m.external_time, m.segment, headers)

    async def _message(self, mid: int) -> LogMessage | None:
        messages, _ = await self._messages.read_after(mid - 1, 1)
        return messages[0] if messages and messages[0].id == mid else None

    # --- operators -----------------------------------------------------------------------

    async def retry(self, ids: list[int], at: float | None, save: SaveMode) -> list[int]:
        """Waiting messages become claimable at ``at`` (default now); dead ones are moved back.

        A message moved back from the dead letters starts a fresh count of attempts.
        """
        async with self._lock:
            now = self._clock()
            when = now if at is None else at
            changed: list[Entry] = []
            revived: list[int] = []
            for mid in ids:
                e = self.state.entries.get(mid)
                if e is not None and e.state == WAITING:
                    changed.append(Entry(mid, WAITING, e.claims, e.attempts, when, e.error))
                elif mid in self.state.dead:
                    d = self.state.dead[mid]
                    changed.append(Entry(mid, WAITING, d.claims, 0, when, d.error))
                    revived.append(mid)
            if revived:
                self.state.forget_dead(revived)
                self.counters.moved_back += len(revived)
            if changed:
                self.state.wait(changed)
                self._notify()
            self._take_records()
        await self._log.save(save.resolve(self._default_save()))
        return [e.id for e in changed]

    async def delete(self, ids: list[int], save: SaveMode) -> list[int]:
        """Finish messages without processing them: in flight, failed, dead, or not yet claimed."""
        async with self._lock:
            removed = [i for i in ids if i in self.state.entries]
            forgotten = [i for i in ids if i in self.state.dead]
            last = self._messages.last_id
            ahead = [i for i in ids if self.state.high < i <= last and i not in self.state.skipped]
            if removed:
                self.state.remove(removed)
            if forgotten:
                self.state.forget_dead(forgotten)
            if ahead:
                self.state.skip(ahead)
            self._take_records()
            self.counters.deleted += len(removed) + len(forgotten) + len(ahead)
        await self._log.save(save.resolve(self._default_save()))
        return [*removed, *forgotten, *ahead]

    async def select(
        self,
        statuses: set[str],
        match: Callable[[LogMessage], bool] | None,
        after: int,
        limit: int,
        scan_limit: int = SCAN_LIMIT,
    ) -> tuple[list[tuple[LogMessage, str]], int | None]:
        """Messages after id ``after`` in id order whose status is in ``statuses`` and that match.

        Answers them and the id to continue after (``None`` when everything was looked at).
        Tracked messages (leased, waiting, dead) come from the state; ``ready`` ones that were
        never claimed from the log after ``high``, at most ``scan_limit`` of them per call.
        """
        now = self._clock()
        out: list[tuple[LogMessage, str]] = []
        tracked = sorted(i for i in (*self.state.entries, *self.state.dead) if i > after)
        for mid in tracked:
            status = self.status(mid, now)
            if status not in statuses:
                continue
            message = await self._message(mid)
            if message is None or (match is not None and not match(message)):
                continue
            out.append((message, status))
            if len(out) >= limit:
                return out, mid
        if "pending" not in statuses:
            return out, None
        cursor = max(after, self.state.high)
        scanned = 0
        skipped = self.state.skipped
        while True:
            messages, last = await self._messages.read_after(cursor, min(1000, scan_limit - scanned))
            if not messages:
                return out, None
            for m in messages:
                scanned += 1
                cursor = m.id
                if m.id not in skipped and (match is None or match(m)):
                    out.append((m, "pending"))
                    if len(out) >= limit:
                        return out, m.id
            cursor = max(cursor, last)
            if scanned >= scan_limit:
                return out, cursor

    def _notify(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    def status(self, mid: int, now: float) -> str:
        """``in_flight``, ``failed``, ``pending``, ``dead``, ``deleted`` or ``done`` for a message id."""
        e = self.state.entries.get(mid)
        if e is not None:
            if e.state == WAITING:
                return "pending" if e.until <= now else "failed"
            return LEASED
        if mid in self.state.dead:
            return "dead"
        if mid > self.state.high:
            return "deleted" if mid in self.state.skipped else "pending"
        return "done"

    # --- saving --------------------------------------------------------------------------

    def _take_records(self) -> None:
        for record in self.state.records:
            self._log.append(record)
        self.state.records.clear()

    async def tick(self) -> None:
        """The periodic pass: expire leases, save marked changes, checkpoint a long log."""
        timer = self.state.next_timer()
        if timer is not None and timer <= self._clock():
            await self.expire()
            self._notify()
        if self._log.marked:
            await self._log.flush()
        window = len(self.state.entries) + len(self.state.dead)
        if self._log.records_since_checkpoint > CHECKPOINT_RECORDS + 4 * window:
            await self.checkpoint()

    async def checkpoint(self) -> None:
        await self._log.checkpoint(self.state.dump)

    async def flush(self) -> None:
        await self._log.flush()
