"""The supervisor: persisted handler definitions, one loop per started handler, and status.

Definitions live in ``.capella/handlers.json`` on the default mount and come back on restart
in the state they had. A handler runs as a user (``user`` in its definition, by default
whoever defined it) and each pass is limited by that user's rules as they are at that moment;
a handler defined while authentication was off has no user and is not limited. The user may
not exist yet (the original's examples define a handler before its user): its passes then fail
until it does. Whoever defined the handler is kept with it, and a pass runs only while that
definer still holds everything the user holds (``AuthStore.act_on``, the attenuation check), so
naming a user that is created or widened later never grants more than the definer holds. A pass that
fails records its error and is retried with backoff; an exception in a pass never leaves the
loop. Stopping waits for a running pass to finish (a
bounded time) and then cancels the loop, so a stopped handler does nothing more.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, cast

import msgspec
from msgspec import UNSET

from capella.auth.rule import UNRESTRICTED, Identity
from capella.auth.secret import Secrets
from capella.auth.store import AuthStore
from capella.backoff import backoff
from capella.core.cluster import Cluster
from capella.core.definition import check_name
from capella.core.loops import keep_running
from capella.egress import Egress
from capella.errors import (
    CapellaError,
    Forbidden,
    HandlerNotFound,
    HandlerUserNotCovered,
    HandlerUserUnavailable,
    InvalidConfig,
    InvalidRequest,
)
from capella.file_access import FileAccess
from capella.handlers.base import Building, Handler, PassTally, check_shared, handler_type
from capella.links.reach import Reach
from capella.links.registry import Links
from capella.storage.catalog import HANDLERS
from capella.wire import handler_status as wire
from capella.wire.fields import USER_NAME_PATTERN
from capella.wire.handlers import HandlerType, decode_definition
from capella.wire.params import Params
from capella.wire.records import HandlerEntry, HandlerRegistry

log = logging.getLogger(__name__)

# What ends the name of a param that only the registry holds (a password, encrypted).
_KEPT = "_encrypted"
# A copy handler whose cluster comes back resumes within a minute, not after an hour of backoff.
MAX_BACKOFF = 60.0
STOP_GRACE = 10.0


def build(
    cluster: Cluster, kind: str, queues: list[str], raw: object, reach: Reach, name: str = ""
) -> tuple[Params, Handler]:
    """Handler ``name`` of ``kind`` from its params as sent or stored (errors name the field).

    The registry keeps a secret beside the params only encrypted (``*_encrypted``, which the
    API never takes): it goes to the type's ``build`` as ``kept``.
    """
    entry = handler_type(kind)
    kept: dict[str, Any] = {}
    if isinstance(raw, dict):
        kept = {k: v for k, v in raw.items() if k.endswith(_KEPT)}
        raw = {k: v for k, v in raw.items() if k not in kept}
    return entry.build(entry.decode(raw), Building(cluster, queues, reach, name, kept))


@dataclass(frozen=True, slots=True)
class PassReport:
    """One pass: what it did, how it ended (``error`` None on success) and when."""

    items: int
    bytes: int
    error: str | None
    started: float
    finished: float

    def result(self) -> wire.PassResult:
        """The pass as the API shows it (``pass`` in the answer to run)."""
        return wire.PassResult(
            self.error is None, self.items, self.bytes, self.error, self.started, self.finished
        )


@dataclass(slots=True)
class HandlerState:
    """One handler: its definition, its running loop, and what it has done."""

    name: str
    type: str
    queues: list[str]
    # The type's params struct; a stored definition that no longer builds keeps its dict.
    params: Params | dict[str, Any]
    handler: Handler
    started: bool
    user: str | None = None
    # Who defined it; None with authentication off (or stored before definers were kept).
    definer: str | None = None
    # The definer's ``created``, which tells it from a later user of the same name.
    definer_since: float | None = None
    runs: int = 0
    items: int = 0
    bytes: int = 0
    failures: int = 0
    running: bool = False
    last_complete: float | None = None  # when the last successful pass ended (last_success)
    last_run: float | None = None  # when the last pass ended, whatever it did
    failing_since: float | None = None  # when the current streak of failed passes began
    last_error: wire.HandlerError | None = None  # with the error's code (``internal``: not a CapellaError)
    next_run: float | None = None
    task: asyncio.Task[None] | None = None
    pass_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # The identity a pass would run under now, or the error why none can (the supervisor's).
    authority: Callable[[HandlerState], Identity] = field(default=lambda state: UNRESTRICTED, repr=False)

    def shown_params(self) -> dict[str, Any]:
        """The params as the API shows them: the struct as msgspec renders it."""
        if isinstance(self.params, dict):
            # A pg handler's stored password stays out of the API even when encrypted.
            return {k: v for k, v in self.params.items() if not k.endswith(_KEPT)}
        shown: dict[str, Any] = msgspec.to_builtins(self.params)
        return shown

    def stored(self) -> HandlerEntry:
        """The definition as the registry keeps it (a secret in params only encrypted)."""
        if isinstance(self.params, dict):
            params = dict(self.params)
        else:
            shown = {k: v for k, v in self.shown_params().items() if k not in self.params.shown_only}
            params = shown | self.handler.stored_params()
        return HandlerEntry(
            type=self.type,
            queues=self.queues,
            params=params,
            started=self.started,
            user=self.user,
            definer=self.definer,
            definer_since=self.definer_since,
        )

    def info(self) -> wire.HandlerInfo:
        """The handler as the API shows it: its definition and its status."""
        return wire.HandlerInfo(
            name=self.name,
            # Only a registered type ever reaches a state (a definition decodes by its type).
            type=cast("HandlerType", self.type),
            queues=self.queues,
            params=self.shown_params(),
            started=self.started,
            user=self.user,
            status=self.status(),
        )

    def status(self) -> wire.HandlerStatus:
        """The passes so far, with the fields the handler's type adds (its status struct)."""
        status = wire.HandlerStatus(
            running=self.running,
            runs=self.runs,
            items=self.items,
            bytes=self.bytes,
            last_complete=self.last_complete,
            last_success=self.last_complete,
            last_run=self.last_run,
            failing_since=self.failing_since,
            last_error=self.last_error,
            next_run=self.next_run if self.task is not None else None,
            cannot_run=self.cannot_run(),
        )
        typed = self.handler.status()
        if typed is None:
            return status
        # A type's status struct names its fields as HandlerStatus does; UNSET stays absent.
        return msgspec.structs.replace(status, **msgspec.structs.asdict(typed))

    def cannot_run(self) -> str | None:
        """Why no pass can run now (its user, or its definer's hold on it), or None."""
        try:
            self.authority(self)
        except CapellaError as exc:
            return exc.message
        return None

    def note_error(self, exc: Exception, message: str, at: float) -> None:
        """``exc`` (told as ``message``) is the last error; a streak of failures begins at its first."""
        self.last_error = wire.HandlerError(message, at, _code_of(exc))
        if self.failing_since is None:
            self.failing_since = at


def _code_of(exc: BaseException) -> str:
    """The code of the Capella error that caused ``exc``; ``internal`` for any other exception.

    A handler that adds where a pass failed (which queue, which cluster) raises its error from
    the one it caught, so the status shows why (``unreachable``), not the wrapper's code.
    """
    if not isinstance(exc, CapellaError):
        return CapellaError.code
    seen = {id(exc)}
    # A handler may raise a kept error again, from a new one: a chain can loop, so stop at a repeat.
    while isinstance(exc.__cause__, CapellaError) and id(exc.__cause__) not in seen:
        exc = exc.__cause__
        seen.add(id(exc))
    return exc.code


class Supervisor:
    """Owns every handler's loop and timing; the API and the CLI talk to it."""

    def __init__(
        self,
        cluster: Cluster,
        clock: Callable[[], float] = time.time,
        links: Links | None = None,
        users: AuthStore | None = None,
        secrets: Secrets | None = None,
        egress: Egress | None = None,
        files: FileAccess | None = None,
    ) -> None:
        self._cluster = cluster
        self._users = users
        self._clock = clock
        # The links (external clusters) that copy handlers reach as ``cluster/queue``.
        self.links = links if links is not None else Links(cluster)
        self.reach = Reach(self.links, secrets or Secrets(), egress or Egress.open(), files or FileAccess())
        self._states: dict[str, HandlerState] = {}
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        """Load the persisted definitions and start the handlers that were started."""
        await self.links.start()
        definitions = (await HANDLERS.load(self._cluster.home)).handlers
        for name, d in sorted(definitions.items()):
            params: Params | dict[str, Any]
            try:
                # As the user it runs as: a secret or cluster it lost the right to does not load.
                reach = replace(self.reach, by=self._building_identity(d.user, d.definer))
                params, handler = build(self._cluster, d.type, list(d.queues), d.params, reach, name)
            except CapellaError as exc:
                # Keep the definition (a later save must not drop it); every pass reports why.
                log.error("handler cannot be loaded handler=%s: %s", name, exc.message)
                params = dict(d.params)
                handler = _Unloadable(exc.message)
            state = HandlerState(
                name, d.type, list(d.queues), params, handler, d.started, d.user, d.definer, d.definer_since
            )
            state.authority = self._identity
            self._states[name] = state
            if state.started:
                self._launch(state)
        log.info(
            "handlers loaded count=%d started=%d",
            len(self._states),
            sum(s.started for s in self._states.values()),
        )

    async def close(self) -> None:
        """Stop every loop; the persisted ``started`` flags stay as they are."""
        for state in list(self._states.values()):
            await self._halt(state)
        await self.links.close()

    def handlers(self) -> list[HandlerState]:
        return [self._states[name] for name in sorted(self._states)]

    def handler(self, name: str) -> HandlerState:
        try:
            return self._states[name]
        except KeyError:
            raise HandlerNotFound(f"no handler {name!r}") from None

    async def put(self, name: str, data: object, by: Identity = UNRESTRICTED) -> tuple[HandlerState, bool]:
        """Create or replace a handler from its JSON definition; ``True`` when created.

        The handler runs as ``data["user"]``, by default as ``by``; naming another user needs
        ``user admin`` on it and everything it holds, so nobody hands a handler more rights
        than they could use. The user may not exist yet: the handler is stored, built as ``by``
        (the user will never be let hold more), and its passes fail until the user exists. ``by``
        is kept as its definer: every pass checks that the definer still holds everything the
        user holds. Replacing a handler that runs as another user needs everything that user
        holds too (``_check_acting``).
        """
        check_name(name, "handler")
        if isinstance(data, dict) and isinstance(data.get("params"), dict):
            for key in data["params"]:
                if key.endswith(_KEPT):
                    # Only this server writes ciphertexts, into its own registry: one taken from
                    # another definition would be replayed to wherever this one points.
                    raise InvalidRequest(
                        f"params.{key} is never accepted from the API: give the secret itself "
                        "(it is stored encrypted) or name a declared secret",
                        field=f"params.{key}",
                    )
        definition = decode_definition(data)
        kind = definition.kind
        entry = handler_type(kind)
        queues = entry.queues(definition, self._cluster)
        started = definition.started
        user = self._run_as(by.name if definition.user is UNSET else definition.user, by)
        # Built as the user it will run as: its secrets and clusters must be theirs to use. A
        # user who does not exist yet (or is disabled) is built as the definer, whose hold on the
        # user every pass checks: the user can never use more than the definer.
        acting = by if user == by.name else self._building_identity(user, by.name, by)
        reach = replace(self.reach, by=acting)
        params = definition.params if definition.params is not None else entry.decode(None)
        params, handler = entry.build(params, Building(self._cluster, queues, reach, name))
        check_shared(handler, kind, queues, self._cluster)
        await handler.check(acting)
        async with self._lock:
            old = self._states.get(name)
            if old is not None:
                self._check_acting(by, old.user)
            state = HandlerState(
                name, kind, queues, params, handler, started, user, by.name, self._since(by.name)
            )
            state.authority = self._identity
            # Saved before anything runs differently: a failed save leaves the old definition
            # stored and the old loop running, as if the request had never come.
            self._states[name] = state
            try:
                await self._save()
            except BaseException:
                if old is None:
                    del self._states[name]
                else:
                    self._states[name] = old
                raise
            if old is not None:
                await self._halt(old)
            if started:
                self._launch(state)
        log.info("handler %s handler=%s type=%s", "created" if old is None else "replaced", name, kind)
        return state, old is None

    async def drop(self, name: str, by: Identity = UNRESTRICTED) -> None:
        async with self._lock:
            state = self.handler(name)
            self._check_acting(by, state.user)
            # Saved first: a failed save leaves it defined and running.
            del self._states[name]
            try:
                await self._save()
            except BaseException:
                self._states[name] = state
                raise
            await self._halt(state)
        log.info("handler dropped handler=%s", name)

    def using_link(self, link: str) -> list[str]:
        """The handlers that read from or write to link ``link``."""
        return [s.name for s in self.handlers() if link in s.handler.links()]

    async def start_handler(self, name: str, by: Identity = UNRESTRICTED) -> HandlerState:
        async with self._lock:
            state = self.handler(name)
            self._check_acting(by, state.user)
            if not state.started:
                state.started = True
                await self._save()
            if state.task is None:
                self._launch(state)
        return state

    async def stop_handler(self, name: str, by: Identity = UNRESTRICTED) -> HandlerState:
        async with self._lock:
            state = self.handler(name)
            self._check_acting(by, state.user)
            if state.started:
                state.started = False
                await self._save()
            await self._halt(state)
        return state

    async def run_now(self, name: str, by: Identity = UNRESTRICTED) -> HandlerState:
        """One pass right now, also for a stopped handler; its outcome is in the status."""
        state, _ = await self.run_pass_now(name, by)
        return state

    async def run_pass_now(self, name: str, by: Identity = UNRESTRICTED) -> tuple[HandlerState, PassReport]:
        """One pass right now, also for a stopped handler: the state after it, and that pass."""
        state = self.handler(name)
        self._check_acting(by, state.user)
        return state, await self._run_pass(state)

    # --- loops ---------------------------------------------------------------------------

    def _launch(self, state: HandlerState) -> None:
        state.failures = 0
        state.next_run = self._clock()
        task = f"handler:{state.name}"

        async def body() -> None:
            try:
                await self._loop(state)
            except Exception as exc:
                # keep_running logs it and restarts the loop; the status shows it with its code.
                message = exc.message if isinstance(exc, CapellaError) else f"{task} crashed: {exc!r}"
                state.note_error(exc, message, self._clock())
                raise

        state.task = asyncio.create_task(
            keep_running(task, body, failures=self._cluster.task_failures),
            name=task,
        )

    async def _loop(self, state: HandlerState) -> None:
        delay = 0.0  # the first pass runs at once, then every interval
        while True:
            state.next_run = self._clock() + delay
            if not state.failures:
                # A handler may end the wait early when there is work (a NOTIFY, a new message);
                # a backoff after failures is always waited out.
                await state.handler.pause(delay)
            else:
                await asyncio.sleep(delay)
            await self._run_pass(state)
            interval = state.handler.interval
            # Back off after failures: interval, 2x, 4x ... up to a minute (or the interval).
            # Even a continuous handler (interval 0) waits a little after a failure.
            if state.failures:
                delay = backoff(state.failures, max(interval, 1.0), max(MAX_BACKOFF, interval))
            else:
                delay = interval

    def _run_as(self, user: object, by: Identity) -> str | None:
        if user is None:
            return None
        if not isinstance(user, str) or not re.fullmatch(USER_NAME_PATTERN, user):
            raise InvalidRequest("user must be a user name", field="user")
        if self._users is not None:
            # user admin on the name, and everything the user holds if it exists; a user who
            # does not exist yet holds nothing, and each pass checks the definer again.
            self._users.act_on(by, user)
        return user

    def _check_acting(self, by: Identity, user: str | None) -> None:
        """A handler that runs as another user is that user's: changing, starting, stopping,
        running or dropping it needs everything the user holds (``Rule.covers``)."""
        if user is None or user == by.name or self._users is None:
            return
        held = self._users.find_user(user)
        if held is not None:
            by.check_acting_on(held.identity("handler"))

    def _identity(self, state: HandlerState) -> Identity:
        """The rules this pass runs under: its user's, read now (a change applies at once),
        while its definer still holds everything the user holds; else the error why not."""
        name = state.user
        if name is None or self._users is None:
            return UNRESTRICTED  # defined with authentication off, or it is off now
        user = self._users.find_user(name)
        if user is None or not user.enabled:
            raise HandlerUserUnavailable(f"handler user {name!r} does not exist or is disabled")
        held = user.identity("handler")
        definer = state.definer
        if definer is None:
            return held  # defined with authentication off, or stored before definers were kept
        found = user if definer == name else self._users.find_user(definer)
        if found is None or not found.enabled:
            raise HandlerUserNotCovered(
                f"handler {state.name!r} runs as {name!r} for {definer!r}, who defined it and no "
                "longer exists or is disabled: define it again (PUT) as a user who holds what "
                f"{name!r} holds"
            )
        if state.definer_since is not None and found.created != state.definer_since:
            # Dropped and made again: a new principal with the old name never inherits the
            # handlers the old one defined (it may be an admin now).
            raise HandlerUserNotCovered(
                f"handler {state.name!r} was defined by an earlier user named {definer!r} (dropped "
                "since and made again): define it again (PUT) to let it run"
            )
        if definer == name:
            return held
        try:
            # The same check as acting on the user's credentials: user admin on the name and
            # everything the user holds (only an admin covers an admin).
            self._users.act_on(found.identity("handler"), name)
        except Forbidden:
            what = "an admin" if user.admin else "rules"
            raise HandlerUserNotCovered(
                f"handler {state.name!r} runs as {name!r}, who now holds {what} that {definer!r}, "
                f"who defined it, does not hold: it runs again once {definer!r} holds everything "
                f"{name!r} holds, or when defined again (PUT) by a user who does"
            ) from None
        return held

    def _since(self, name: str | None) -> float | None:
        """When user ``name`` was made (None: no such user, or authentication is off)."""
        found = None if name is None or self._users is None else self._users.find_user(name)
        return None if found is None else found.created

    def _building_identity(
        self, name: str | None, definer: str | None, by: Identity | None = None
    ) -> Identity:
        """Who a definition is built as: its user now, or, while the user does not exist yet or
        is disabled, its definer (``by`` when defining), never more than the user will be let use."""
        if name is None or self._users is None:
            return UNRESTRICTED
        user = self._users.find_user(name)
        if user is not None and user.enabled:
            return user.identity("handler")
        if by is not None:
            return by
        found = None if definer is None or definer == name else self._users.find_user(definer)
        if found is None or not found.enabled:
            raise HandlerUserUnavailable(f"handler user {name!r} does not exist or is disabled")
        return found.identity("handler")

    async def _run_pass(self, state: HandlerState) -> PassReport:
        async with state.pass_lock:
            state.running = True
            started = self._clock()
            try:
                state.handler.identity = self._identity(state)
                result = await state.handler.run_once()
            except CapellaError as exc:
                report = self._failed(state, exc, exc.message, started)
            except Exception as exc:  # a bug in a pass must not take the server down
                log.exception("handler pass crashed handler=%s", state.name)
                report = self._failed(state, exc, f"internal error: {exc!r}", started)
            else:
                finished = self._clock()
                state.runs += 1
                state.items += result.items
                state.bytes += result.bytes
                state.failures = 0
                state.last_error = None
                state.failing_since = None
                state.last_complete = state.last_run = finished
                report = PassReport(result.items, result.bytes, None, started, finished)
                log.debug(
                    "handler pass done handler=%s items=%d bytes=%d", state.name, result.items, result.bytes
                )
            finally:
                state.running = False
            return report

    def _failed(self, state: HandlerState, exc: Exception, message: str, started: float) -> PassReport:
        finished = self._clock()
        state.runs += 1
        state.failures += 1
        state.last_run = finished
        state.note_error(exc, message, finished)
        self._cluster.task_failures.add(f"handler:{state.name}")
        log.error("handler pass failed handler=%s failures=%d: %s", state.name, state.failures, message)
        return PassReport(0, 0, message, started, finished)

    async def _halt(self, state: HandlerState) -> None:
        task, state.task = state.task, None
        state.next_run = None
        if task is not None:
            state.handler.stopping = True
            try:
                if state.running and not state.handler.interruptible:
                    # Let the pass in progress finish its step; moves and deletes are crash-safe,
                    # but finishing is cleaner than an interrupted write. A step that may be cut
                    # short (a long poll, a call to another cluster) is cancelled at once.
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(STOP_GRACE):
                            async with state.pass_lock:
                                task.cancel()
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            finally:
                state.handler.stopping = False  # a later start or run-now runs whole passes
        if state.handler.closes:  # a database connection, say (a run-now pass opens one too)
            async with state.pass_lock:
                await state.handler.close()
        else:
            await state.handler.close()

    async def _save(self) -> None:
        handlers = {s.name: s.stored() for s in self.handlers()}
        await HANDLERS.save(self._cluster.home, HandlerRegistry(handlers=handlers))


class _Unloadable(Handler):
    """A stored definition that no longer builds (e.g. its mark lost its mount): kept as is."""

    interval = 60.0
    loaded = False

    def __init__(self, error: str) -> None:
        self._error = error

    async def run_once(self) -> PassTally:
        raise InvalidConfig(f"this definition cannot be loaded: {self._error}; replace it with PUT")
