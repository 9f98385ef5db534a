"""What every handler is, and the registry of handler types.

A handler type is one module, ``capella.handlers.<type>``, that ends with its registry entry::

    HANDLER = HandlerType("expire", ExpireParams, build)

Its params are the wire struct (``capella.wire.upkeep.ExpireParams``), decoded straight from
the definition (``decode_params``) and shown as msgspec renders it; what the handler adds to
the status is a struct of its own there too (``CopyStatus``...).

The names come from ``capella.wire.handlers.HandlerType`` (the contract the API, the document,
the CLI and the client share); each module is imported when its entry is first needed, so the
default configuration imports none (copy brings the HTTP client, pg_* asyncpg). The supervisor,
the API and metrics ask the entry and the ``Handler`` hooks, never ``type == "..."``.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from capella.auth.rule import UNRESTRICTED, Identity
from capella.errors import InvalidRequest, NotOnSharedQueue, QueueNotFound
from capella.wire.handlers import HANDLER_TYPES, Definition
from capella.wire.params import Params, decode_params
from capella.wire.struct import Struct

if TYPE_CHECKING:
    from capella.core.cluster import Cluster
    from capella.links.reach import Reach


@dataclass(frozen=True, slots=True)
class PassTally:
    """What one pass did: items handled (blocks, queues) and bytes moved or freed."""

    items: int = 0
    bytes: int = 0

    def __add__(self, other: PassTally) -> PassTally:
        return PassTally(self.items + other.items, self.bytes + other.bytes)


def queue_patterns(definition: Definition, cluster: Cluster) -> list[str]:
    """``queues`` (names or fnmatch patterns) from a definition; plain names must exist."""
    raw = definition.named_queues()
    if raw is None:
        raise InvalidRequest("queues must be a non-empty list of queue names or patterns", field="queues")
    for name in raw:
        if not _is_pattern(name):
            try:
                cluster.queue(name)
            except QueueNotFound:
                raise InvalidRequest(f"queues: unknown queue {name!r}", field="queues") from None
    return list(raw)


def check_shared(handler: Handler, kind: str, queues: list[str], cluster: Cluster) -> None:
    """Refuse a definition that names a shared queue for a type that works on local ones only
    (a pattern that matches shared queues later skips them: ``per_queue.selected``)."""
    if handler.on_shared:
        return
    for name in queues:
        if not _is_pattern(name) and cluster.queue(name).shared:
            raise NotOnSharedQueue(
                f"queues: {name!r} is a shared queue, and {kind} handlers work on local queues only "
                "in this version (copy and expire handlers work on both)",
                field="queues",
            )


def _is_pattern(name: str) -> bool:
    return any(c in name for c in "*?[")


class Handler(ABC):
    """One running handler; the supervisor calls ``run_once`` each pass, the rest are hooks.

    The hooks' defaults do nothing: no extra status, a plain sleep between passes, nothing to
    close (dramatiq's ``Middleware``).
    """

    interval: float
    # The rules a pass runs under; the supervisor sets it before each pass.
    identity: Identity = UNRESTRICTED
    # True when ``close`` releases what a pass uses (a database pool): the supervisor then waits
    # for a pass in progress before closing.
    closes: ClassVar[bool] = False
    # True for a type that works on shared queues too (copy, expire); the others keep state on this
    # node (a work queue, a delivery log), so a definition naming a shared queue is refused.
    on_shared: ClassVar[bool] = False
    # False for a stored definition that no longer builds: it has only this interface, none
    # of its type's own counters (metrics skip it).
    loaded: ClassVar[bool] = True
    # True during a step a stop may cut short (``interruptible_step``): the supervisor then
    # cancels the pass at once instead of granting it a grace to finish the step.
    interruptible: bool = False
    # True while the supervisor stops the handler: a pass ends after its step, and starts no wait.
    stopping: bool = False

    @abstractmethod
    async def run_once(self) -> PassTally:
        """One pass; the supervisor owns the loop, the timing and the error reporting."""

    def status(self) -> Struct | None:
        """What this type adds to the status: its entry's ``status`` struct, or nothing."""
        return None

    def links(self) -> list[str]:
        """The links (external clusters) it reads from or writes to."""
        return []

    def stored_params(self) -> dict[str, Any]:
        """What the registry keeps beside the params the API shows (a password, encrypted)."""
        return {}

    @contextlib.contextmanager
    def interruptible_step(self) -> Iterator[None]:
        """Around a step nothing half done of which outlives a cancel: a long poll, or a call to
        another cluster that the next pass makes again and whose repeat dedup absorbs."""
        self.interruptible = True
        try:
            yield
        finally:
            self.interruptible = False

    async def pause(self, delay: float) -> None:
        """The wait before the next pass; a handler may end it early when there is work."""
        await asyncio.sleep(delay)

    async def close(self) -> None:  # noqa: B027 (a hook whose default is to do nothing)
        """Release what the handler holds once it is stopped."""

    async def check(self, identity: Identity) -> None:  # noqa: B027 (a hook whose default is to do nothing)
        """Refuse a definition for what only I/O can tell (a file it names), as ``identity``.

        Called when the handler is defined, before it is stored; ``build`` checks the rest.
        """


@dataclass(frozen=True, slots=True)
class Building:
    """What a type's ``build`` may use besides the params: where and as whom it will run."""

    cluster: Cluster
    # The queues its definition selects (``HandlerType.queues``).
    queues: list[str]
    # Its user's secrets and links, and the egress policy.
    reach: Reach
    # The handler's name.
    name: str
    # What ``Handler.stored_params`` gave the registry (a password, encrypted); empty from the API.
    kept: Mapping[str, Any] = field(default_factory=dict)


P = TypeVar("P", bound=Params)
Build = Callable[[P, Building], tuple[P, Handler]]
Queues = Callable[[Definition, "Cluster"], list[str]]


@dataclass(frozen=True, slots=True)
class HandlerType(Generic[P]):
    """One handler type's registry entry, declared at the bottom of its module."""

    name: str
    # Its params: the struct in its family's ``wire`` module (``wire.copy``, ``wire.push``...).
    params: type[P]
    # ``build(params, building)``: resolve what depends on the rest of the server (a default
    # named for the handler, a password to encrypt) and make the handler.
    build: Build[P]
    # What its handler adds to the status (``Handler.status``): a struct beside its params.
    status: type[Struct] | None = None
    # The queues a definition selects: ``queues`` (or ``queue``) by default; a type whose
    # queue is in its params says so here.
    queues: Queues = queue_patterns
    # Its handler reports deliveries (``counters``, ``in_flight``, ``lag()``, ``latency``): the
    # ``capella_push_*`` metrics.
    delivers: bool = False

    def decode(self, raw: object) -> P:
        """Params as sent (or as stored) into ``params``; errors name the field."""
        return decode_params(self.params, raw)


# Every type's module, by name; imported when its entry is first asked for.
MODULES = {name: f"capella.handlers.{name}" for name in HANDLER_TYPES}


def find(name: str) -> HandlerType[Any] | None:
    """The entry of handler type ``name``, or None for a name that is no type."""
    module = MODULES.get(name)
    if module is None:
        return None
    entry: HandlerType[Any] = importlib.import_module(module).HANDLER
    return entry


def handler_type(name: str) -> HandlerType[Any]:
    """The entry of handler type ``name``; an unknown name is the caller's error."""
    entry = find(name)
    if entry is None:
        raise InvalidRequest(
            f"type: unknown handler type {name!r} (known: {', '.join(sorted(HANDLER_TYPES))})",
            field="type",
        )
    return entry
