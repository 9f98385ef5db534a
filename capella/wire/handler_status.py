"""A handler's answer: its status (counters, last error, what its type adds) and its last pass."""

from __future__ import annotations

from types import UnionType
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, TypeVar, Union, get_args, get_origin

import msgspec
from msgspec import UNSET, Meta, UnsetType, field

from capella.wire.copy import CopyStatus
from capella.wire.fields import Time, schema
from capella.wire.handlers import HandlerType
from capella.wire.postgres import PgInboxStatus, PgOutboxStatus
from capella.wire.push import PushStatus
from capella.wire.struct import Struct

T = TypeVar("T", bound=msgspec.Struct)
if TYPE_CHECKING:  # not at run time: a union of structs in a wire module is a schema of the document
    Added = CopyStatus | PgOutboxStatus | PgInboxStatus | PushStatus


class HandlerError(Struct):
    """The last failure of a pass."""

    message: str
    time: Time
    # A default, so an answer from a server that predates the field still decodes.
    code: Annotated[
        str,
        Meta(
            description="the error's stable code, as in error answers (unreachable, forbidden...); "
            "internal for an unexpected failure"
        ),
    ] = "internal"


class PassStatus(Struct):
    """What every handler's status holds: counters, the last good pass, the last error, the next run.

    ``HandlerStatus`` adds the fields of the handler's type (``part`` reads them back as its
    status struct).
    """

    __schema_base__: ClassVar[bool] = True

    running: Annotated[bool, Meta(description="a pass is in progress")]
    runs: Annotated[int, schema(minimum=0, description="passes completed")]
    items: Annotated[int, schema(minimum=0, description="blocks or messages handled")]
    bytes: Annotated[int, schema(minimum=0, description="bytes handled")]
    last_complete: Annotated[Time | None, Meta(description="end of the last good pass (= last_success)")]
    last_error: HandlerError | None
    next_run: Annotated[Time | None, Meta(description="null when stopped")]
    last_success: Annotated[Time | None, Meta(description="end of the last successful pass")] = None
    last_run: Annotated[Time | None, Meta(description="end of the last pass, successful or not")] = None
    failing_since: Annotated[
        Time | None,
        Meta(description="the first failure of the current streak of failed passes; null after a success"),
    ] = None
    cannot_run: Annotated[
        str | None,
        Meta(
            description="why no pass can run now: its user does not exist (yet) or is disabled, or "
            "whoever defined it no longer holds everything the user holds; null when it can"
        ),
    ] = None

    def part(self, kind: type[T]) -> T | None:
        """The fields a type adds, as its status struct (``PushStatus``...); None when this
        status does not hold them all."""
        values = {name: getattr(self, name, UNSET) for name in kind.__struct_fields__}
        required = kind.__struct_fields__[: len(kind.__struct_fields__) - len(kind.__struct_defaults__)]
        if any(values[name] is UNSET for name in required):
            return None
        return kind(**values)

    def added(self, kind: str) -> Added | None:
        """What a handler of type ``kind`` added, as its status struct; None for a type that
        adds nothing."""
        status = ADDED.get(kind)
        return None if status is None else self.part(status)


# The handler types whose handlers add to the status, each with its status struct: each
# field is declared there once, and the flat status takes it from there.
ADDED: dict[str, type[CopyStatus | PgOutboxStatus | PgInboxStatus | PushStatus]] = {
    "copy": CopyStatus,
    "pg_outbox": PgOutboxStatus,
    "pg_inbox": PgInboxStatus,
    "push": PushStatus,
}


def _added_fields() -> list[tuple[str, Any, Any]]:
    """The fields of every type's status struct, each once, left out (UNSET) where a handler's
    type has none: its types joined, its description saying which type means what."""
    found: dict[str, list[tuple[str, Any]]] = {}
    for kind, status in ADDED.items():
        for f in msgspec.structs.fields(status):
            found.setdefault(f.name, []).append((kind, f.type))
    return [(name, _joined(uses), UNSET) for name, uses in found.items()]


def _joined(uses: list[tuple[str, Any]]) -> Any:
    """One field's type in every status struct that has it, as one optional type."""
    types: list[Any] = []
    extra: dict[str, Any] = {}
    said: dict[str, list[str]] = {}
    for kind, annotation in uses:
        for option in get_args(annotation) if get_origin(annotation) in (Union, UnionType) else (annotation,):
            if option is UnsetType:
                continue
            if get_origin(option) is Annotated:
                bare, *metas = get_args(option)
                for meta in metas:
                    words = meta.description or (meta.extra_json_schema or {}).get("description")
                    if words:
                        said.setdefault(words, []).append(kind)
                    extra |= {k: v for k, v in (meta.extra_json_schema or {}).items() if k != "description"}
                option = bare
            options = get_args(option) if get_origin(option) in (Union, UnionType) else (option,)
            types += [o for o in options if o not in types]
    joined: Any = Union[tuple(types)]  # noqa: UP007  # built from a list
    if said:
        description = "; ".join(f"{', '.join(kinds)}: {words}" for words, kinds in said.items())
        joined = Annotated[joined, Meta(description=description, extra_json_schema=extra or None)]
    return Union[joined, UnsetType]  # noqa: UP007


if TYPE_CHECKING:

    class HandlerStatus(PassStatus):
        """The fields its type adds are read through ``part``."""

else:
    HandlerStatus = msgspec.defstruct(
        "HandlerStatus", _added_fields(), bases=(PassStatus,), module=__name__, repr_omit_defaults=True
    )
    HandlerStatus.__doc__ = (
        "A handler's passes: counters, the last good pass, the last error, the next run; and what "
        "its type adds (copy, pg_outbox, pg_inbox, push: each field absent for the other types)."
    )


class PassResult(Struct):
    """One pass of a handler: what it did and how it ended."""

    ok: bool
    items: Annotated[int, schema(minimum=0, description="blocks or messages handled in this pass")]
    bytes: Annotated[int, schema(minimum=0, description="bytes handled in this pass")]
    error: Annotated[str | None, Meta(description="why the pass failed; null when ok")]
    started: Time
    finished: Time


class HandlerInfo(Struct):
    """A handler as defined (params fully resolved; durations in seconds) with its status."""

    name: str
    type: HandlerType
    queues: list[str]
    params: dict[str, Any]
    started: bool
    user: Annotated[str | None, Meta(description="the user it runs as; null with auth off")]
    status: HandlerStatus
    pass_: (
        Annotated[PassResult, Meta(description="only in the answer to run: the pass it ran")] | UnsetType
    ) = field(default=UNSET, name="pass")


class HandlerList(Struct):
    """Every handler the caller may read."""

    handlers: list[HandlerInfo]
