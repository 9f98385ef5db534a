"""Answers shared by many operations: the error body, a plain status, readiness."""

from __future__ import annotations

from typing import Annotated, Literal

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


class Error(Struct):
    """Every error answer."""

    error: ErrorDetail


class Status(Struct):
    """A plain status answer."""

    status: str


class QueueFault(Struct):
    """A queue that cannot accept writes, with the storage error that stops it."""

    queue: str
    reason: str
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
