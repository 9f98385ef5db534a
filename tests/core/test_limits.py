"""The message rules of ``capella.core.limits``: pure functions, and the queue that calls them."""

from __future__ import annotations

import math

import pytest

from capella.core.cluster import Cluster
from capella.core.limits import MessageLimits, check_cursor, check_drafts
from capella.core.message import Draft
from capella.errors import InvalidMessage, InvalidRequest, MessageHeadersTooLarge, PayloadTooLarge

LIMITS = MessageLimits(max_size=10, max_batch=3, max_headers=2, max_headers_size=8)
NOW = 1_000_000.0


@pytest.mark.parametrize(
    ("drafts", "error", "field", "index"),
    [
        ([Draft(b"x")] * 4, PayloadTooLarge, None, None),
        ([Draft(b"ok"), Draft(b"x" * 11)], PayloadTooLarge, None, 1),
        ([Draft(b"a", source="")], InvalidMessage, "source", 0),
        ([Draft(b"a", source="é" * 128)], InvalidMessage, "source", 0),  # 256 bytes of UTF-8
        ([Draft(b"a", external_id=2**63)], InvalidMessage, "external_id", 0),
        ([Draft(b"a", segment=-(2**63) - 1)], InvalidMessage, "segment", 0),
        ([Draft(b"a", external_time=math.inf)], InvalidMessage, "external_time", 0),
        ([Draft(b"a", external_time=NOW + 60)], InvalidMessage, "external_time", 0),
        ([Draft(b"a", headers={"a": "1", "b": "2", "c": "3"})], MessageHeadersTooLarge, "headers", 0),
        ([Draft(b"a", headers={"name": "value"})], MessageHeadersTooLarge, "headers", 0),
        ([Draft(b"a", deliver_at=NOW + 11 * 365 * 86400)], InvalidMessage, "deliver_at", 0),
        ([Draft(b"a", deliver_at=math.nan)], InvalidMessage, "deliver_at", 0),
    ],
)
def test_each_rule_refuses_with_its_error(
    drafts: list[Draft], error: type[Exception], field: str | None, index: int | None
) -> None:
    with pytest.raises(error) as refused:
        check_drafts(drafts, LIMITS, NOW, None)
    details = refused.value.details  # type: ignore[attr-defined]
    assert details.get("field") == field and details.get("index") == index


def test_what_meets_the_rules_passes() -> None:
    check_drafts(
        [
            Draft(
                b"x" * 10, source="s" * 255, external_id=2**63 - 1, external_time=NOW + 1, headers={"a": "b"}
            )
        ],
        LIMITS,
        NOW,
        None,
    )


def test_a_segment_outside_the_queues_range_is_refused() -> None:
    with pytest.raises(InvalidMessage, match="outside the queue's range 0-1"):
        check_drafts([Draft(b"a"), Draft(b"b", segment=2)], LIMITS, NOW, (0, 1))


@pytest.mark.parametrize("cursor", [-1, 2**63, 2**64 - 1, True, 1.0])
def test_a_cursor_is_an_int64(cursor: object) -> None:
    with pytest.raises(InvalidRequest):
        check_cursor(cursor)


async def test_a_refused_append_stores_nothing_and_uses_up_no_id(cluster: Cluster) -> None:
    q, _ = await cluster.put_queue("rules", {})
    await q.append([Draft(b"first")])
    for bad in (
        [Draft(b"a"), Draft(b"b", source="s" * 70_000)],
        [Draft(b"x" * (cluster.limits.max_size + 1))],
    ):
        with pytest.raises(InvalidRequest):
            await q.append(bad)
    with pytest.raises(InvalidRequest):
        await q.commit("sub", 2**64 - 1)
    assert q.last_id == 1
    assert [a.id for a in await q.append([Draft(b"next")])] == [2]
    assert q.subscriptions() == []
