"""A handler's answer: its status (counters, last error, what its type adds) and its last pass."""

from __future__ import annotations

from typing import Annotated, Any

from msgspec import UNSET, Meta, UnsetType, field

from capella.wire.fields import Time, schema
from capella.wire.handlers import HandlerType
from capella.wire.push import DeliveryError
from capella.wire.struct import Struct


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


class HandlerStatus(Struct):
    """A handler's passes: counters, the last good pass, the last error, the next run."""

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
    lag: (
        Annotated[
            int | None,
            schema(
                minimum=0,
                description="copy, pg_inbox: messages the queues hold past the cursors, read when asked "
                "(copy from another cluster: as last seen, see lag_observed); pg_outbox: rows waiting "
                "in the table as last counted (null before the first count); push: not delivered yet",
            ),
        ]
        | UnsetType
    ) = UNSET
    lag_by_queue: Annotated[dict[str, int], Meta(description="copy, pg_inbox: lag by queue")] | UnsetType = (
        UNSET
    )
    lag_observed: (
        Annotated[
            Time | None,
            Meta(
                description="copy from another cluster: when its lag was last seen (the last pass that "
                "reached it); pg_outbox: when the table was last counted (at the end of each pass). "
                "Absent where lag is read from the queue and the cursor at the moment of asking"
            ),
        ]
        | UnsetType
    ) = UNSET
    oldest_age: (
        Annotated[
            float | None, Meta(description="pg_outbox: seconds since the oldest waiting row's created_at")
        ]
        | UnsetType
    ) = UNSET
    source: (
        Annotated[str | None, Meta(description="pg_outbox: the identity source of the rows")] | UnsetType
    ) = UNSET
    duplicates: (
        Annotated[int, schema(minimum=0, description="pg_outbox, pg_inbox: repeats that dedup absorbed")]
        | UnsetType
    ) = UNSET
    delivered: (
        Annotated[int, schema(minimum=0, description="push: messages acked by the receiver")] | UnsetType
    ) = UNSET
    failed: Annotated[int, schema(minimum=0, description="push: failed attempts")] | UnsetType = UNSET
    dead: (
        Annotated[int, schema(minimum=0, description="push: messages that used up their attempts")]
        | UnsetType
    ) = UNSET
    in_flight: Annotated[int, schema(minimum=0, description="push: messages in requests now")] | UnsetType = (
        UNSET
    )
    retrying: (
        Annotated[int, schema(minimum=0, description="push: failed messages waiting for a retry")] | UnsetType
    ) = UNSET
    last_delivery_error: DeliveryError | UnsetType | None = UNSET


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
