"""Delayed delivery over HTTP: produce with deliver_at or delay, list, show, reschedule, cancel."""

from __future__ import annotations

import time
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from support.http import error_of
from support.wait import until

from capella.core.cluster import Cluster

Q = "/v1/queues/q"
S = f"{Q}/scheduled"


@pytest.fixture
async def q(api: TestClient) -> TestClient:
    assert (await api.put(Q, json={})).status == 201
    return api


async def produce(api: TestClient, *messages: dict[str, Any], **params: str) -> list[dict[str, Any]]:
    resp = await api.post(f"{Q}/messages", json={"messages": list(messages)}, params=params)
    assert resp.status == 200, await resp.text()
    return list((await resp.json())["results"])


async def payloads(api: TestClient, wait: str = "0") -> list[str]:
    resp = await api.get(f"{Q}/messages", params={"after": "0", "wait": wait})
    return [m["data"] for m in (await resp.json())["messages"]]


async def test_produce_lists_shows_and_delivers_delayed_messages(q: TestClient) -> None:
    soon = time.time() + 3600
    results = await produce(
        q,
        {"data": "later", "delay": "2h", "headers": {"k": "v"}},
        {"data": "now"},
        {"data": "sooner", "deliver_at": soon, "source": "shop", "external_id": 9, "segment": 4},
        save="wait",
    )
    assert results[1] == {"id": 1, "duplicate": False}
    assert set(results[0]) == {"scheduled_id", "deliver_at", "duplicate"}
    assert results[2]["deliver_at"] == soon and results[2]["duplicate"] is False
    assert await payloads(q) == ["now"]

    resp = await q.get(S, params={"limit": "1"})
    page = await resp.json()
    assert page["count"] == 2
    (first,) = page["scheduled"]
    assert first == {
        "scheduled_id": results[2]["scheduled_id"],
        "deliver_at": soon,
        "created": first["created"],
        "source": "shop",
        "external_id": 9,
        "external_time": None,
        "segment": 4,
        "headers": {},
        "data": "sooner",
    }
    resp = await q.get(S, params={"after": page["next"]})
    rest = await resp.json()
    assert [i["data"] for i in rest["scheduled"]] == ["later"]
    assert rest["next"] is None
    resp = await q.get(f"{S}/{results[0]['scheduled_id']}")
    shown = await resp.json()
    assert (shown["headers"], shown["source"], shown["external_id"]) == (
        {"k": "v"},
        "test",
        shown["scheduled_id"],
    )

    # Due now: delivered at the end of the log, with the identity it was scheduled with.
    resp = await q.patch(f"{S}/{results[2]['scheduled_id']}", json={"deliver_at": time.time() - 1})
    assert resp.status == 200

    async def delivered_both() -> bool:
        return len(await payloads(q)) == 2

    await until(delivered_both, what="the due message delivered")
    resp = await q.get(f"{Q}/messages", params={"after": "1"})
    (delivered,) = (await resp.json())["messages"]
    assert (delivered["data"], delivered["external_id"], delivered["segment"]) == ("sooner", 9, 4)
    # Its id comes at delivery: after every id handed out before, schedule ids included.
    assert delivered["id"] > max(r.get("id", 0) or r["scheduled_id"] for r in results)
    code = (await error_of(await q.get(f"{S}/{results[2]['scheduled_id']}"), 404))["code"]
    assert code == "scheduled_not_found"
    stats = (await (await q.get(Q)).json())["stats"]["scheduled"]
    assert stats["count"] == 1


async def test_cancel_one_and_many(q: TestClient) -> None:
    results = await produce(q, *({"data": str(i), "delay": 600} for i in range(4)))
    sids = [r["scheduled_id"] for r in results]
    assert (await q.delete(f"{S}/{sids[0]}", params={"save": "immediate"})).status == 204
    assert (await error_of(await q.delete(f"{S}/{sids[0]}"), 404))["code"] == "scheduled_not_found"
    resp = await q.post(f"{S}/cancel", json={"ids": [sids[1], sids[0], 424242]})
    assert await resp.json() == {"cancelled": [sids[1]], "not_cancelled": [sids[0], 424242]}
    resp = await q.get(S)
    assert [i["scheduled_id"] for i in (await resp.json())["scheduled"]] == sids[2:]


async def test_a_message_being_delivered_cannot_be_changed(q: TestClient, cluster: Cluster) -> None:
    (result,) = await produce(q, {"data": "x", "delay": 600})
    sid = result["scheduled_id"]
    schedule = cluster.queue("q").schedule
    schedule._releasing.add(sid)  # as while its delivery is being appended
    try:
        error = await error_of(await q.patch(f"{S}/{sid}", json={"delay": 5}), 409)
        assert error["code"] == "conflict"
        assert (await error_of(await q.delete(f"{S}/{sid}"), 409))["code"] == "conflict"
    finally:
        schedule._releasing.discard(sid)
    assert (await q.delete(f"{S}/{sid}")).status == 204


async def test_a_repeated_identity_is_answered_as_a_duplicate(q: TestClient) -> None:
    first = await produce(q, {"data": "x", "delay": "1h", "source": "s", "external_id": 1})
    again = await produce(q, {"data": "x", "delay": "2h", "source": "s", "external_id": 1})
    assert again == [{**first[0], "duplicate": True}]
    stored = await produce(q, {"data": "y", "source": "s", "external_id": 2})
    assert await produce(q, {"data": "y", "delay": 60, "source": "s", "external_id": 2}) == [
        {"id": stored[0]["id"], "duplicate": True}
    ]


async def test_octet_stream_and_ndjson_take_delays(q: TestClient) -> None:
    resp = await q.post(
        f"{Q}/messages",
        data=b"\xffraw",
        params={"delay": "30s"},
        headers={"Content-Type": "application/octet-stream"},
    )
    (raw,) = (await resp.json())["results"]
    assert "scheduled_id" in raw
    resp = await q.post(
        f"{Q}/messages",
        data=b'{"data": "a", "deliver_at": "2999-01-01T00:00:00Z"}\n',
        headers={"Content-Type": "application/x-ndjson"},
    )
    assert resp.status == 400  # more than ten years ahead
    resp = await q.get(f"{S}/{raw['scheduled_id']}")
    assert (await resp.json())["data_b64"] == "/3Jhdw=="


@pytest.mark.parametrize(
    ("message", "field"),
    [
        ({"data": "x", "delay": "soon"}, "delay"),
        ({"data": "x", "delay": -5}, "delay"),
        ({"data": "x", "deliver_at": "tomorrow"}, "deliver_at"),
        ({"data": "x", "deliver_at": True}, "deliver_at"),
        ({"data": "x", "deliver_at": 1e30}, "deliver_at"),
        ({"data": "x", "deliver_at": 1.0, "delay": 1}, "delay"),
    ],
)
async def test_bad_due_times(q: TestClient, message: dict[str, Any], field: str) -> None:
    resp = await q.post(f"{Q}/messages", json={"messages": [{"data": "ok", "delay": 5}, message]})
    error = await error_of(resp, 400)
    assert (error["code"], error["index"], error["field"]) == ("invalid_message", 1, field)
    assert (await (await q.get(S)).json())["count"] == 0


async def test_bad_scheduled_requests(q: TestClient) -> None:
    (result,) = await produce(q, {"data": "x", "delay": 600})
    sid = result["scheduled_id"]
    assert (await error_of(await q.get(f"{S}/abc"), 400))["parameter"] == "id"
    assert (await error_of(await q.get(f"{S}/0"), 400))["parameter"] == "id"
    assert (await error_of(await q.get(S, params={"after": "x"}), 400))["parameter"] == "after"
    for body, field in (
        ({}, "deliver_at"),
        ({"delay": 1, "deliver_at": 1}, "deliver_at"),
        ({"delay": "x"}, "delay"),
        ({"deliver_at": "x"}, "deliver_at"),
        ({"deliver_at": 1e30}, "deliver_at"),
        ({"when": 1}, "when"),
    ):
        error = await error_of(await q.patch(f"{S}/{sid}", json=body), 400)
        assert (error["code"], error["field"]) == ("invalid_request", field)
    assert (await error_of(await q.patch(f"{S}/{sid}", json=[1]), 400))["code"] == "invalid_request"
    for body in ({"ids": "1"}, {"ids": [0]}, {"ids": [True]}, {"what": []}):
        assert (await error_of(await q.post(f"{S}/cancel", json=body), 400))["code"] == "invalid_request"
    assert (await error_of(await q.get("/v1/queues/nope/scheduled"), 404))["code"] == "queue_not_found"
    resp = await q.delete(f"{S}/{sid}", params={"save": "sometimes"})
    assert (await error_of(resp, 400))["code"] == "invalid_save_mode"


async def test_scheduled_messages_are_filtered_and_paged(q: TestClient) -> None:
    base = time.time() + 3600
    messages = [
        {
            "data": f'{{"customer": {{"id": {i % 3}}}}}',
            "deliver_at": base + i,
            "source": "shop" if i % 2 else "web",
            "segment": i,
            "headers": {"kind": "even" if i % 2 == 0 else "odd"},
        }
        for i in range(30)
    ]
    await produce(q, *messages, save="wait")

    async def listed(**params: str) -> tuple[list[int], str | None]:
        resp = await q.get(S, params=params)
        assert resp.status == 200, await resp.text()
        page = await resp.json()
        return [m["segment"] for m in page["scheduled"]], page["next"]

    assert (await listed(source="shop"))[0] == list(range(1, 30, 2))
    assert (await listed(**{"header.kind": "even", "segments": "0-9"}))[0] == [0, 2, 4, 6, 8]
    assert (await listed(**{"json.customer.id": "2"}))[0] == list(range(2, 30, 3))
    assert (await listed(due_after=str(base + 10), due_before=str(base + 13)))[0] == [10, 11, 12]

    # Paging through a filter visits every match once, in due order.
    seen: list[int] = []
    params = {"source": "shop", "limit": "4"}
    for _ in range(10):
        page, following = await listed(**params)
        seen += page
        if following is None:
            break
        params["after"] = following
    assert seen == list(range(1, 30, 2))


@pytest.mark.parametrize(
    "params", [{"due_after": "soon"}, {"due_before": "nan"}, {"colour": "red"}, {"segments": "x"}]
)
async def test_bad_scheduled_filters_are_400(q: TestClient, params: dict[str, str]) -> None:
    error = await error_of(await q.get(S, params=params), 400)
    assert error["code"] == "invalid_request"
