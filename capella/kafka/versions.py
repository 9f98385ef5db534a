"""The Kafka APIs this broker serves, each with its version range and handler; ApiVersions
answers from this table, and the listener dispatches through it.

The ranges are the design note's (docs/kafka.md, "APIs and versions"): flexible versions up to
the last one without topic ids (Fetch 12, Produce 9), record batches v2 only (Produce 3+,
Fetch 4+). Metadata stops at 8, the last one before flexible: librdkafka sizes the buffer it
parses a Metadata answer into at four times the answer's bytes, and a compact (v9) answer
listing topics of one partition with names of a few letters needs more than that, so the
whole answer is dropped as malformed (``Protocol parse failure for Metadata v9(flex)``,
``tmpabuf memory shortage``). Kafka's own answers are larger: from v10 on each topic carries
its 16-byte id. v9 adds nothing but the compact encoding.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from capella.kafka import errors, fetch, membership, metadata, offsets, produce, producers, sasl
from capella.kafka.session import Session

Handler = Callable[[Session, Any, int], Awaitable[dict[str, Any] | None]]


@dataclass(frozen=True, slots=True)
class Api:
    key: int
    name: str
    low: int
    high: int
    handler: Handler
    # Served before the client has signed in (SASL's own requests and ApiVersions).
    before_sign_in: bool = False


async def api_versions(session: Session, request: Any, version: int) -> dict[str, Any]:
    return {"error_code": errors.NONE, "api_keys": advertised(), "throttle_time_ms": 0}


APIS: dict[int, Api] = {
    api.key: api
    for api in (
        Api(0, "Produce", 3, 9, produce.produce),
        Api(1, "Fetch", 4, 12, fetch.fetch),
        Api(2, "ListOffsets", 1, 7, offsets.list_offsets),
        Api(3, "Metadata", 0, 8, metadata.metadata),
        Api(8, "OffsetCommit", 2, 8, offsets.offset_commit),
        Api(9, "OffsetFetch", 1, 7, offsets.offset_fetch),
        Api(10, "FindCoordinator", 0, 3, membership.find_coordinator),
        Api(11, "JoinGroup", 0, 7, membership.join_group),
        Api(12, "Heartbeat", 0, 4, membership.heartbeat),
        Api(13, "LeaveGroup", 0, 4, membership.leave_group),
        Api(14, "SyncGroup", 0, 5, membership.sync_group),
        Api(17, "SaslHandshake", 0, 1, sasl.handshake, before_sign_in=True),
        Api(18, "ApiVersions", 0, 3, api_versions, before_sign_in=True),
        Api(22, "InitProducerId", 0, 4, producers.init_producer_id),
        Api(36, "SaslAuthenticate", 0, 2, sasl.authenticate, before_sign_in=True),
    )
}

API_VERSIONS = APIS[18]


def advertised() -> list[dict[str, int]]:
    return [{"api_key": a.key, "min_version": a.low, "max_version": a.high} for a in APIS.values()]
