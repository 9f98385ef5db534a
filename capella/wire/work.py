"""Subscriptions and work queues on the wire: cursors, retry policies, claims, receipts."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from msgspec import UNSET, Meta, UnsetType

from capella.wire.answers import ErrorDetail
from capella.wire.fields import (
    Delay,
    Duration,
    Headers,
    Lease,
    MessageId,
    SegmentsText,
    StoredId,
    Time,
    TimeInput,
    schema,
)
from capella.wire.messages import StoredMessage
from capella.wire.struct import Struct

Mode = Literal["cursor", "ack"]
MAX_ATTEMPTS = "claims before a failure goes to the dead letters (5; 0: no limit)"
DEAD_LETTER = "an existing queue that gets a copy of each dead message"
WorkStatus = Literal["in_flight", "failed", "pending", "dead", "done", "deleted"]


class RetryPolicy(Struct, forbid_unknown_fields=True):
    """How an ack-mode subscription leases, retries and gives up on a message (in a request,
    the fields given change the current policy; in an answer, all of them)."""

    lease: Annotated[Lease, Meta(description="default lease of a claim (30 s; at most 12 h)")] | UnsetType = (
        UNSET
    )
    max_attempts: (
        Annotated[int, schema(minimum=0, maximum=1_000_000, description=MAX_ATTEMPTS)] | UnsetType
    ) = UNSET
    backoff: Literal["fixed", "exponential"] | UnsetType = UNSET
    delay: (
        Annotated[Delay, Meta(description="first retry delay (1 s); fixed: every retry; not above max_delay")]
        | UnsetType
    ) = UNSET
    max_delay: Annotated[Delay, Meta(description="cap of a retry delay (300 s)")] | UnsetType = UNSET
    jitter: Annotated[float, schema(minimum=0, maximum=1, description="± fraction (0.1)")] | UnsetType = UNSET
    dead_letter: Annotated[str | None, Meta(description=DEAD_LETTER)] | UnsetType = UNSET


class SubscriptionCommit(Struct, forbid_unknown_fields=True):
    """a cursor takes last_id, replica and reset; an ack-mode subscription takes mode ack and
    policy (its mode never changes)"""

    # With mode ack or a policy it defines a work queue: no cursor field (null is not given).
    __schema_extra__: ClassVar[dict[str, Any]] = {
        "if": {
            "anyOf": [
                {"required": ["mode"], "properties": {"mode": {"const": "ack"}}},
                {"required": ["policy"]},
            ]
        },
        "then": {
            "properties": {
                "mode": {"const": "ack"},
                "last_id": {"type": "null"},
                "replica": {"type": "null"},
            },
            "not": {"required": ["reset"]},
        },
    }

    last_id: MessageId | UnsetType | None = UNSET
    replica: bool | UnsetType | None = UNSET
    reset: bool | UnsetType = UNSET
    mode: Mode | UnsetType | None = UNSET
    policy: RetryPolicy | UnsetType = UNSET


class WorkCounts(Struct):
    """ack mode only"""

    claimed_through: Annotated[int, Meta(description="highest id ever claimed")]
    backlog: Annotated[int, Meta(description="ids after claimed_through")]
    in_flight: int
    failed: Annotated[int, Meta(description="given back, waiting for a retry")]
    dead: int


class Subscription(Struct, omit_defaults=True):
    """A named cursor, or an ack-mode subscription with its policy and work counts."""

    name: str
    mode: Mode
    last_id: Annotated[int, Meta(description="ack mode: every id up to it is finished")]
    replica: bool
    lag: Annotated[int, Meta(ge=0)]
    created: Time
    updated: Time
    policy: Annotated[RetryPolicy, Meta(description="ack mode only, fully resolved")] | UnsetType = UNSET
    work: WorkCounts | UnsetType = UNSET
    group: (
        Annotated[str, Meta(description="the consumer group that commits this cursor (its full id)")]
        | UnsetType
    ) = UNSET
    metadata: (
        Annotated[str, Meta(description="what the group's last commit said beside the offset")] | UnsetType
    ) = UNSET


class SubscriptionList(Struct):
    """The subscriptions of a queue the caller may read."""

    subscriptions: list[Subscription]


class ClaimedMessage(StoredMessage, omit_defaults=True, kw_only=True):
    """A claimed message: a stored message with its receipt, attempt and lease."""

    receipt: Annotated[str, schema(pattern=r"^[0-9]+\.[0-9]+$")]
    attempt: Annotated[int, Meta(ge=1)]
    lease_until: Time
    last_error: str | None


class Claimed(Struct):
    """The messages a claim leased (none when nothing was ready)."""

    messages: list[ClaimedMessage]


class WorkMessage(StoredMessage, omit_defaults=True, kw_only=True):
    """A message of a work queue with its status and attempts."""

    status: WorkStatus
    attempts: Annotated[int, Meta(ge=0)]
    last_error: str | None
    lease_until: Annotated[Time, Meta(description="in_flight")] | UnsetType = UNSET
    retry_at: Annotated[Time, Meta(description="waiting (or ready again after a failure)")] | UnsetType = (
        UNSET
    )
    died: Annotated[Time, Meta(description="dead")] | UnsetType = UNSET


class WorkList(Struct):
    """A page of a work queue's messages."""

    messages: list[WorkMessage]
    next_after: Annotated[
        int | None, Meta(description="pass as after for the next page; null when everything was looked at")
    ]


class RetriedWork(Struct):
    """What a retry did."""

    retried: list[MessageId]
    next_after: Annotated[
        int | None,
        Meta(description="pass as after to retry the next page; null when everything was looked at"),
    ]


class DeletedWork(Struct):
    """What a delete did."""

    deleted: list[MessageId]
    next_after: Annotated[
        int | None,
        Meta(description="pass as after to delete the next page; null when everything was looked at"),
    ]


class WorkSelection(Struct, forbid_unknown_fields=True):
    """which messages: status (delete: status or ids is required), optional filters, at most
    limit of them after after"""

    status: list[Literal["in_flight", "failed", "pending", "dead"]] | UnsetType = UNSET
    ids: Annotated[list[StoredId], schema(maxItems=10_000)] | UnsetType = UNSET
    source: str | UnsetType = UNSET
    segments: SegmentsText | UnsetType = UNSET
    headers: Headers | UnsetType = UNSET
    json: Annotated[dict[str, Any], Meta(description=JSON_FILTER)] | UnsetType = UNSET
    after: MessageId | UnsetType = UNSET
    limit: Annotated[int, schema(minimum=1, maximum=10_000, default=1000)] | UnsetType = UNSET


class RetrySelection(WorkSelection, forbid_unknown_fields=True):
    """which messages, as for a delete (status defaults to failed and dead), and when they may
    be claimed again: at or delay, not both (default now)"""

    at: Annotated[TimeInput, Meta(description="claimable from then (default now)")] | UnsetType = UNSET
    delay: Annotated[Duration, Meta(description="claimable after this")] | UnsetType = UNSET


JSON_FILTER = "dotted path of the JSON payload → value, all equal"
NACK_DELAY = "retry after this (default: the backoff)"
NACK_ERROR = "why it failed (first 2048 characters kept)"
EXTEND_LEASE = "the new lease from now (default: the policy's)"


class Receipts(Struct, forbid_unknown_fields=True):
    """exactly one of receipts (answered per receipt) and receipt (its error is the answer's
    status)"""

    receipts: Annotated[list[str], schema(minItems=1)] | UnsetType = UNSET
    receipt: str | UnsetType = UNSET


class NackReceipts(Receipts, forbid_unknown_fields=True):
    """the receipts as for an ack, and how they failed"""

    delay: Annotated[Delay | None, Meta(description=NACK_DELAY)] | UnsetType = UNSET
    error: Annotated[str | None, Meta(description=NACK_ERROR)] | UnsetType = UNSET


class ExtendReceipts(Receipts, forbid_unknown_fields=True):
    """the receipts as for an ack, and their new lease"""

    lease: Annotated[Lease | None, Meta(description=EXTEND_LEASE)] | UnsetType = UNSET


class ReceiptResult(Struct, omit_defaults=True):
    """What happened to one receipt."""

    receipt: str
    id: MessageId
    ok: bool
    lease_until: Time | UnsetType = UNSET
    retry_at: Time | UnsetType = UNSET
    dead: Annotated[bool, Meta(description="nack: its attempts were used up")] | UnsetType = UNSET
    error: ErrorDetail | UnsetType = UNSET


class ReceiptResults(Struct):
    """One result per receipt, in the order given (a single ``receipt`` gets a ReceiptResult)."""

    results: list[ReceiptResult]
