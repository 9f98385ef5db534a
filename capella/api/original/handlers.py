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
from typing import Any

import msgspec

from capella.api.original import codes, shapes
from capella.api.original.actions import Action, Context, body_name
from capella.api.original.envelope import Failure, Request
from capella.api.route import HANDLER_PATH, HANDLER_START_PATH, HANDLER_STOP_PATH
from capella.core.message import SaveMode
from capella.errors import AlreadyExists, InvalidRequest

NS = shapes.NS
# The error codes of the original's h_last_error: a handler that failed, and why (Capella
# keeps the text and code of a pass's error, not its class: a permission error gets the
# original's inner code, codes.PASS_CODES; any other a code of Capella's own).
LAST_ERROR = 10117400
PASS_FAILED = 10990009


class Definition(msgspec.Struct):
    """A handler as the original sends it (``new_*_handler.json``)."""

    name: str
    type: str = ""
    user_name: str = ""
    queue_names: list[str] = []
    params: dict[str, Any] = {}


def _seconds(params: dict[str, Any], key: str, positive: bool = True) -> float | None:
    value = params.get(key)
    if value is None or (value == 0 and not positive):
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or (positive and value == 0):
        raise InvalidRequest(f"{key}: {value!r} should be a duration in nanoseconds > 0", field=key)
    return value / NS


def _save_name(number: object, key: str) -> str:
    if isinstance(number, bool) or not isinstance(number, int):
        raise InvalidRequest(f"{key} must be a save mode 0-4", field=key)
    return shapes.save_mode(number).name.lower()


# --- one pair of translations per type: the original's params to Capella's, and back -------


def _flush_in(p: dict[str, Any], queues: list[str]) -> dict[str, Any]:
    return {"queues": queues, "params": {"interval": _seconds(p, "interval")}}


def _flush_out(params: dict[str, Any], queues: list[str]) -> tuple[list[str], dict[str, Any]]:
    return queues, {"interval": _ns(params["interval"]), "wait": 0}


def _unload_in(p: dict[str, Any], queues: list[str]) -> dict[str, Any]:
    params = {
        "interval": _seconds(p, "interval"),
        "age": _seconds(p, "storage_memory_time", positive=False),
        "idle": _seconds(p, "storage_last_load_time", positive=False),
    }
    return {"queues": queues, "params": params}


def _unload_out(params: dict[str, Any], queues: list[str]) -> tuple[list[str], dict[str, Any]]:
    return queues, {
        "interval": _ns(params["interval"]),
        "wait": 0,
        "storage_memory_time": _ns(params["age"]),
        "storage_last_load_time": _ns(params["idle"]),
    }


def _expire_in(p: dict[str, Any], queues: list[str]) -> dict[str, Any]:
    params = {"interval": _seconds(p, "interval"), "max_age": _seconds(p, "storage_time")}
    return {"queues": queues, "params": params}


def _expire_out(params: dict[str, Any], queues: list[str]) -> tuple[list[str], dict[str, Any]]:
    return queues, {
        "interval": _ns(params["interval"]),
        "wait_mark": 0,
        "wait_delete": 0,
        "storage_time": _ns(params["max_age"]),
        "limit_delete": 0,
    }


def _archive_in(p: dict[str, Any], queues: list[str]) -> dict[str, Any]:
    conditions = []
    for i, c in enumerate(p.get("conditions") or []):
        if not isinstance(c, dict):
            raise InvalidRequest(f"conditions[{i}] must be an object", field="conditions")
        conditions.append(
            {
                "mark": shapes.mark_number(str(c.get("mark", ""))),
                "from_age": _seconds(c, "from_time", positive=False) or 0,
                "to_age": _seconds(c, "to_time", positive=False),
            }
        )
    params = {
        "interval": _seconds(p, "interval"),
        "conditions": conditions,
        "limit": p.get("limit_update_block") or None,
    }
    return {"queues": queues, "params": params}


def _archive_out(params: dict[str, Any], queues: list[str]) -> tuple[list[str], dict[str, Any]]:
    conditions = [
        {"mark": shapes.mark_name(c["mark"]), "from_time": _ns(c["from_age"]), "to_time": _ns(c["to_age"])}
        for c in params["conditions"]
    ]
    return queues, {
        "interval": _ns(params["interval"]),
        "wait_mark": 0,
        "wait_update_mark": 0,
        "conditions": conditions,
        "limit_update_block": params["limit"],
    }


def _copy_in(p: dict[str, Any], queues: list[str]) -> dict[str, Any]:
    if len(queues) != 2:
        raise InvalidRequest("copy_unique: queue_names must be [source, destination]", field="queue_names")
    ranges = (p.get("segments") or {}).get("s")
    params = {
        "from": queues[0],
        "to": queues[1],
        "subscription": p.get("subscribe_name") or None,
        "interval": _seconds(p, "interval", positive=False),
        # Not wait: that is the original's request timeout, and as Capella's long poll it
        # would hold h_stop (which lets a pass end) past the tool's own deadline.
        "batch": p.get("cnt_limit") or None,
        "segments": None if ranges is None else [[r.get("from", 0), r.get("to", 0)] for r in ranges],
        "save": _save_name(p.get("dst_save_mode", SaveMode.DEFAULT), "dst_save_mode"),
        "commit_save": _save_name(p.get("src_save_mode", SaveMode.DEFAULT), "src_save_mode"),
    }
    return {"params": params}


def _copy_out(params: dict[str, Any], queues: list[str]) -> tuple[list[str], dict[str, Any]]:
    segments = params["segments"]
    return [params["from"] or (queues[0] if queues else ""), params["to"]], {
        "interval": _ns(params["interval"]),
        "wait": 0,
        "src_save_mode": int(SaveMode[params["commit_save"].upper()]),
        "dst_save_mode": int(SaveMode[params["save"].upper()]),
        "subscribe_name": params["subscription"],
        "cnt_limit": params["batch"],
        "do_save_dst": True,
        "segments": None if segments is None else {"s": [{"from": a, "to": b} for a, b in segments]},
    }


@dataclass(frozen=True, slots=True)
class _Translation:
    """One of the original's handler types as a Capella type."""

    original: str
    capella: str
    # The original's params and queue names → the PUT body's ``queues``/``params``.
    to_capella: Callable[[dict[str, Any], list[str]], dict[str, Any]]
    # Capella's params and queues → the original's queue names and params.
    to_original: Callable[[dict[str, Any], list[str]], tuple[list[str], dict[str, Any]]]


TRANSLATIONS = (
    _Translation("regularly_save", "flush", _flush_in, _flush_out),
    _Translation("block_unload", "unload", _unload_in, _unload_out),
    _Translation("block_delete", "expire", _expire_in, _expire_out),
    _Translation("block_mark", "archive", _archive_in, _archive_out),
    _Translation("copy_unique", "copy", _copy_in, _copy_out),
)
_BY_ORIGINAL = {t.original: t for t in TRANSLATIONS}
_BY_CAPELLA = {t.capella: t for t in TRANSLATIONS}


def capella_definition(body: Definition) -> dict[str, Any]:
    """The body of ``PUT /v1/handlers/{name}`` for the original's handler."""
    translation = _BY_ORIGINAL.get(body.type)
    if translation is None:
        raise InvalidRequest(
            f"handler type {body.type!r}: Capella takes {', '.join(_BY_ORIGINAL)}",
            field="type",
        )
    return {"type": translation.capella, **translation.to_capella(body.params, body.queue_names)}


def _ns(seconds: float | None) -> int:
    return 0 if seconds is None else round(seconds * NS)


def original_definition(
    name: str, kind: str, queues: list[str], params: dict[str, Any], user: str | None
) -> dict[str, Any]:
    """A Capella handler in the original's ``gd_h`` shape; other types keep Capella's params."""
    translation = _BY_CAPELLA.get(kind)
    if translation is None:
        shown_type, shown_params = kind, params
    else:
        shown_type = translation.original
        queues, shown_params = translation.to_original(params, queues)
    return {
        "name": name,
        "user_name": user or "",
        "type": shown_type,
        "queue_names": queues,
        "params": shown_params,
    }


async def add_h(ctx: Context, request: Request) -> object:
    body = shapes.decode(request.body, Definition, request.action)
    ctx.same_as("PUT", HANDLER_PATH, name=body.name)
    if any(s.name == body.name for s in ctx.supervisor.handlers()):
        raise AlreadyExists(f"handler `{body.name}` already exists")
    data = capella_definition(body)
    # The original adds a handler stopped (h_start starts it, wire/041-042).
    data["started"] = False
    if body.user_name:
        data["user"] = body.user_name
    await ctx.supervisor.put(body.name, data, ctx.identity)
    return None


async def drop_h(ctx: Context, request: Request) -> object:
    name = body_name(request)
    ctx.same_as("DELETE", HANDLER_PATH, name=name)
    await ctx.supervisor.drop(name, ctx.identity)
    return None


async def gd_h(ctx: Context, request: Request) -> object:
    name = body_name(request)
    ctx.same_as("GET", HANDLER_PATH, name=name)
    state = ctx.supervisor.handler(name)
    return original_definition(name, state.type, state.queues, state.shown_params(), state.user)


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
