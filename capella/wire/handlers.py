"""Handlers on the wire: a definition with its type's params, and the handler's status."""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Literal, TypeVar, get_args

import msgspec
from msgspec import UNSET, Meta, UnsetType, field

from capella.errors import InvalidRequest
from capella.wire.decode import whole_numbers
from capella.wire.fields import (
    INT64_MAX,
    MAX_REQUEST_SECONDS,
    NAME,
    URL_EXCLUDED,
    USER_NAME_PATTERN,
    Bytes,
    Int64,
    Interval,
    IntervalOrZero,
    NameOrDefault,
    PositiveSeconds,
    RequestSeconds,
    RetryInterval,
    SaveModeText,
    Seconds,
    Time,
    decode_hook,
    exactly_one,
    schema,
)
from capella.wire.struct import Struct

# The handler types, written once: each is the module capella.handlers.<type> (its registry
# entry, HANDLER, says what the type is); the API, the document, the CLI and the client read
# the names from here.
HandlerType = Literal["flush", "unload", "archive", "expire", "copy", "push", "pg_outbox", "pg_inbox"]
HANDLER_TYPES: tuple[str, ...] = get_args(HandlerType)


class Params(Struct, forbid_unknown_fields=True):
    """What every type's params share: how a definition's ``params`` object decodes into them.

    ``decode_params`` is the one way in; ``null`` for a field means its default. A subclass
    checks its cross-field rules in ``__post_init__`` (raising ``InvalidRequest`` that names
    the field), and lists the params it no longer takes in ``replaced`` (old → new).
    """

    __schema_base__: ClassVar[bool] = True
    replaced: ClassVar[dict[str, str]] = {}
    # Fields the answers show and a definition may not give (the server fills them in).
    shown_only: ClassVar[tuple[str, ...]] = ()


P = TypeVar("P", bound=Params)


def decode_params(kind: type[P], raw: object) -> P:
    """``raw`` (a definition's ``params``: an object, or null for none) as ``kind``.

    Every error is ``InvalidRequest`` naming the field as ``params.<path>``.
    """
    try:
        params = msgspec.convert(whole_numbers(_given(kind, raw)), kind, dec_hook=decode_hook)
    except msgspec.ValidationError as exc:
        raise _params_error(str(exc)) from None
    _plain(params)
    return params


def _given(kind: type[Params], raw: object) -> dict[str, Any]:
    """``raw`` to decode as ``kind``: an object without nulls (null is the default)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise InvalidRequest("params must be an object", field="params")
    for old, new in kind.replaced.items():
        if old in raw:
            raise InvalidRequest(
                f"params.{old} is no longer accepted: a definition may not name the server's "
                f"environment variables. Ask the operator to declare the secret "
                f'([secrets.NAME] env = "VAR" in the configuration) and give params.{new} = "NAME"',
                field=f"params.{old}",
            )
    for name in kind.shown_only:
        if name in raw:
            raise InvalidRequest(f"params.{name}: unknown parameter", field=f"params.{name}")
    return {name: value for name, value in raw.items() if value is not None}


def _plain(struct: msgspec.Struct) -> None:
    """Durations and sizes as plain numbers, as msgspec renders them (``Seconds`` → float)."""
    for name in struct.__struct_fields__:
        value = getattr(struct, name)
        if isinstance(value, float) and type(value) is not float:
            setattr(struct, name, float(value))
        elif isinstance(value, int) and type(value) not in (int, bool):
            setattr(struct, name, int(value))
        elif isinstance(value, msgspec.Struct):
            _plain(value)
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, msgspec.Struct):
                    _plain(item)


_PROBLEM = re.compile(r"^(.*?)(?: - at `\$(.*)`)?$", re.DOTALL)
_NAMED = re.compile(r"(unknown|missing required) field `(.*)`")


def _params_error(text: str) -> InvalidRequest:
    """A msgspec finding at ``$.x[0].y`` as ``InvalidRequest`` naming ``params.x[0].y``."""
    problem, path = _PROBLEM.match(text).groups()  # type: ignore[union-attr]  # the pattern always matches
    where = f"params{path or ''}"
    if named := _NAMED.search(problem):
        where = f"{where}.{named.group(2)}"
        problem = "unknown parameter" if named.group(1) == "unknown" else "required"
    return InvalidRequest(f"{where}: {problem[:1].lower()}{problem[1:]}", field=where)


Batch = Annotated[int, Meta(ge=1, le=INT64_MAX)]
# Inclusive [lo, hi] pairs; none: every segment.
# Segments are 64-bit, as a message's segment is (a larger pair was schema-valid and refused).
Segments = Annotated[list[tuple[Int64, Int64]], Meta(min_length=1)]
# As [secrets.NAME] in the configuration allows.
SecretName = Annotated[str, Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")]
# Lower-case identifiers only, optionally schema-qualified: what PostgreSQL folds an unquoted
# name to, so the name in the params, in the DDL and in to_regclass is the same table.
TABLE_PATTERN = r"^[a-z_][a-z0-9_]{0,62}(?:\.[a-z_][a-z0-9_]{0,62})?$"
Table = Annotated[str, Meta(pattern=TABLE_PATTERN)]


def _check_segments(segments: list[tuple[int, int]] | None) -> None:
    for lo, hi in segments or ():
        if lo > hi:
            raise InvalidRequest(
                f"params.segments: {[lo, hi]!r} is not a [lo, hi] pair", field="params.segments"
            )


class FlushParams(Params):
    """Flush the queues' open blocks every interval."""

    interval: Interval = 1.0


class UnloadParams(Params):
    """with neither idle nor age, idle is 60 s"""

    interval: Interval = 10.0
    idle: Annotated[PositiveSeconds, Meta(description="unload blocks not read for this long")] | None = None
    age: Annotated[PositiveSeconds, Meta(description="unload blocks older than this")] | None = None

    def __post_init__(self) -> None:
        if self.idle is None and self.age is None:
            self.idle = 60.0


class ArchiveCondition(Struct, forbid_unknown_fields=True):
    """Blocks whose age is in [from_age, to_age) move to mark."""

    mark: Annotated[int, Meta(ge=0, le=255, description="a mark the queue maps to a mount")]
    from_age: Seconds = 0.0
    to_age: Annotated[PositiveSeconds | None, Meta(description="null: no upper bound")] = None

    def holds(self, age: float) -> bool:
        return self.from_age <= age and (self.to_age is None or age < self.to_age)


class ArchiveParams(Params):
    """Move blocks between tiers by age."""

    conditions: Annotated[list[ArchiveCondition], Meta(min_length=1)]
    interval: Interval = 60.0
    limit: Annotated[int, Meta(ge=1, le=INT64_MAX, description="blocks moved per pass")] = 100

    def __post_init__(self) -> None:
        for i, c in enumerate(self.conditions):
            if c.to_age is not None and c.to_age <= c.from_age:
                where = f"params.conditions[{i}].to_age"
                raise InvalidRequest(f"{where} must be greater than from_age", field=where)


class ExpireParams(Params):
    """at least one of max_age, max_bytes and max_messages"""

    # Given and not null, as the server reads them.
    __schema_extra__: ClassVar[dict[str, Any]] = {
        "anyOf": [
            {"required": [name], "properties": {name: {"not": {"type": "null"}}}}
            for name in ("max_age", "max_bytes", "max_messages")
        ]
    }

    interval: Interval = 60.0
    max_age: PositiveSeconds | None = None
    max_bytes: Bytes | None = None
    max_messages: Annotated[int, Meta(ge=1, le=INT64_MAX)] | None = None

    def __post_init__(self) -> None:
        if self.max_age is None and self.max_bytes is None and self.max_messages is None:
            raise InvalidRequest("params: give max_age, max_bytes or max_messages", field="params.max_age")


# A save mode by name or number, read by the handler's build (an unknown one is
# invalid_save_mode, as everywhere); answers show the name.
SaveModeName = (
    Annotated[str, schema(enum=list(get_args(SaveModeText)))] | Annotated[int, schema(minimum=0, maximum=4)]
)
# A queue, or cluster/queue for one on an external cluster.
QueueRef = Annotated[str, Meta(pattern=f"^(?:{NAME}/)?{NAME}$")]


class CopyParams(Params):
    """Copy messages from queues (or another cluster) into a queue, once each."""

    to: Annotated[QueueRef, Meta(description="the destination queue, or cluster/queue")]
    from_: (
        Annotated[QueueRef, Meta(description="the source queue when the definition names no queues")] | None
    ) = field(default=None, name="from")
    subscription: Annotated[
        NameOrDefault, Meta(description='the cursor on each source ("" or not given: copy-to-<to>)')
    ] = ""
    interval: Annotated[
        IntervalOrZero,
        Meta(description="pause between passes (default 0: continuous, long-polling for wait)"),
    ] = 0.0
    batch: Batch = 1000
    wait: Annotated[IntervalOrZero, Meta(description="long-poll when caught up (default 2 s; 0: none)")] = 2.0
    segments: Segments | None = None
    save: SaveModeName = "wait"
    # A lost cursor commit only sends a batch again, which dedup absorbs: no need to wait.
    commit_save: SaveModeName = "mark"

    def __post_init__(self) -> None:
        self.subscription = self.subscription or f"copy-to-{self.to.replace('/', '.')}"
        _check_segments(self.segments)

    def clusters(self) -> list[str]:
        """The external clusters it reads from or writes to (``cluster/queue``)."""
        return sorted({ref.partition("/")[0] for ref in (self.from_, self.to) if ref and "/" in ref})


# What one push handler may hold, so a definition cannot make the broker buffer without bound
# (docs/push.md): messages in flight (concurrency x batch), and the seconds one request may
# keep a connection and its batch (a receiver that needs longer should answer 202 and work on).
MAX_IN_FLIGHT = 10_000
MAX_TIMEOUT = MAX_REQUEST_SECONDS
_HEADER_NAME = re.compile(r"[!#$&'*+.^_`|~0-9A-Za-z-]+")
# Set by the push handler itself: a params header of these names would be overwritten or unsafe.
RESERVED_HEADERS = (
    "authorization",
    "idempotency-key",
    "content-length",
    "host",
    "transfer-encoding",
    "user-agent",
)


def reserved_header(name: str) -> bool:
    """Whether a push header is one the handler sets itself."""
    return name.lower() in RESERVED_HEADERS or name.lower().startswith("capella-")


def _any_case(word: str) -> str:
    return "".join(f"[{c.upper()}{c}]" if c.isalpha() else c for c in word)  # "-" only, literal


# The same as a pattern (ECMA-262 has no flag for case): a reserved name, or capella-*.
RESERVED_HEADER_PATTERN = f"^(({'|'.join(map(_any_case, RESERVED_HEADERS))})$|{_any_case('capella-')})"


NOT_RESERVED = {"not": {"pattern": RESERVED_HEADER_PATTERN}}

URL_PATTERN = rf"^https?://[^{URL_EXCLUDED}/?#@]+([/?#][^{URL_EXCLUDED}]*)?$"


class PushParams(Params):
    """POST the queue's messages to url through an ack-mode subscription (see docs/push.md).

    Credentials never appear in the params: ``secret`` (the HMAC signing secret), ``token`` (a
    bearer token) and ``basic`` (``user:password``) name secrets the operator declared in
    ``[secrets.NAME]``; the old ``*_env`` forms named variables of the server's environment,
    which let any definer read any of them. The retry fields are those of an ack-mode
    subscription's policy.
    """

    replaced: ClassVar[dict[str, str]] = {"secret_env": "secret", "token_env": "token", "basic_env": "basic"}

    # No user info (the pattern has no @ before the path): the URL is shown and logged, so
    # credentials come from the token or basic secret.
    url: Annotated[
        str, Meta(pattern=URL_PATTERN, description="the receiver (no user:password@: use token or basic)")
    ]
    subscription: Annotated[
        str, Meta(description="the ack-mode subscription it keeps (default push-<handler>)")
    ] = ""
    batch: Annotated[
        int,
        Meta(
            ge=1,
            le=10_000,
            description="1 (default): the body is the payload; more: a JSON array of messages",
        ),
    ] = 1
    ordering: Annotated[
        Literal["unordered", "by_segment", "ordered"],
        Meta(description="ordered: one request at a time, in id order; by_segment: in order per segment"),
    ] = "unordered"
    concurrency: Annotated[int, Meta(ge=1, le=1000, description="requests in flight (default 4)")] = 4
    timeout: Annotated[RequestSeconds, Meta(description="per request (default 10 s, at most 60 s)")] = 10.0
    wait: Annotated[IntervalOrZero, Meta(description="long-poll when caught up (default 2 s; 0: none)")] = 2.0
    headers: Annotated[
        dict[
            Annotated[
                str,
                schema(pattern=f"^{_HEADER_NAME.pattern}$", **{"not": {"pattern": RESERVED_HEADER_PATTERN}}),
            ],
            Annotated[str, schema(pattern="^[^\r\n\x00]*$")],
        ],
        Meta(
            description="extra request headers: HTTP token names, values without CR, LF or NUL; not "
            f"{', '.join(RESERVED_HEADERS)} or capella-*, which the handler sets"
        ),
    ] = {}
    segments: Segments | None = None
    max_attempts: (
        Annotated[int, schema(minimum=0, maximum=1_000_000, description="0: no limit (default 5)")] | None
    ) = None
    backoff: Literal["fixed", "exponential"] | None = None
    delay: Annotated[RetryInterval, Meta(description="the first retry's delay (default 1 s)")] | None = None
    max_delay: Annotated[RetryInterval, Meta(description="the longest delay (default 5 min)")] | None = None
    jitter: Annotated[float, schema(minimum=0, maximum=1)] | None = None
    dead_letter: Annotated[str, Meta(description="the queue that gets what used up its attempts")] | None = (
        None
    )
    secret: (
        Annotated[
            SecretName, Meta(description="a declared secret ([secrets.NAME]): the HMAC-SHA256 signing secret")
        ]
        | None
    ) = None
    token: Annotated[SecretName, Meta(description="a declared secret holding a bearer token")] | None = None
    basic: (
        Annotated[SecretName, Meta(description="a declared secret holding user:password for Basic")] | None
    ) = None

    def __post_init__(self) -> None:
        if self.ordering == "ordered":
            self.concurrency = 1
        if self.concurrency * self.batch > MAX_IN_FLIGHT:
            raise InvalidRequest(
                f"params.concurrency x params.batch must be at most {MAX_IN_FLIGHT} messages in flight, "
                f"not {self.concurrency * self.batch}",
                field="params.batch",
            )
        if self.timeout > MAX_TIMEOUT:
            raise InvalidRequest(
                f"params.timeout must be at most {MAX_TIMEOUT:g} seconds", field="params.timeout"
            )
        if self.token and self.basic:
            raise InvalidRequest("give token or basic, not both", field="params.basic")
        for name, text in self.headers.items():
            if not _HEADER_NAME.fullmatch(name) or any(c in text for c in "\r\n\0"):
                raise InvalidRequest(
                    f"params.headers: {name!r} is not a valid header", field="params.headers"
                )
            if reserved_header(name):
                raise InvalidRequest(
                    f"params.headers: {name} is set by the handler "
                    "(credentials: params.token or params.basic)",
                    field="params.headers",
                )
        _check_segments(self.segments)


# What a pg handler's dsn may be (handlers/postgres.py checks it): one named host (IPv4 or a
# name here; an IPv6 address in brackets is taken too), a user, and only the allowed
# query parameters; a password needs the server's key file.
_DSN_WORD = r"[A-Za-z0-9._~-]"
_DSN_PORT = r"(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[0-9]{1,4})"
_DSN_QUERY = (
    r"(sslmode=(disable|allow|prefer|require|verify-ca|verify-full)"
    rf"|(sslrootcert|sslcert|sslkey)=[A-Za-z0-9._~/-]*|password={_DSN_WORD}*)"
)
DSN_PATTERN = (
    rf"^postgres(ql)?://{_DSN_WORD}+(:{_DSN_WORD}*)?@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*(:{_DSN_PORT})?"
    rf"(/{_DSN_WORD}*)?(\?{_DSN_QUERY}(&{_DSN_QUERY})*)?$"
)


class PgConnection(Params):
    """Where a pg_* handler connects, and with which secrets (docs/postgres.md): exactly one of
    dsn and dsn_secret"""

    replaced: ClassVar[dict[str, str]] = {"dsn_env": "dsn_secret"}
    shown_only: ClassVar[tuple[str, ...]] = ("password",)

    __schema_extra__: ClassVar[dict[str, Any]] = exactly_one("dsn", "dsn_secret")

    dsn: (
        Annotated[
            str,
            Meta(
                description="postgresql://user:password@host:port/database?sslmode=...; only host, "
                "port, dbname, user, sslmode, sslrootcert (and, for admins, sslcert and sslkey); the "
                "password is stored encrypted, bound to the handler and DSN, and never shown",
                extra_json_schema={"pattern": DSN_PATTERN},
            ),
        ]
        | None
    ) = None
    dsn_secret: (
        Annotated[SecretName, Meta(description="a declared secret ([secrets.NAME]) holding the whole DSN")]
        | None
    ) = None
    password_secret: (
        Annotated[SecretName, Meta(description="a declared secret holding the password (the DSN has none)")]
        | None
    ) = None
    sslpassword_secret: (
        Annotated[SecretName, Meta(description="a declared secret holding the client key's passphrase")]
        | None
    ) = None
    # Shown, never taken: the server fills it in from where the password is.
    password: (
        Annotated[
            str,
            schema(
                readOnly=True,
                description='where the password is: "stored encrypted" or "secret:NAME" (answers only)',
            ),
        ]
        | None
    ) = None

    def __post_init__(self) -> None:
        if (self.dsn is None) == (self.dsn_secret is None):
            raise InvalidRequest("params: give exactly one of dsn and dsn_secret", field="params.dsn")


class PgOutboxParams(PgConnection, kw_only=True):
    """Relay committed rows of a PostgreSQL outbox table into a queue (docs/postgres.md)."""

    to: Annotated[str, Meta(min_length=1, description="the destination queue")]
    table: Annotated[Table, Meta(description="the outbox table (default capella_outbox)")] = "capella_outbox"
    source: (
        Annotated[str, Meta(min_length=1, description="the identity source (default pg:<database>.<table>)")]
        | None
    ) = None
    batch: Annotated[int, Meta(ge=1, le=INT64_MAX, description="rows per relay step (default 1000)")] = 1000
    save: SaveModeName = "wait"
    delete: Annotated[
        bool, Meta(description="delete relayed rows (default); false sets relayed_at instead")
    ] = True
    interval: Annotated[
        Interval, Meta(description="pause between passes (default 1 s; a NOTIFY wakes it)")
    ] = 1.0


class PgInboxParams(PgConnection):
    """Copy a queue into a PostgreSQL inbox table, once each (docs/postgres.md)."""

    table: Annotated[Table, Meta(description="the inbox table (default capella_inbox)")] = "capella_inbox"
    subscription: Annotated[
        NameOrDefault, Meta(description='the cursor on each queue ("" or not given: pg_inbox-<table>)')
    ] = ""
    batch: Annotated[int, Meta(ge=1, le=INT64_MAX, description="messages per insert (default 1000)")] = 1000
    segments: Segments | None = None
    interval: Annotated[
        Interval, Meta(description="pause between passes (default 1 s; a message wakes it)")
    ] = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        self.subscription = self.subscription or f"pg_inbox-{self.table}"
        _check_segments(self.segments)


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
        data = {**data, "params": _given(params_type(kind), data["params"])}
    try:
        definition: Definition = msgspec.convert(whole_numbers(data), HandlerDefinition, dec_hook=decode_hook)
    except msgspec.ValidationError as exc:
        raise _definition_error(str(exc)) from None
    _plain(definition)
    return definition


def _definition_error(text: str) -> InvalidRequest:
    problem, path = _PROBLEM.match(text).groups()  # type: ignore[union-attr]  # the pattern always matches
    path = path or ""
    if path.startswith(".params"):
        return _params_error(f"{problem} - at `${path.removeprefix('.params')}`")
    if path == ".type" or "field `type`" in problem:
        return InvalidRequest(
            f"type is required, one of: {', '.join(sorted(HANDLER_TYPES))}"
            if "missing" in problem
            else f"type: unknown handler type {problem.removeprefix('Invalid value ')} "
            f"(known: {', '.join(sorted(HANDLER_TYPES))})",
            field="type",
        )
    if (named := _NAMED.search(problem)) and named.group(1) == "unknown":
        return InvalidRequest(f"unknown field {named.group(2)!r}", field=named.group(2))
    if not path:
        return InvalidRequest("a handler definition must be a JSON object")
    # The top-level field: queues[1] is a bad entry of queues.
    where = re.split(r"[.\[]", path.lstrip("."), maxsplit=1)[0]
    return InvalidRequest(f"{path.lstrip('.')}: {problem[:1].lower()}{problem[1:]}", field=where)


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


class DeliveryError(Struct):
    """push: the last failed request, with the receiver's status (null without an answer)."""

    message: str
    status: int | None
    time: Time


class CopyStatus(Struct):
    """What a copy handler adds to the status: messages each source holds past the cursor.

    A local source's lag is read from the queue and the cursor when asked; a remote source's
    is the last one seen, with the time it was seen (``lag_observed``).
    """

    lag: int
    lag_by_queue: dict[str, int]
    lag_observed: Time | UnsetType | None = UNSET


class PushStatus(Struct):
    """What a push handler adds to the status: its deliveries."""

    delivered: int
    failed: int
    dead: int
    in_flight: int
    retrying: int
    lag: int
    last_delivery_error: DeliveryError | None


class PgOutboxStatus(Struct):
    """What a pg_outbox handler adds to the status: the table as last counted."""

    source: str | None
    lag: int | None
    lag_observed: Time | None
    oldest_age: float | None
    duplicates: int


class PgInboxStatus(Struct):
    """What a pg_inbox handler adds to the status: messages past the cursors, read when asked."""

    lag: int
    lag_by_queue: dict[str, int]
    duplicates: int


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
