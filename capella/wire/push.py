"""The push handler on the wire: its params, their limits and header rules, and its status."""

from __future__ import annotations

import re
from typing import Annotated, ClassVar, Literal

from msgspec import Meta

from capella.errors import InvalidRequest
from capella.wire.fields import (
    MAX_REQUEST_SECONDS,
    URL_EXCLUDED,
    IntervalOrZero,
    RequestSeconds,
    RetryInterval,
    Time,
    schema,
)
from capella.wire.params import Params, SecretName, Segments, check_segments
from capella.wire.struct import Struct

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
        check_segments(self.segments)


class DeliveryError(Struct):
    """push: the last failed request, with the receiver's status (null without an answer)."""

    message: str
    status: int | None
    time: Time


class PushStatus(Struct):
    """What a push handler adds to the status: its deliveries."""

    delivered: Annotated[int, schema(minimum=0, description="messages acked by the receiver")]
    failed: Annotated[int, schema(minimum=0, description="failed attempts")]
    dead: Annotated[int, schema(minimum=0, description="messages that used up their attempts")]
    in_flight: Annotated[int, schema(minimum=0, description="messages in requests now")]
    retrying: Annotated[int, schema(minimum=0, description="failed messages waiting for a retry")]
    lag: Annotated[int, schema(minimum=0, description="messages not delivered yet")]
    last_delivery_error: DeliveryError | None
