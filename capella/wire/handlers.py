"""Handlers on the wire: a definition with its type's params, and the handler's status."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, get_args

import msgspec
from msgspec import UNSET, Meta, UnsetType, field

from capella.wire.fields import (
    Duration,
    Name,
    PositiveDuration,
    SaveModeText,
    Size,
    Time,
    exactly_one,
    schema,
)
from capella.wire.struct import Struct

# The handler types, written once: each is the module capella.handlers.<type> (its registry
# entry, HANDLER, says what the type is); the API, the document, the CLI and the client read
# the names from here.
HandlerType = Literal["flush", "unload", "archive", "expire", "copy", "push", "pg_outbox", "pg_inbox"]
HANDLER_TYPES: tuple[str, ...] = get_args(HandlerType)
# Handler durations also take integers of nanoseconds (>= 1e12), as the original API did.
HandlerDuration = PositiveDuration


def params_schema(kind: str) -> str:
    """The name of a handler type's params schema: ``pg_outbox`` → ``PgOutboxParams``."""
    return "".join(part.capitalize() for part in kind.split("_")) + "Params"


def _needs_params(kind: str) -> bool:
    """Whether a type's params struct refuses an empty object: a field without a default, or a
    rule that one of some fields is given (read once every params struct exists)."""
    params = globals()[params_schema(kind)]
    rules = getattr(params, "__schema_extra__", {})
    return any(f.required for f in msgspec.structs.fields(params)) or "anyOf" in rules or "oneOf" in rules


def _params_by_type(kinds: tuple[str, ...]) -> dict[str, Any]:
    kind, *rest = kinds
    then: dict[str, Any] = {"properties": {"params": {"$ref": f"#/components/schemas/{params_schema(kind)}"}}}
    if _needs_params(kind):
        then["required"] = ["params"]  # its params have a required field (copy's to, push's url)
    branch: dict[str, Any] = {
        "if": {"required": ["type"], "properties": {"type": {"const": kind}}},
        "then": then,
    }
    if rest:
        branch["else"] = _params_by_type(tuple(rest))
    return branch


class HandlerDefinition(Struct, forbid_unknown_fields=True):
    """queues (or its shorthand queue) is required, except for pg_outbox (params.to) and copy
    (params.from); params depend on type"""

    # The params of one type: a oneOf over all of them would refuse {"interval": 5}, which is
    # valid flush, unload and expire params alike. One chain of if/then/else, not an allOf of
    # ifs: request generators (schemathesis) give up on an allOf of seven.
    # Which queues: queues or queue, unless the type names its own (pg_outbox's params.to, or
    # copy's params.from).
    # Set below, once the params structs it names exist.
    __schema_extra__: ClassVar[dict[str, Any]]

    type: HandlerType
    queues: (
        Annotated[
            list[Annotated[str, schema(minLength=1)]],
            schema(
                minItems=1,
                description="queue names or fnmatch patterns (orders, logs-*); a plain name must name an "
                "existing queue, a pattern may match none yet",
            ),
        ]
        | UnsetType
    ) = UNSET
    queue: Annotated[str, schema(minLength=1, description="shorthand for one queue")] | UnsetType = UNSET
    params: (
        Annotated[dict[str, Any], Meta(description="by type: FlushParams for flush, and so on")] | None
    ) = None
    started: bool = True
    user: (
        Annotated[
            str,
            Meta(description="the user it runs as (default: who defines it; another user needs user admin)"),
        ]
        | None
    ) = None


class FlushParams(Struct, forbid_unknown_fields=True):
    """Flush the queues' open blocks every interval."""

    interval: HandlerDuration | None = None


class UnloadParams(Struct, forbid_unknown_fields=True):
    """with neither idle nor age, idle is 60 s"""

    interval: HandlerDuration | None = None
    idle: Annotated[HandlerDuration, Meta(description="unload blocks not read for this long")] | None = None
    age: Annotated[HandlerDuration, Meta(description="unload blocks older than this")] | None = None


class ArchiveCondition(Struct, forbid_unknown_fields=True):
    """Blocks whose age is in [from_age, to_age) move to mark."""

    mark: Annotated[int, schema(minimum=0, maximum=255, description="a mark the queue maps to a mount")]
    from_age: Annotated[Duration, Meta(description="default 0")] | None = None
    to_age: Annotated[Duration | None, Meta(description="null: no upper bound")] = None


class ArchiveParams(Struct, forbid_unknown_fields=True):
    """Move blocks between tiers by age."""

    conditions: Annotated[list[ArchiveCondition], schema(minItems=1)]
    interval: HandlerDuration | None = None
    limit: Annotated[int, schema(minimum=1, description="blocks moved per pass")] | None = None


class ExpireParams(Struct, forbid_unknown_fields=True):
    """at least one of max_age, max_bytes and max_messages"""

    # Given and not null, as the server reads them.
    __schema_extra__: ClassVar[dict[str, Any]] = {
        "anyOf": [
            {"required": [name], "properties": {name: {"not": {"type": "null"}}}}
            for name in ("max_age", "max_bytes", "max_messages")
        ]
    }

    interval: HandlerDuration | None = None
    max_age: HandlerDuration | None = None
    max_bytes: Size | None = None
    max_messages: Annotated[int, schema(minimum=1)] | None = None


class CopyParams(Struct, forbid_unknown_fields=True):
    """Copy messages from queues (or another cluster) into a queue, once each."""

    to: Annotated[str, Meta(min_length=1, description="the destination queue (local)")]
    from_: Annotated[str, Meta(description="the source queue when the definition names no queues")] | None = (
        field(default=None, name="from")
    )
    subscription: (
        Annotated[Name, Meta(description="the cursor on each source (default copy-to-<to>)")] | None
    ) = None
    interval: (
        Annotated[HandlerDuration, Meta(description="pause between passes (default 0: continuous)")] | None
    ) = None
    batch: Annotated[int, schema(minimum=1)] | None = None
    wait: Annotated[HandlerDuration, Meta(description="long-poll when caught up (default 2 s)")] | None = None
    segments: list[Annotated[list[int], schema(minItems=2, maxItems=2)]] | None = None
    save: SaveModeText | None = None
    commit_save: SaveModeText | None = None


class PushParams(Struct, forbid_unknown_fields=True):
    """POST the queue's messages to url through an ack-mode subscription (see docs/push.md)."""

    url: Annotated[str, schema(pattern=r"^https?://[^\s/?#@]+([/?#]\S*)?$", description="the receiver")]
    subscription: (
        Annotated[str, Meta(description="the ack-mode subscription it keeps (default push-<handler>)")] | None
    ) = None
    batch: (
        Annotated[
            int,
            schema(
                minimum=1,
                maximum=10_000,
                description="1 (default): the body is the payload; more: a JSON array of messages",
            ),
        ]
        | None
    ) = None
    ordering: (
        Annotated[
            Literal["unordered", "by_segment", "ordered"],
            Meta(description="ordered: one request at a time, in id order; by_segment: in order per segment"),
        ]
        | None
    ) = None
    concurrency: (
        Annotated[int, schema(minimum=1, maximum=1000, description="requests in flight (default 4)")] | None
    ) = None
    timeout: Annotated[HandlerDuration, Meta(description="per request (default 10 s)")] | None = None
    wait: Annotated[Duration, Meta(description="long-poll when caught up (default 2 s)")] | None = None
    headers: Annotated[dict[str, str], Meta(description="extra request headers")] | None = None
    segments: list[Annotated[list[int], schema(minItems=2, maxItems=2)]] | None = None
    max_attempts: (
        Annotated[int, schema(minimum=0, maximum=1_000_000, description="0: no limit (default 5)")] | None
    ) = None
    backoff: Literal["fixed", "exponential"] | None = None
    delay: Annotated[Duration, Meta(description="the first retry's delay (default 1 s)")] | None = None
    max_delay: Annotated[Duration, Meta(description="the longest delay (default 5 min)")] | None = None
    jitter: Annotated[float, schema(minimum=0, maximum=1)] | None = None
    dead_letter: Annotated[str, Meta(description="the queue that gets what used up its attempts")] | None = (
        None
    )
    secret: (
        Annotated[str, Meta(description="a declared secret ([secrets.NAME]): the HMAC-SHA256 signing secret")]
        | None
    ) = None
    token: Annotated[str, Meta(description="a declared secret holding a bearer token")] | None = None
    basic: Annotated[str, Meta(description="a declared secret holding user:password for Basic")] | None = None


class PgConnection(Struct, forbid_unknown_fields=True):
    """Where a pg_* handler connects, and with which secrets (docs/postgres.md)."""

    __schema_extra__: ClassVar[dict[str, Any]] = exactly_one("dsn", "dsn_secret")

    dsn: (
        Annotated[
            str,
            Meta(
                description="postgresql://user:password@host:port/database?sslmode=...; only host, "
                "port, dbname, user, sslmode, sslrootcert (and, for admins, sslcert and sslkey); the "
                "password is stored encrypted, bound to the handler and DSN, and never shown"
            ),
        ]
        | None
    ) = None
    dsn_secret: (
        Annotated[str, Meta(description="a declared secret ([secrets.NAME]) holding the whole DSN")] | None
    ) = None
    password_secret: (
        Annotated[str, Meta(description="a declared secret holding the password (the DSN has none)")] | None
    ) = None
    sslpassword_secret: (
        Annotated[str, Meta(description="a declared secret holding the client key's passphrase")] | None
    ) = None


class PgOutboxParams(PgConnection, kw_only=True):
    """Relay committed rows of a PostgreSQL outbox table into a queue (docs/postgres.md)."""

    to: Annotated[str, Meta(min_length=1, description="the destination queue")]
    table: Annotated[str, Meta(description="the outbox table (default capella_outbox)")] | None = None
    source: Annotated[str, Meta(description="the identity source (default pg:<database>.<table>)")] | None = (
        None
    )
    batch: Annotated[int, schema(minimum=1, description="rows per relay step (default 1000)")] | None = None
    save: SaveModeText | None = None
    delete: (
        Annotated[bool, Meta(description="delete relayed rows (default); false sets relayed_at instead")]
        | None
    ) = None
    interval: (
        Annotated[HandlerDuration, Meta(description="pause between passes (default 1 s; a NOTIFY wakes it)")]
        | None
    ) = None


class PgInboxParams(PgConnection):
    """Copy a queue into a PostgreSQL inbox table, once each (docs/postgres.md)."""

    table: Annotated[str, Meta(description="the inbox table (default capella_inbox)")] | None = None
    subscription: (
        Annotated[Name, Meta(description="the cursor on each queue (default pg_inbox-<table>)")] | None
    ) = None
    batch: Annotated[int, schema(minimum=1, description="messages per insert (default 1000)")] | None = None
    segments: list[Annotated[list[int], schema(minItems=2, maxItems=2)]] | None = None
    interval: (
        Annotated[HandlerDuration, Meta(description="pause between passes (default 1 s; a message wakes it)")]
        | None
    ) = None


class HandlerError(Struct):
    """The last failure of a pass."""

    message: str
    time: Time


class DeliveryError(Struct):
    """push: the last failed request, with the receiver's status (null without an answer)."""

    message: str
    status: int | None
    time: Time


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


HandlerDefinition.__schema_extra__ = {
    "allOf": [
        _params_by_type(HANDLER_TYPES),
        {
            "anyOf": [
                {"required": ["queues"]},
                {"required": ["queue"]},
                {"required": ["type"], "properties": {"type": {"const": "pg_outbox"}}},
                {
                    "required": ["type", "params"],
                    "properties": {
                        "type": {"const": "copy"},
                        "params": {
                            "type": "object",
                            "required": ["from"],
                            "properties": {"from": {"type": "string", "minLength": 1}},
                        },
                    },
                },
            ]
        },
    ]
}
