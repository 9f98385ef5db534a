"""The PostgreSQL handlers on the wire (pg_outbox, pg_inbox): the connection, their params and statuses."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from msgspec import Meta

from capella.errors import InvalidRequest
from capella.wire.fields import INT64_MAX, Interval, NameOrDefault, Time, exactly_one, schema
from capella.wire.params import Params, SaveModeName, SecretName, Segments, check_segments
from capella.wire.struct import Struct

# Lower-case identifiers only, optionally schema-qualified: what PostgreSQL folds an unquoted
# name to, so the name in the params, in the DDL and in to_regclass is the same table.
TABLE_PATTERN = r"^[a-z_][a-z0-9_]{0,62}(?:\.[a-z_][a-z0-9_]{0,62})?$"
Table = Annotated[str, Meta(pattern=TABLE_PATTERN)]


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
        check_segments(self.segments)


DUPLICATES = "repeats that dedup absorbed"


class PgOutboxStatus(Struct):
    """What a pg_outbox handler adds to the status: the table as last counted."""

    lag: Annotated[
        int | None,
        schema(
            minimum=0, description="rows waiting in the table as last counted (null before the first count)"
        ),
    ]
    lag_observed: Annotated[
        Time | None, Meta(description="when the table was last counted (at the end of each pass)")
    ]
    oldest_age: Annotated[float | None, Meta(description="seconds since the oldest waiting row's created_at")]
    source: Annotated[str | None, Meta(description="the identity source of the rows")]
    duplicates: Annotated[int, schema(minimum=0, description=DUPLICATES)]


class PgInboxStatus(Struct):
    """What a pg_inbox handler adds to the status: messages past the cursors, read when asked."""

    lag: Annotated[
        int, schema(minimum=0, description="messages the queues hold past the cursors, read when asked")
    ]
    lag_by_queue: Annotated[dict[str, int], Meta(description="lag by queue")]
    duplicates: Annotated[int, schema(minimum=0, description=DUPLICATES)]
