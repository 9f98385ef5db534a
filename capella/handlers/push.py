"""The push handler: a queue's messages POSTed to an HTTP endpoint, signed, retried, in order.

The handler keeps an ack-mode subscription on its queue (``push-<handler>`` unless
``params.subscription`` names another) and is its only consumer: it claims messages, sends
them (``capella.handlers.delivery`` builds the request), acks what the receiver took (2xx)
and nacks the rest with a delay (the backoff of its retry policy, or the receiver's
``Retry-After``). The work queue counts the attempts and, after ``max_attempts``, moves a
message to the dead letters with the last error (status and the first bytes of the answer).

Ordering: ``unordered`` keeps up to ``concurrency`` requests in flight; ``by_segment`` at most
one per segment; ``ordered`` one in all. In the two ordered modes a message that failed
blocks the later ones of its segment (or of the queue) until it is acked or dead, so message
n+1 is never sent before n is acked. Claimed messages that must wait are held in memory.

Every connection passes the egress policy (``capella.client.connector``). A refused receiver
is a configuration problem, not a failed delivery: each pass checks the URL's host before it
claims anything, so the pass fails with the refusal as the handler's last error and no message
is charged an attempt. (A name that changes its answer between that check and the connect is
still refused at the connect; its batch is then taken back by the next pass like a crash's.)

The URL's query string and user info may hold secrets: logs and error texts show it without.

At-least-once across restarts: an ack is saved before the next message of an ordered run is
sent (the queue's ``subscription_save``, ``immediate`` by default), so an acked message is
never sent again. A new run of the handler takes back what a previous run had claimed and
not answered (a crash, a stop): those messages count the attempt and are sent again first.
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import contextlib
import logging
import random
import re
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import msgspec

from capella.auth.rule import Identity
from capella.auth.secret import Secrets
from capella.client.connector import EgressConnector, check_destination
from capella.core.base_queue import BaseQueue
from capella.core.cluster import Cluster
from capella.core.message import LogMessage, SaveMode
from capella.core.stats import Histogram
from capella.core.work.retry import RetrySettings, parse_policy, retry_delay
from capella.core.work.state import LEASED, WAITING, Entry
from capella.core.work.work_queue import WorkQueue
from capella.egress import Egress
from capella.errors import CapellaError, InvalidRequest, QueueNotFound, SubscriptionNotFound
from capella.handlers.base import Building, Handler, HandlerType, PassTally
from capella.handlers.delivery import (
    ANSWER_BYTES,
    Credentials,
    Outgoing,
    answer_text,
    request_parts,
    retry_after,
    retryable,
)
from capella.wire.fields import MIN_PERIOD
from capella.wire.push import DeliveryError, PushParams, PushStatus

log = logging.getLogger(__name__)

# A pass with work ends after this long (its in-flight requests finish first), so the status
# shows progress; a new pass starts at once. A pass that has delivered everything long-polls
# the queue for ``wait`` seconds and ends.
PASS_SECONDS = 5.0
# Claimed messages kept waiting (held, or failed and waiting for a retry) at most: beyond this
# only retries are claimed, so a receiver that is down does not drain the queue into retries.
MIN_WINDOW = 1000
# Claimed messages held in memory, waiting for a request slot, at most: with up to
# ``MAX_IN_FLIGHT`` (wire.push) in requests, a handler holds at most twice that many messages.
MAX_HELD = 10_000
LATENCY_BOUNDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

# The handler holds its claims until it answers them; a new run takes back what an old one
# held, so the lease only matters when the handler is stopped for longer than this.
LEASE = 12 * 3600.0
# The error a claim of an earlier run gets when a new run takes it back: it may have been sent,
# so it counts as an attempt (and a last attempt goes to the dead letters with this text).
TAKEN_BACK = "claimed by an earlier run of the push handler (restart or stop); sent again"
# The params that are the subscription's retry policy (capella.core.work.retry).
POLICY_FIELDS = ("max_attempts", "backoff", "delay", "max_delay", "jitter", "dead_letter")
# The credentials params, each naming a declared secret.
SECRET_PARAMS = ("secret", "token", "basic")
Key = int | None  # what orders messages: 0 (ordered), the segment (by_segment), None (unordered)
# A URL's user info and query string, wherever a URL appears in a text: webhook URLs often
# carry their secret there (``?token=...``), and aiohttp's error texts quote the URL.
_URL_SECRETS = re.compile(r"(?i)\b(https?://)(?:[^/?#\s@'\"]*@)?([^?#\s'\"]*)(?:[?#][^\s'\"]*)?")


@dataclass(slots=True)
class PushCounters:
    """What the handler did since the process started (messages, except ``requests``)."""

    delivered: int = 0
    delivered_bytes: int = 0
    failed: int = 0  # failed attempts
    dead: int = 0
    skipped: int = 0  # outside the segment filter: acked without a request
    requests: Counter[str] = field(default_factory=Counter)  # by outcome: 2xx, 4xx, 5xx, timeout, ...


class PushHandler(Handler):
    """Deliver one queue's messages to ``params.url`` through its ack-mode subscription."""

    def __init__(
        self,
        cluster: Cluster,
        queue: str,
        params: PushParams,
        credentials: Credentials,
        rand: Callable[[], float] = random.random,
        egress: Egress | None = None,
        secrets: Secrets | None = None,
    ) -> None:
        self._cluster = cluster
        # The declared secrets its credentials name (none: a handler without credentials).
        self._secrets = secrets or Secrets()
        # None (an SDK-style handler built in a test): every address, as with auth off.
        self._egress = egress or Egress.open()
        self.queue = queue
        self.params = params
        self.policy = policy_of(params)
        # Continuous: each pass long-polls for ``wait``; without one, the floor between passes.
        self.interval = 0.0 if params.wait > 0 else MIN_PERIOD
        self._credentials = credentials
        self._rand = rand
        self.counters = PushCounters()
        self.latency = Histogram(LATENCY_BOUNDS)
        self.last_failure: tuple[str, int | None, float] | None = None
        # Set when the next pass must take back what an earlier run had claimed.
        self._take_back = True
        self._work_queue: WorkQueue | None = None
        self._slots = params.concurrency * params.batch
        self._hold_limit = min(4 * self._slots, MAX_HELD)
        self._window = max(MIN_WINDOW, self._hold_limit)
        self._held: dict[Key, list[tuple[LogMessage, Entry]]] = {}
        self._held_count = 0
        self._waiting: dict[int, float] = {}  # failed, waiting for a retry: id → when
        self._key_of: dict[int, Key] = {}  # the key of each waiting message
        self._blocked: Counter[Key] = Counter()  # waiting messages per key (ordered modes)
        self._busy: set[Key] = set()  # keys with a request in flight (ordered modes)
        self._tasks: set[asyncio.Task[None]] = set()
        self._errors: list[BaseException] = []
        self._in_flight = 0
        self._wake = asyncio.Event()

    # --- status ----------------------------------------------------------------------------

    def lag(self) -> int:
        """Messages not delivered yet: never claimed, or claimed and not finished."""
        try:
            queue = self._cluster.queue(self.queue)
            state = queue.work(self.params.subscription).state
        except CapellaError:
            return 0
        return max(0, queue.last_id - state.high) + len(state.entries)

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def status(self) -> PushStatus:
        failure = self.last_failure
        return PushStatus(
            delivered=self.counters.delivered,
            failed=self.counters.failed,
            dead=self.counters.dead,
            in_flight=self._in_flight,
            retrying=len(self._waiting),
            lag=self.lag(),
            last_delivery_error=None if failure is None else DeliveryError(*failure),
        )

    # --- a pass ----------------------------------------------------------------------------

    async def run_once(self) -> PassTally:
        queue = self._cluster.queue(self.queue)
        params = self.params
        self.identity.check("queue", "read", queue.name)
        self.identity.check("subscription", "write", f"{queue.name}/{params.subscription}")
        if self.policy.dead_letter is not None:
            self.identity.check("queue", "write", self.policy.dead_letter)
        # Read again as the handler's user now: a revoked grant stops it, a rotated value is used.
        self._credentials = credentials(params, self._secrets, self.identity)
        work = await self._work(queue)
        before = (self.counters.delivered, self.counters.delivered_bytes)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + PASS_SECONDS
        # Before anything is claimed: a refused receiver must not cost the messages attempts.
        await check_destination(self._egress, params.url)
        try:
            if self._take_back:
                await self._take_over(queue, work)
                self._take_back = False
            await self._sync(queue, work)
            connector = EgressConnector(self._egress, limit=params.concurrency)
            timeout = aiohttp.ClientTimeout(total=params.timeout)
            async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
                waited = False
                while loop.time() < deadline and not self.stopping:
                    self._wake.clear()
                    claimed = await self._claim(queue, work)
                    launched = self._launch(session, queue, work)
                    self._raise_errors()
                    if claimed or launched:
                        continue
                    if self._tasks or self._held_count or self._waiting or queue.last_id > work.state.high:
                        await self._idle(queue, work, deadline - loop.time())
                    elif waited or params.wait <= 0:
                        break  # everything is delivered (or dead)
                    else:
                        # Caught up: long-poll for new messages, then end the pass. Nothing is in
                        # flight, so a stop cancels the wait at once.
                        with self.interruptible_step():
                            await queue.wait_for(work.state.high, min(params.wait, deadline - loop.time()))
                        waited = True
                # The pass ends with nothing in flight: a stop never cuts a request short.
                while self._tasks:
                    await asyncio.wait(set(self._tasks))
                    self._raise_errors()
                    self._launch(session, queue, work, refill=False)
        except BaseException:
            # Whatever was claimed and not answered is taken back by the next pass.
            await self._abandon()
            raise
        return PassTally(self.counters.delivered - before[0], self.counters.delivered_bytes - before[1])

    async def _work(self, queue: BaseQueue) -> WorkQueue:
        """The subscription, defined with the policy on the first pass (and again if it was deleted)."""
        try:
            work = queue.work(self.params.subscription)
        except SubscriptionNotFound:
            work = None
        if work is None or work is not self._work_queue:
            # New to this run, or deleted and defined again (the queue too, maybe): start over.
            await queue.define_work(self.params.subscription, self.policy)
            work = queue.work(self.params.subscription)
            self._work_queue = work
            self._take_back = True
        return work

    async def _take_over(self, queue: BaseQueue, work: WorkQueue) -> None:
        """Take back the claims of an earlier run: they may have been sent, so they count an attempt."""
        self._forget()
        leased = [e for e in work.state.entries.values() if e.state == LEASED]
        if leased:
            outcomes = await work.nack(
                [(e.id, e.claims) for e in leased],
                0.0,
                TAKEN_BACK,
                SaveMode.DEFAULT,
            )
            self.counters.dead += sum(1 for o in outcomes if o.error is None and o.entry is None)
            log.info("push taken back queue=%s subscription=%s count=%d", queue.name, work.name, len(leased))

    async def _sync(self, queue: BaseQueue, work: WorkQueue) -> None:
        """Match what waits for a retry with the work queue (an operator may have moved or deleted it)."""
        waiting = {e.id: e.until for e in work.state.entries.values() if e.state == WAITING}
        self._key_of = {mid: key for mid, key in self._key_of.items() if mid in waiting}
        for mid in waiting.keys() - self._key_of.keys():
            self._key_of[mid] = await self._key_for(queue, mid)
        self._waiting = waiting
        self._blocked = Counter(self._key_of[mid] for mid in waiting if self._key_of[mid] is not None)

    async def _key_for(self, queue: BaseQueue, mid: int) -> Key:
        if self.params.ordering == "ordered":
            return 0
        if self.params.ordering == "unordered":
            return None
        page = await queue.read_after(mid - 1, 1)
        found = [m for m in page.messages if m.id == mid]
        return found[0].segment if found else None

    def _key(self, m: LogMessage) -> Key:
        ordering = self.params.ordering
        return 0 if ordering == "ordered" else m.segment if ordering == "by_segment" else None

    # --- claiming --------------------------------------------------------------------------

    def _room(self, work: WorkQueue) -> int:
        """How many new messages to claim now."""
        if len(work.state.entries) >= self._window or self._held_count >= self._hold_limit:
            return 0
        blocked = sum(len(self._held.get(k, ())) for k in self._blocked)
        return max(0, min(self._slots - (self._held_count - blocked), self._hold_limit - self._held_count))

    async def _claim(self, queue: BaseQueue, work: WorkQueue) -> int:
        now = queue.now()
        due = sum(1 for until in self._waiting.values() if until <= now)
        limit = due + self._room(work)
        if limit <= 0:
            return 0
        # A claim lost in a crash only means the message is sent as new (an ack, saved after
        # it in the same log, always saves it too): no fsync of its own.
        claimed = await work.claim(limit, LEASE, SaveMode.MARK)
        ranges = self.params.segments
        skipped: list[tuple[int, int]] = []
        for m, e in claimed:
            if self._waiting.pop(m.id, None) is not None:
                self._unblock(self._key_of.pop(m.id, None))
            if ranges is not None and not any(lo <= m.segment <= hi for lo, hi in ranges):
                skipped.append((e.id, e.claims))
                continue
            held = self._held.setdefault(self._key(m), [])
            bisect.insort(held, (m, e), key=lambda item: item[0].id)
            self._held_count += 1
        if skipped:
            # Not for this receiver: finished without a request.
            await work.ack(skipped, SaveMode.MARK)
            self.counters.skipped += len(skipped)
        return len(claimed)

    def _unblock(self, key: Key) -> None:
        if key is not None and self._blocked[key] > 0:
            self._blocked[key] -= 1
            if not self._blocked[key]:
                del self._blocked[key]

    def _next_batch(self) -> tuple[Key, list[tuple[LogMessage, Entry]]] | None:
        size = self.params.batch
        for key, held in self._held.items():
            if not held or (key is not None and (key in self._busy or key in self._blocked)):
                continue
            batch = held[:size]
            del held[:size]
            if not held:
                del self._held[key]
            self._held_count -= len(batch)
            return key, batch
        return None

    def _launch(
        self, session: aiohttp.ClientSession, queue: BaseQueue, work: WorkQueue, *, refill: bool = True
    ) -> int:
        """Start requests for what may be sent now, up to ``concurrency`` in flight."""
        launched = 0
        while refill and len(self._tasks) < self.params.concurrency:
            picked = self._next_batch()
            if picked is None:
                break
            key, batch = picked
            if key is not None:
                self._busy.add(key)
            self._in_flight += len(batch)
            self._start(self._deliver(session, queue, work, key, batch))
            launched += 1
        return launched

    def _start(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._errors.append(task.exception())  # type: ignore[arg-type]
        self._wake.set()

    def _raise_errors(self) -> None:
        if self._errors:
            error, self._errors = self._errors[0], []
            raise error

    async def _idle(self, queue: BaseQueue, work: WorkQueue, remaining: float) -> None:
        """Wait for a request to end, a retry to fall due, or (with room to claim) a new message."""
        timeout = remaining
        if self._waiting:
            # At least a moment: a retry that is due but cannot be claimed must not spin.
            timeout = min(timeout, max(0.005, min(self._waiting.values()) - queue.now()))
        if timeout <= 0:
            return
        waits: list[asyncio.Future[Any]] = [
            asyncio.ensure_future(self._wake.wait()),
            asyncio.ensure_future(work.changed.wait()),
        ]
        if self._room(work) > 0:
            waits.append(asyncio.ensure_future(queue.wait_for(work.state.high, timeout)))
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()
            await asyncio.gather(*waits, return_exceptions=True)

    # --- one request -----------------------------------------------------------------------

    async def _deliver(
        self,
        session: aiohttp.ClientSession,
        queue: BaseQueue,
        work: WorkQueue,
        key: Key,
        batch: list[tuple[LogMessage, Entry]],
    ) -> None:
        params = self.params
        try:
            body, headers = request_parts(
                queue.name,
                [Outgoing(m, e.attempts) for m, e in batch],
                single=params.batch == 1,
                extra=params.headers,
                credentials=self._credentials,
                now=int(queue.now()),
            )
            status: int | None = None
            error: str | None = None
            wait: float | None = None
            try:
                async with session.post(
                    params.url, data=body, headers=headers, allow_redirects=False
                ) as resp:
                    status = resp.status
                    head = await resp.content.read(ANSWER_BYTES)
                    if not 200 <= status < 300:
                        error = answer_text(status, resp.reason or "", head)
                        if retryable(status):
                            wait = retry_after(resp.headers.get("Retry-After"), queue.now())
                outcome = f"{status // 100}xx"
            except TimeoutError:
                error, outcome = f"no answer within {params.timeout:g}s", "timeout"
            except aiohttp.ClientError as exc:
                reason = _without_secrets(f"{type(exc).__name__}: {exc}")
                error, outcome = f"cannot reach the receiver: {reason}", "connection"
            self.counters.requests[outcome] += 1
            receipts = [(e.id, e.claims) for _, e in batch]
            if error is None:
                await work.ack(receipts, SaveMode.DEFAULT)
                self._delivered(queue, batch)
            else:
                await self._failed(queue, work, key, batch, error, status, wait)
        finally:
            self._in_flight -= len(batch)
            self._busy.discard(key)

    def _delivered(self, queue: BaseQueue, batch: list[tuple[LogMessage, Entry]]) -> None:
        now = queue.now()
        for m, _ in batch:
            self.latency.observe(max(0.0, now - m.time))
        self.counters.delivered += len(batch)
        self.counters.delivered_bytes += sum(len(m.payload) for m, _ in batch)

    async def _failed(
        self,
        queue: BaseQueue,
        work: WorkQueue,
        key: Key,
        batch: list[tuple[LogMessage, Entry]],
        error: str,
        status: int | None,
        wait: float | None,
    ) -> None:
        policy = self.policy
        # One delay for the whole batch, so its messages come back together and in order.
        attempts = max(e.attempts for _, e in batch)
        # A receiver's Retry-After: 0 is taken as the floor of a handler's periods, not a busy loop.
        delay = max(wait, MIN_PERIOD) if wait is not None else retry_delay(policy, attempts, self._rand())
        outcomes = await work.nack([(e.id, e.claims) for _, e in batch], delay, error, SaveMode.DEFAULT)
        for o in outcomes:
            if o.error is not None:
                continue
            if o.entry is None:
                self.counters.dead += 1
            else:
                self._waiting[o.id] = o.entry.until
                self._key_of[o.id] = key
                if key is not None:
                    self._blocked[key] += 1
        self.counters.failed += len(batch)
        self.last_failure = (error, status, queue.now())
        log.info(
            "push failed queue=%s url=%s ids=%d-%d retry_in=%.3gs: %s",
            queue.name,
            _without_secrets(self.params.url),
            batch[0][0].id,
            batch[-1][0].id,
            delay,
            error,
        )

    # --- ending a pass that failed ---------------------------------------------------------

    async def _abandon(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.gather(*tasks, return_exceptions=True)
        self._forget()
        self._take_back = True

    def _forget(self) -> None:
        self._held.clear()
        self._held_count = 0
        self._waiting.clear()
        self._key_of.clear()
        self._blocked.clear()
        self._busy.clear()
        self._errors.clear()
        self._in_flight = 0


def _without_secrets(text: str) -> str:
    """``text`` with every http(s) URL in it cut to scheme, host, port and path."""
    return _URL_SECRETS.sub(r"\1\2", text)


def push_params(params: PushParams, name: str) -> PushParams:
    """Handler ``name``'s params as shown and stored: its subscription and policy resolved."""
    policy = policy_of(params)
    return msgspec.structs.replace(
        params,
        subscription=params.subscription or f"push-{name}",
        **{field: getattr(policy, field) for field in POLICY_FIELDS},
    )


def policy_of(params: PushParams) -> RetrySettings:
    """The retry policy its subscription gets; a bad field is named as the param it is."""
    given = {name: getattr(params, name) for name in POLICY_FIELDS if getattr(params, name) is not None}
    try:
        return parse_policy(given, RetrySettings(lease=LEASE))
    except InvalidRequest as exc:
        where = str(exc.details.get("field", "params")).replace("policy.", "params.")
        raise InvalidRequest(exc.message.replace("policy.", "params."), field=where) from None


def credentials(params: PushParams, secrets: Secrets, identity: Identity) -> Credentials:
    """The values of the secrets ``params`` name, now, as ``identity`` may use them.

    They are read when the handler is defined and again at the start of every pass, as its
    user, so a revoked grant stops it and a rotated value is picked up.
    """
    # Bound secrets ([secrets.NAME] hosts) go only to their hosts: checked on the URL's host.
    host = urlsplit(params.url).hostname or ""
    values = {
        name: None
        if getattr(params, name) is None
        else secrets.use(getattr(params, name), identity, f"params.{name}", to=host)
        for name in SECRET_PARAMS
    }
    authorization = None
    if values["token"] is not None:
        authorization = f"Bearer {values['token']}"
    elif values["basic"] is not None:
        if ":" not in values["basic"]:
            raise InvalidRequest(
                f"params.basic: secret {params.basic!r} must hold user:password", field="params.basic"
            )
        authorization = "Basic " + base64.b64encode(values["basic"].encode()).decode("ascii")
    secret = values["secret"]
    return Credentials(authorization, None if secret is None else secret.encode())


def build(params: PushParams, at: Building) -> tuple[PushParams, PushHandler]:
    """The ``push`` handler type: one queue, and a dead-letter queue other than it (no clusters)."""
    queues, cluster = at.queues, at.cluster
    if len(queues) != 1 or any(c in queues[0] for c in "*?["):
        raise InvalidRequest("a push handler takes one queue (queue), not a list or pattern", field="queue")
    push = push_params(params, at.name)
    if push.dead_letter is not None:
        try:
            cluster.queue(push.dead_letter)
        except QueueNotFound as exc:
            raise InvalidRequest(f"params.dead_letter: {exc.message}", field="params.dead_letter") from None
        if push.dead_letter == queues[0]:
            raise InvalidRequest("params.dead_letter must name another queue", field="params.dead_letter")
    # As whoever defines it: naming a secret its user may not use refuses the definition.
    found = credentials(push, at.reach.secrets, at.reach.by)
    return push, PushHandler(
        cluster, queues[0], push, found, egress=at.reach.egress, secrets=at.reach.secrets
    )


HANDLER = HandlerType("push", PushParams, build, status=PushStatus, delivers=True)
