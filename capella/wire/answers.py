"""Answers shared by many operations: the error body, a plain status, readiness."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from msgspec import UNSET, Meta, UnsetType

from capella.wire.fields import Time
from capella.wire.struct import Struct


class ErrorDetail(Struct, omit_defaults=True):
    """A stable code, a message, and where the problem was when it was in the request."""

    code: str
    message: str
    index: Annotated[int, Meta(description="index of the bad message")] | UnsetType = UNSET
    field: Annotated[str, Meta(description="the bad field")] | UnsetType = UNSET
    parameter: Annotated[str, Meta(description="the bad query parameter")] | UnsetType = UNSET
    limit: Annotated[int, Meta(description="the limit that was exceeded")] | UnsetType = UNSET
    retry_after: Annotated[int, Meta(description="rate_limited: seconds to wait")] | UnsetType = UNSET
    accept: Annotated[str, Meta(description="not_acceptable: the Accept header")] | UnsetType = UNSET
    type: Annotated[str, Meta(description="forbidden: the object type asked for")] | UnsetType = UNSET
    action: Annotated[str, Meta(description="forbidden: the action asked for")] | UnsetType = UNSET
    name: Annotated[str, Meta(description="forbidden: the object's name")] | UnsetType = UNSET
    origin: Annotated[str, Meta(description="cross_site_request: the page's origin")] | UnsetType = UNSET
    host: Annotated[str, Meta(description="host_not_allowed: the Host header")] | UnsetType = UNSET
    address: Annotated[str, Meta(description="egress_refused: the refused addresses")] | UnsetType = UNSET
    cluster: Annotated[str, Meta(description="same_cluster_name: the far side's name")] | UnsetType = UNSET
    handlers: (
        Annotated[list[str], Meta(description="conflict: the handlers that use a cluster")] | UnsetType
    ) = UNSET
    url: Annotated[str, Meta(description="unreachable: what could not be reached")] | UnsetType = UNSET


class Error(Struct):
    """Every error answer."""

    error: ErrorDetail

    @classmethod
    def of(cls, code: str, message: str, details: Mapping[str, object]) -> Error:
        """The answer for an error's code, message and details (``CapellaError.details``).

        Each detail the server sends is a field of ``ErrorDetail``, so the document lists it;
        one that is not is left out rather than failing the answer.
        """
        known = {k: _text(v) for k, v in details.items() if k in ErrorDetail.__struct_fields__}
        return cls(ErrorDetail(code=code, message=_text(message), **known))


def _text(value: Any) -> Any:
    """``value``, a text one made encodable: a header's undecodable bytes come as lone
    surrogates (``Accept: \\x84``), which an answer echoes as ``\\udc84``."""
    if isinstance(value, str) and not value.isascii():
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value


class Status(Struct):
    """A plain status answer."""

    status: str


class QueueFault(Struct):
    """A queue that cannot accept writes, with the storage error that stops it."""

    queue: str
    reason: str
    since: Annotated[Time, Meta(description="UNIX seconds of the first failure")]


class SharedFault(Struct):
    """Why this node's shared queues cannot accept writes: PostgreSQL or S3 unreachable, or the
    shared part not started yet (it keeps trying)."""

    reason: str
    parts: Annotated[list[str], Meta(description='What fails: "postgres", "s3"')]
    since: Annotated[Time, Meta(description="UNIX seconds of the first failure")]


class Readiness(Struct, omit_defaults=True):
    """Why the server is not ready: recovering at start, or queues that cannot accept writes."""

    status: Literal["recovering", "not_writable"]
    queues: (
        Annotated[
            list[QueueFault],
            Meta(description="The queues that cannot accept writes, with the storage error that stops them"),
        ]
        | UnsetType
    ) = UNSET
    shared: (
        Annotated[
            SharedFault,
            Meta(description="Why shared queues cannot accept writes on this node (also with none defined)"),
        ]
        | UnsetType
    ) = UNSET
