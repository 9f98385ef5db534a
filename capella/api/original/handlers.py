"""The original's handler actions (``add_h`` ... ``h_last_complete``) on Capella's supervisor.

The original's handler types become Capella's: ``regularly_save`` → flush, ``block_unload`` →
unload, ``block_delete`` → expire, ``block_mark`` → archive, ``copy_unique`` → copy. A handler
is defined through ``Supervisor.put`` as ``/v1`` defines it, so it runs as its user (the
envelope's user, or ``user_name`` when that user may hand it out, also one who does not exist
yet: its passes then fail until the user exists and has rights) and its clusters and queues are
checked the same way. ``gd_h`` shows a Capella handler in the original's shape again; fields
Capella has no use for come back as zero (docs/compat.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import msgspec

from capella.api.original import codes, shapes
from capella.api.original.actions import Action, Context, body_name
from capella.api.original.envelope import Failure, Request
from capella.api.route import HANDLER_PATH, HANDLER_START_PATH, HANDLER_STOP_PATH
from capella.core.message import SaveMode
from capella.errors import AlreadyExists, InvalidRequest
from capella.handlers.supervisor import HandlerState
from capella.wire import handlers as wire
from capella.wire.copy import CopyParams
from capella.wire.params import Params, decode_params
from capella.wire.upkeep import ArchiveCondition, ArchiveParams, ExpireParams, FlushParams, UnloadParams

NS = shapes.NS
# The error codes of the original's h_last_error: a handler that failed, and why (Capella
# keeps the text and code of a pass's error, not its class: a permission error gets the
# original's inner code, codes.PASS_CODES; any other a code of Capella's own).
LAST_ERROR = 10117400
PASS_FAILED = 10990009

# --- the original's params, one struct per type ----------------------------------------------
# Durations are integer nanoseconds (None: not given). The fields Capella has no use for are
# shown as zero and never read: whatever a client sends in them is ignored, as Go ignores them.


class Periodic(msgspec.Struct):
    """What every type's params begin with: the period of its passes."""

    interval: int | None = None


class Waiting(Periodic):
    """Params with the original's ``wait`` (its request timeout; Capella has no use for it)."""

    wait: object = 0


class Marking(Periodic):
    """Params with the original's ``wait_mark`` (Capella has no use for it)."""

    wait_mark: object = 0


class RegularlySave(Waiting):
    """``regularly_save`` (flush): the flush interval."""


class BlockUnload(Waiting):
    """``block_unload`` (unload): blocks in memory for ``storage_memory_time`` or not read for
    ``storage_last_load_time`` are unloaded (0: no such bound)."""

    storage_memory_time: int | None = None
    storage_last_load_time: int | None = None


class BlockDelete(Marking):
    """``block_delete`` (expire): blocks older than ``storage_time`` are deleted."""

    wait_delete: object = 0
    storage_time: int | None = None
    limit_delete: object = 0


class MarkCondition(msgspec.Struct):
    """Blocks aged from ``from_time`` to ``to_time`` (0: no bound) get ``mark`` (``""``, ``"a"``...)."""

    mark: str = ""
    from_time: int | None = None
    to_time: int | None = None


class BlockMark(Marking):
    """``block_mark`` (archive): blocks move to marks by age, ``limit_update_block`` per pass."""

    wait_update_mark: object = 0
    conditions: list[MarkCondition] | None = None
    limit_update_block: int | None = None


class CopyUnique(Waiting):
    """``copy_unique`` (copy): ``queue_names`` are [source, destination]; the save modes are 0-4."""

    src_save_mode: int = SaveMode.DEFAULT
    dst_save_mode: int = SaveMode.DEFAULT
    subscribe_name: str | None = None
    cnt_limit: int | None = None
    do_save_dst: object = True
    segments: shapes.Segments | None = None


Original = TypeVar("Original", RegularlySave, BlockUnload, BlockDelete, BlockMark, CopyUnique)
Capella = TypeVar("Capella", bound=Params)
T = TypeVar("T")


class HandlerBody(msgspec.Struct):
    """A handler as the original sends it (``new_*_handler.json``); its params decode by type
    (``Typed``), once the type is known."""

    name: str
    type: str = ""
    user_name: str = ""
    queue_names: list[str] = []
    params: dict[str, object] = {}


class Typed(msgspec.Struct, Generic[Original]):
    """The params of a ``HandlerBody`` as its type's struct (null or none: every default)."""

    params: Original | None = None


class Description(msgspec.Struct):
    """A handler as ``gd_h`` shows it (only shown, never decoded): a translated type's params
    in the original's struct, any other type's as Capella shows them."""

    name: str
    user_name: str
    type: str
    queue_names: list[str]
    params: object


def _seconds(value: int | None, key: str, positive: bool = True) -> float | None:
    if value is None or (value == 0 and not positive):
        return None
    if value < 0 or (positive and value == 0):
        raise InvalidRequest(f"{key}: {value!r} should be a duration in nanoseconds > 0", field=key)
    return value / NS


def _save_name(number: int) -> str:
    return shapes.save_mode(number).name.lower()


def _or_default(kind: type[Params], name: str, value: T | None) -> T:
    """``value``, or the default of ``kind``'s field ``name`` when it is None (not given)."""
    if value is not None:
        return value
    default: T = next(f.default for f in msgspec.structs.fields(kind) if f.name == name)
    return default


# --- one pair of translations per type: the original's params to Capella's, and back -------


def _flush_in(p: RegularlySave, queues: list[str]) -> wire.FlushDefinition:
    interval = _or_default(FlushParams, "interval", _seconds(p.interval, "interval"))
    return wire.FlushDefinition(queues=queues, params=FlushParams(interval=interval))


def _flush_out(params: FlushParams, queues: list[str]) -> tuple[list[str], RegularlySave]:
    return queues, RegularlySave(interval=_ns(params.interval))


def _unload_in(p: BlockUnload, queues: list[str]) -> wire.UnloadDefinition:
    params = UnloadParams(
        interval=_or_default(UnloadParams, "interval", _seconds(p.interval, "interval")),
        age=_seconds(p.storage_memory_time, "storage_memory_time", positive=False),
        idle=_seconds(p.storage_last_load_time, "storage_last_load_time", positive=False),
    )
    return wire.UnloadDefinition(queues=queues, params=params)


def _unload_out(params: UnloadParams, queues: list[str]) -> tuple[list[str], BlockUnload]:
    return queues, BlockUnload(
        interval=_ns(params.interval),
        storage_memory_time=_ns(params.age),
        storage_last_load_time=_ns(params.idle),
    )


def _expire_in(p: BlockDelete, queues: list[str]) -> wire.ExpireDefinition:
    params = ExpireParams(
        interval=_or_default(ExpireParams, "interval", _seconds(p.interval, "interval")),
        max_age=_seconds(p.storage_time, "storage_time"),
    )
    return wire.ExpireDefinition(queues=queues, params=params)


def _expire_out(params: ExpireParams, queues: list[str]) -> tuple[list[str], BlockDelete]:
    return queues, BlockDelete(interval=_ns(params.interval), storage_time=_ns(params.max_age))


def _archive_in(p: BlockMark, queues: list[str]) -> wire.ArchiveDefinition:
    conditions = [
        ArchiveCondition(
            mark=shapes.mark_number(c.mark),
            from_age=_seconds(c.from_time, "from_time", positive=False) or 0,
            to_age=_seconds(c.to_time, "to_time", positive=False),
        )
        for c in p.conditions or []
    ]
    params = ArchiveParams(
        conditions=conditions,
        interval=_or_default(ArchiveParams, "interval", _seconds(p.interval, "interval")),
        limit=_or_default(ArchiveParams, "limit", p.limit_update_block or None),
    )
    return wire.ArchiveDefinition(queues=queues, params=params)


def _archive_out(params: ArchiveParams, queues: list[str]) -> tuple[list[str], BlockMark]:
    conditions = [
        MarkCondition(mark=shapes.mark_name(c.mark), from_time=_ns(c.from_age), to_time=_ns(c.to_age))
        for c in params.conditions
    ]
    return queues, BlockMark(
        interval=_ns(params.interval), conditions=conditions, limit_update_block=params.limit
    )


def _copy_in(p: CopyUnique, queues: list[str]) -> wire.CopyDefinition:
    if len(queues) != 2:
        raise InvalidRequest("copy_unique: queue_names must be [source, destination]", field="queue_names")
    ranges = None if p.segments is None else p.segments.s
    params = CopyParams(
        from_=queues[0],
        to=queues[1],
        subscription=p.subscribe_name or "",
        interval=_or_default(CopyParams, "interval", _seconds(p.interval, "interval", positive=False)),
        # Not wait: that is the original's request timeout, and as Capella's long poll it
        # would hold h_stop (which lets a pass end) past the tool's own deadline.
        batch=_or_default(CopyParams, "batch", p.cnt_limit or None),
        segments=None if ranges is None else [(r.from_, r.to) for r in ranges],
        save=_save_name(p.dst_save_mode),
        commit_save=_save_name(p.src_save_mode),
    )
    return wire.CopyDefinition(params=params)


def _copy_out(params: CopyParams, queues: list[str]) -> tuple[list[str], CopyUnique]:
    segments = params.segments
    return [params.from_ or (queues[0] if queues else ""), params.to], CopyUnique(
        interval=_ns(params.interval),
        src_save_mode=int(SaveMode.parse(params.commit_save)),
        dst_save_mode=int(SaveMode.parse(params.save)),
        subscribe_name=params.subscription,
        cnt_limit=params.batch,
        segments=None if segments is None else shapes.Segments([shapes.Range(a, b) for a, b in segments]),
    )


@dataclass(frozen=True, slots=True)
class _Translation(Generic[Original, Capella]):
    """One of the original's handler types as a Capella type."""

    original: str
    capella: str
    # The original's params struct, and Capella's.
    shape: type[Original]
    params: type[Capella]
    # The original's params and queue names → Capella's definition.
    to_capella: Callable[[Original, list[str]], wire.Definition]
    # Capella's params and queues → the original's queue names and params.
    to_original: Callable[[Capella, list[str]], tuple[list[str], Original]]


TRANSLATIONS: tuple[_Translation[Any, Any], ...] = (
    _Translation("regularly_save", "flush", RegularlySave, FlushParams, _flush_in, _flush_out),
    _Translation("block_unload", "unload", BlockUnload, UnloadParams, _unload_in, _unload_out),
    _Translation("block_delete", "expire", BlockDelete, ExpireParams, _expire_in, _expire_out),
    _Translation("block_mark", "archive", BlockMark, ArchiveParams, _archive_in, _archive_out),
    _Translation("copy_unique", "copy", CopyUnique, CopyParams, _copy_in, _copy_out),
)
_BY_ORIGINAL = {t.original: t for t in TRANSLATIONS}
_BY_CAPELLA = {t.capella: t for t in TRANSLATIONS}


def capella_definition(body: HandlerBody, request: Request) -> wire.Definition:
    """The definition ``PUT /v1/handlers/{name}`` takes for the original's handler ``body``
    (decoded from ``request``, whose params are decoded again by their type)."""
    translation = _BY_ORIGINAL.get(body.type)
    if translation is None:
        raise InvalidRequest(
            f"handler type {body.type!r}: Capella takes {', '.join(_BY_ORIGINAL)}",
            field="type",
        )
    # Decoded again as the type's params, so a bad one is named by its path in the body.
    kind = Typed[translation.shape]  # type: ignore[name-defined]  # a type argument known only at run time
    typed = shapes.decode(request.body, kind, request.action)
    params = translation.shape() if typed.params is None else typed.params
    return translation.to_capella(params, body.queue_names)


def _ns(seconds: float | None) -> int:
    return 0 if seconds is None else round(seconds * NS)


def original_definition(state: HandlerState) -> Description:
    """A Capella handler in the original's ``gd_h`` shape; other types keep Capella's params."""
    translation = _BY_CAPELLA.get(state.type)
    queues, params = state.queues, state.params
    if translation is not None and isinstance(params, dict):
        # A stored definition that no longer builds keeps its params as they were stored.
        try:
            params = decode_params(translation.params, state.shown_params())
        except InvalidRequest:
            translation = None
    if translation is None:
        return Description(state.name, state.user or "", state.type, queues, state.shown_params())
    queues, shown = translation.to_original(params, queues)
    return Description(state.name, state.user or "", translation.original, queues, shown)


async def add_h(ctx: Context, request: Request) -> object:
    body = shapes.decode(request.body, HandlerBody, request.action)
    ctx.same_as("PUT", HANDLER_PATH, name=body.name)
    if any(s.name == body.name for s in ctx.supervisor.handlers()):
        raise AlreadyExists(f"handler `{body.name}` already exists")
    definition = capella_definition(body, request)
    # The original adds a handler stopped (h_start starts it, wire/041-042).
    definition.started = False
    if body.user_name:
        definition.user = body.user_name
    # Put as /v1 puts a body, which the supervisor decodes and checks as it checks any other.
    await ctx.supervisor.put(body.name, msgspec.to_builtins(definition), ctx.identity)
    return None


async def drop_h(ctx: Context, request: Request) -> object:
    name = body_name(request)
    ctx.same_as("DELETE", HANDLER_PATH, name=name)
    await ctx.supervisor.drop(name, ctx.identity)
    return None


async def gd_h(ctx: Context, request: Request) -> object:
    name = body_name(request)
    ctx.same_as("GET", HANDLER_PATH, name=name)
    return original_definition(ctx.supervisor.handler(name))


async def list_h(ctx: Context, request: Request) -> object:
    return [s.name for s in ctx.supervisor.handlers() if ctx.identity.can("handler", "read", s.name)]


async def h_start(ctx: Context, request: Request) -> object:
    ctx.same_as("POST", HANDLER_START_PATH, name=request.object_name)
    await ctx.supervisor.start_handler(request.object_name, ctx.identity)
    return None


async def h_stop(ctx: Context, request: Request) -> object:
    # Unlike the original's, the loop ends here: a running pass finishes, nothing runs after.
    ctx.same_as("POST", HANDLER_STOP_PATH, name=request.object_name)
    await ctx.supervisor.stop_handler(request.object_name, ctx.identity)
    return None


async def h_is_started(ctx: Context, request: Request) -> object:
    ctx.same_as("GET", HANDLER_PATH, name=request.object_name)
    return ctx.supervisor.handler(request.object_name).started


async def h_last_error(ctx: Context, request: Request) -> object:
    """The last pass's error as the call's own error, which is what ``cap h_last_error`` prints."""
    ctx.same_as("GET", HANDLER_PATH, name=request.object_name)
    state = ctx.supervisor.handler(request.object_name)
    error = state.last_error
    if error is None:
        return None
    who = f'[user:"{state.user or ""}"] '
    raise Failure(
        LAST_ERROR,
        f"{who}{state.type} handler {state.name}: the pass at {shapes.rfc3339(error.time)} failed",
        # The numeric code stays the original's; Capella's own code goes in the inner error's
        # ``iet`` (its type, which the original's shape already has room for).
        inner=Failure(codes.PASS_CODES.get(error.code, PASS_FAILED), f"{who}{error.message}", iet=error.code),
    )


async def h_last_complete(ctx: Context, request: Request) -> object:
    ctx.same_as("GET", HANDLER_PATH, name=request.object_name)
    return shapes.rfc3339(ctx.supervisor.handler(request.object_name).last_complete)


ACTIONS: dict[str, Action] = {
    "add_h": add_h,
    "drop_h": drop_h,
    "gd_h": gd_h,
    "list_h": list_h,
    "h_start": h_start,
    "h_stop": h_stop,
    "h_is_started": h_is_started,
    "h_last_error": h_last_error,
    "h_last_complete": h_last_complete,
}
