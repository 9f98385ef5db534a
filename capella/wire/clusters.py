"""External clusters on the wire: a definition with its credentials, and how it is shown."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from msgspec import UNSET, Meta, UnsetType

from capella.config import DECLARED_NAME
from capella.wire.answers import ErrorDetail
from capella.wire.fields import URL_EXCLUDED, duration_at_most, schema
from capella.wire.struct import Struct

CREDENTIALS = ("password", "password_secret", "token", "token_secret")
Compression = Literal["none", "gzip", "zstd"]
Secret = Annotated[str, schema(minLength=1, writeOnly=True)]
# The name of a declared secret ([secrets.NAME]).
SECRET_NAME = DECLARED_NAME
SecretName = Annotated[str, schema(pattern=f"^{SECRET_NAME}$")]


# A cluster's connect and request timeouts: more than 0 and at most a day, in text too.
MAX_TIMEOUT = 86_400.0
# (The server also reads an integer from 10**12 as the original's nanoseconds, but not the same
# number written 1e12 or 1000000000000.0: JSON Schema cannot tell the two apart, so the document
# states seconds only.)
Timeout = (
    Annotated[float, schema(exclusiveMinimum=0, maximum=MAX_TIMEOUT)]
    | Annotated[str, schema(pattern=duration_at_most(MAX_TIMEOUT, positive=True))]
)


# An external cluster's URL: no credentials in it, no blank or control character anywhere.
CLUSTER_URL_PATTERN = rf"^https?://[^{URL_EXCLUDED}/@]+(/[^{URL_EXCLUDED}]*)?$"


class ClusterDefinition(Struct, forbid_unknown_fields=True):
    """at most one of password, password_secret, token and token_secret; a password (stored or
    from a declared secret) needs a username"""

    __schema_extra__: ClassVar[dict[str, Any]] = {
        "not": {
            "anyOf": [{"required": [a, b]} for i, a in enumerate(CREDENTIALS) for b in CREDENTIALS[i + 1 :]]
        },
        # A password (not null) needs a username (not null), as the server reads them.
        "allOf": [
            {
                "if": {"required": [name], "properties": {name: {"type": "string"}}},
                "then": {"required": ["username"], "properties": {"username": {"type": "string"}}},
            }
            for name in ("password", "password_secret")
        ],
    }

    url: Annotated[str, schema(pattern=CLUSTER_URL_PATTERN)]
    username: Annotated[str, schema(minLength=1)] | None = None
    password: (
        Annotated[Secret, Meta(description="stored encrypted with the server's key; never shown again")]
        | None
    ) = None
    password_secret: (
        Annotated[SecretName, Meta(description="a declared secret ([secrets.NAME]) the definer may use")]
        | None
    ) = None
    token: (
        Annotated[Secret, Meta(description="a bearer token, stored encrypted; never shown again")] | None
    ) = None
    token_secret: (
        Annotated[SecretName, Meta(description="a declared secret ([secrets.NAME]) the definer may use")]
        | None
    ) = None
    verify_tls: bool = True
    ca_file: Annotated[str, Meta(description="a PEM file on the server that exists")] | None = None
    # Left out for the default; null is refused, as the server has always read it.
    connect_timeout: Annotated[Timeout, Meta(description="default 5 s; at most a day")] | UnsetType = UNSET
    timeout: Annotated[Timeout, Meta(description="per request; default 30 s; at most a day")] | UnsetType = (
        UNSET
    )
    compression: Annotated[
        Compression, Meta(description="Content-Encoding of request bodies of 1 KiB or more")
    ] = "none"


class ClusterCredentials(Struct):
    """Which credentials a cluster uses and where they come from; never the secret."""

    kind: Literal["password", "token"]
    username: str | None
    source: Annotated[str, Meta(description="secret:<NAME> or stored encrypted")]


class ClusterTls(Struct):
    """How the connection to an external cluster checks its certificate."""

    verify: bool
    ca_file: str | None


class ClusterTimeouts(Struct):
    """A cluster's timeouts in seconds."""

    connect: float
    request: float


class ClusterInfo(Struct):
    """a cluster as shown: never its password or token"""

    name: str
    url: str
    credentials: ClusterCredentials | None
    tls: ClusterTls
    timeouts: ClusterTimeouts
    compression: Compression
    error: (
        Annotated[
            str, Meta(description="why the cluster cannot be used (its stored credentials do not decrypt)")
        ]
        | None
    ) = None
    name_check: (
        Annotated[NameCheck, Meta(description="only in the answer to PUT: the far side's name, as checked")]
        | UnsetType
    ) = UNSET


class NameCheck(Struct):
    """Adding a cluster asks it its name (a same-named one is refused with 409)."""

    checked: Annotated[
        bool, Meta(description="false: it could not be asked now (see error), or is too old to say")
    ]
    cluster: Annotated[str | None, Meta(description="the far side's cluster name")]
    error: ErrorDetail | None


class ClusterList(Struct):
    """Every cluster the caller may read."""

    clusters: list[ClusterInfo]


# kw_only lets the fields keep the order the server writes them in.
class ClusterPing(Struct, omit_defaults=True, kw_only=True):
    """Whether the other cluster answers, is ready and takes the credentials."""

    ok: Annotated[bool, Meta(description="reached, ready, and the credentials accepted")]
    ready: bool | UnsetType = UNSET
    latency_ms: Annotated[float, Meta(description="both calls, in milliseconds")] | UnsetType = UNSET
    error: ErrorDetail | None
