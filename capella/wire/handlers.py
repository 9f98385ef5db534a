"""Handlers on the wire: the types' names and a definition with its type's params.

Each family's params and status are in a module of their own: ``params`` (what they share),
``upkeep`` (flush, unload, archive, expire), ``copy``, ``push``, ``postgres``; a handler's
answer (its status and last pass) is in ``handler_status``.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, get_args

import msgspec
from msgspec import UNSET, Meta, UnsetType

from capella.errors import InvalidRequest
from capella.wire.copy import CopyParams
from capella.wire.decode import Finding, whole_numbers
from capella.wire.fields import USER_NAME_PATTERN, decode_hook
from capella.wire.params import Params, given, params_error, plain
from capella.wire.postgres import PgInboxParams, PgOutboxParams
from capella.wire.push import PushParams
from capella.wire.struct import Struct
from capella.wire.upkeep import ArchiveParams, ExpireParams, FlushParams, UnloadParams

# The handler types, written once: each is the module capella.handlers.<type> (its registry
# entry, HANDLER, says what the type is); the API, the document, the CLI and the client read
# the names from here.
HandlerType = Literal["flush", "unload", "archive", "expire", "copy", "push", "pg_outbox", "pg_inbox"]
HANDLER_TYPES: tuple[str, ...] = get_args(HandlerType)


QueueName = Annotated[str, Meta(min_length=1)]


class Definition(Struct, forbid_unknown_fields=True, tag_field="type"):
    """What every handler definition holds besides its type's params (``HandlerDefinition``)."""

    __schema_base__: ClassVar[bool] = True

    queues: (
        Annotated[
            list[QueueName],
            Meta(
                min_length=1,
                description="queue names or fnmatch patterns (orders, logs-*); a plain name must name an "
                "existing queue, a pattern may match none yet",
            ),
        ]
        | None
    ) = None
    queue: Annotated[str, Meta(min_length=1, description="shorthand for one queue")] | None = None
    started: bool = True
    # Left out: who defines it; null: no user (as with authentication off).
    user: (
        Annotated[
            str,
            Meta(
                description=(
                    "the user it runs as (default: who defines it; another user needs user admin "
                    "on it and everything it holds)"
                ),
                extra_json_schema={"pattern": USER_NAME_PATTERN},
            ),
        ]
        | UnsetType
        | None
    ) = UNSET
    # Each type's own params struct (FlushParams for flush, and so on).
    params: Params | None = None

    @property
    def kind(self) -> str:
        """The handler type (the tag ``type``)."""
        return str(self.__struct_config__.tag)

    def named_queues(self) -> list[str] | None:
        """``queues``, or the one ``queue``; None when it names none."""
        if self.queues is not None:
            return self.queues
        return None if self.queue is None else [self.queue]


def _given_rule(name: str) -> dict[str, Any]:
    """A schema rule: ``name`` is given, and not null."""
    return {"required": [name], "properties": {name: {"not": {"type": "null"}}}}


# The document's rules for a definition, as the server reads it: a handler names its queues
# (queues or queue) unless its type names them in params, and a type whose params have a
# required field (copy's to, push's url, a pg handler's dsn) needs params.
_NAMES_QUEUES: dict[str, Any] = {"anyOf": [_given_rule("queues"), _given_rule("queue")]}
_NEEDS_PARAMS: dict[str, Any] = _given_rule("params")
# A type that names its one queue in params takes neither queues nor queue (null is not given).
_NO_QUEUES: dict[str, Any] = {"properties": {"queues": {"type": "null"}, "queue": {"type": "null"}}}


class FlushDefinition(Definition, tag="flush"):
    """A flush handler."""

    __schema_extra__: ClassVar[dict[str, Any]] = _NAMES_QUEUES

    params: FlushParams | None = None


class UnloadDefinition(Definition, tag="unload"):
    """An unload handler."""

    __schema_extra__: ClassVar[dict[str, Any]] = _NAMES_QUEUES

    params: UnloadParams | None = None


class ArchiveDefinition(Definition, tag="archive"):
    """An archive handler."""

    __schema_extra__: ClassVar[dict[str, Any]] = {"allOf": [_NEEDS_PARAMS, _NAMES_QUEUES]}

    params: ArchiveParams | None = None


class ExpireDefinition(Definition, tag="expire"):
    """An expire handler."""

    __schema_extra__: ClassVar[dict[str, Any]] = {"allOf": [_NEEDS_PARAMS, _NAMES_QUEUES]}

    params: ExpireParams | None = None


class CopyDefinition(Definition, tag="copy"):
    """A copy handler: queues (or queue) is required unless params.from names the source."""

    __schema_extra__: ClassVar[dict[str, Any]] = {
        "allOf": [
            _NEEDS_PARAMS,
            {
                "anyOf": [
                    _given_rule("queues"),
                    _given_rule("queue"),
                    {
                        "properties": {
                            "params": {
                                "required": ["from"],
                                "properties": {"from": {"type": "string", "minLength": 1}},
                            }
                        }
                    },
                ]
            },
        ]
    }

    params: CopyParams | None = None


class PushDefinition(Definition, tag="push"):
    """A push handler: one queue."""

    __schema_extra__: ClassVar[dict[str, Any]] = {"allOf": [_NEEDS_PARAMS, _NAMES_QUEUES]}

    params: PushParams | None = None


class PgOutboxDefinition(Definition, tag="pg_outbox"):
    """A pg_outbox handler: its queue is params.to (no queues)."""

    __schema_extra__: ClassVar[dict[str, Any]] = {"allOf": [_NEEDS_PARAMS, _NO_QUEUES]}

    params: PgOutboxParams | None = None


class PgInboxDefinition(Definition, tag="pg_inbox"):
    """A pg_inbox handler."""

    __schema_extra__: ClassVar[dict[str, Any]] = {"allOf": [_NEEDS_PARAMS, _NAMES_QUEUES]}

    params: PgInboxParams | None = None


# A handler's definition, by type: what PUT /v1/handlers/{name} takes.
HandlerDefinition = (
    FlushDefinition
    | UnloadDefinition
    | ArchiveDefinition
    | ExpireDefinition
    | CopyDefinition
    | PushDefinition
    | PgOutboxDefinition
    | PgInboxDefinition
)
DEFINITIONS: dict[str, type[Definition]] = {
    str(kind.__struct_config__.tag): kind for kind in get_args(HandlerDefinition)
}


def params_type(kind: type[Definition]) -> type[Params]:
    """The params struct of a definition type (its ``params`` field, without the None)."""
    (found,) = (f for f in msgspec.structs.fields(kind) if f.name == "params")
    params: type[Params] = next(t for t in get_args(found.type) if t is not type(None))
    return params


def decode_definition(data: object) -> Definition:
    """A handler definition as its type's ``Definition``; errors name the field.

    The params are read as ``decode_params`` reads them (null is the default, replaced and
    shown-only params are refused by name).
    """
    if not isinstance(data, dict):
        raise InvalidRequest("a handler definition must be a JSON object")
    kind = DEFINITIONS.get(data["type"]) if isinstance(data.get("type"), str) else None
    if kind is not None and data.get("params") is not None:
        data = {**data, "params": given(params_type(kind), data["params"])}
    try:
        definition: Definition = msgspec.convert(whole_numbers(data), HandlerDefinition, dec_hook=decode_hook)
    except msgspec.ValidationError as exc:
        raise _definition_error(exc) from None
    plain(definition)
    return definition


def _definition_error(error: msgspec.ValidationError) -> InvalidRequest:
    found = Finding.of(error)
    if found.path == "params" or found.path.startswith("params."):
        inner = found.path.removeprefix("params")
        return params_error(f"{found.problem} - at `${inner}{found.rest}`")
    if found.where == "type" or "type" in (found.unknown, found.missing):
        return InvalidRequest(
            f"type is required, one of: {', '.join(sorted(HANDLER_TYPES))}"
            if found.missing is not None
            else f"type: unknown handler type {found.problem.removeprefix('Invalid value ')} "
            f"(known: {', '.join(sorted(HANDLER_TYPES))})",
            field="type",
        )
    if found.unknown is not None:
        return InvalidRequest(f"unknown field {found.unknown!r}", field=found.unknown)
    if not found.located:
        return InvalidRequest("a handler definition must be a JSON object")
    # The top-level field: queues[1] is a bad entry of queues.
    where = found.path.split(".")[0]
    problem = found.problem
    return InvalidRequest(f"{found.where}: {problem[:1].lower()}{problem[1:]}", field=where)
