"""Subscriptions over HTTP: commits that never move backwards, reading after a cursor, replicas."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from support.http import error_of

from capella.core.cluster import Cluster

Q = "/v1/queues/q"
S = f"{Q}/subscriptions"


@pytest.fixture
async def q(api: TestClient) -> TestClient:
    assert (await api.put(Q, json={})).status == 201
    resp = await api.post(f"{Q}/messages", json={"messages": [{"data": str(i)} for i in range(10)]})
    assert resp.status == 200
    return api


async def commit(api: TestClient, name: str, body: Any, status: int, **params: str) -> dict[str, Any]:
    resp = await api.put(f"{S}/{name}", json=body, params=params)
    assert resp.status == status, await resp.text()
    return dict(await resp.json())


async def test_create_commit_get_list_delete(q: TestClient) -> None:
    sub = await commit(q, "billing", {"last_id": 4}, 201)
    assert sub["name"] == "billing" and sub["last_id"] == 4 and sub["replica"] is False
    assert sub["lag"] == 6
    assert sub["created"] == sub["updated"]
    sub = await commit(q, "billing", {"last_id": 7}, 200, save="immediate")
    assert (sub["last_id"], sub["lag"]) == (7, 3)
    resp = await q.get(f"{S}/billing")
    assert (await resp.json())["last_id"] == 7
    await commit(q, "audit", {}, 201)
    resp = await q.get(S)
    listed = (await resp.json())["subscriptions"]
    assert [(s["name"], s["last_id"]) for s in listed] == [("audit", 0), ("billing", 7)]
    assert (await q.delete(f"{S}/billing")).status == 204
    assert (await error_of(await q.get(f"{S}/billing"), 404))["code"] == "subscription_not_found"
    assert (await error_of(await q.delete(f"{S}/billing"), 404))["code"] == "subscription_not_found"


async def test_a_commit_never_moves_backwards_unless_reset(q: TestClient) -> None:
    await commit(q, "c", {"last_id": 8}, 201)
    assert (await commit(q, "c", {"last_id": 3}, 200))["last_id"] == 8
    assert (await commit(q, "c", {"last_id": None}, 200))["last_id"] == 8
    assert (await commit(q, "c", {"last_id": 3, "reset": True}, 200))["last_id"] == 3


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"last_id": -1}, "last_id"),
        ({"last_id": "5"}, "last_id"),
        ({"last_id": True}, "last_id"),
        ({"replica": "yes"}, "replica"),
        ({"reset": 1}, "reset"),
        ({"cursor": 5}, "cursor"),
    ],
)
async def test_bad_commits(q: TestClient, body: dict[str, Any], field: str) -> None:
    error = await error_of(await q.put(f"{S}/c", json=body), 400)
    assert (error["code"], error["field"]) == ("invalid_request", field)


async def test_bad_commit_bodies_and_names(q: TestClient) -> None:
    assert (await error_of(await q.put(f"{S}/c", json=[1]), 400))["code"] == "invalid_request"
    resp = await q.put(f"{S}/c", data=b"{", headers={"Content-Type": "application/json"})
    assert (await error_of(resp, 400))["code"] == "invalid_request"
    assert (await error_of(await q.put(f"{S}/.bad", json={}), 400))["code"] == "invalid_name"
    resp = await q.put(f"{S}/c", json={}, params={"save": "later"})
    assert (await error_of(resp, 400))["code"] == "invalid_save_mode"


async def test_read_with_auto_commit_creates_and_moves_the_cursor(q: TestClient) -> None:
    resp = await q.get(f"{S}/worker/messages", params={"limit": "4"})
    got = await resp.json()
    assert [m["id"] for m in got["messages"]] == [1, 2, 3, 4] and got["last_id"] == 4
    assert (await (await q.get(f"{S}/worker")).json())["last_id"] == 4
    got = await (await q.get(f"{S}/worker/messages", params={"limit": "100"})).json()
    assert [m["id"] for m in got["messages"]] == [5, 6, 7, 8, 9, 10]
    got = await (await q.get(f"{S}/worker/messages")).json()
    assert got == {"messages": [], "last_id": 10}


async def test_read_with_commit_none_leaves_the_cursor(q: TestClient) -> None:
    got = await (await q.get(f"{S}/peek/messages", params={"commit": "none", "limit": "2"})).json()
    assert [m["id"] for m in got["messages"]] == [1, 2]
    assert (await q.get(f"{S}/peek")).status == 404
    await commit(q, "peek", {"last_id": 5}, 201)
    got = await (await q.get(f"{S}/peek/messages", params={"commit": "none", "limit": "2"})).json()
    assert [m["id"] for m in got["messages"]] == [6, 7]
    assert (await (await q.get(f"{S}/peek")).json())["last_id"] == 5


async def test_read_subscription_segments_and_ndjson(q: TestClient) -> None:
    await q.post(f"{Q}/messages", json={"messages": [{"data": "s", "segment": 5}]})
    resp = await q.get(
        f"{S}/seg/messages", params={"segments": "5-5"}, headers={"Accept": "application/x-ndjson"}
    )
    assert resp.headers["Capella-Last-Id"] == "11"
    assert (await resp.read()).count(b"\n") == 1
    assert (await (await q.get(f"{S}/seg")).json())["last_id"] == 11


async def test_bad_subscription_read_parameters(q: TestClient) -> None:
    for params in ({"commit": "sometimes"}, {"limit": "0"}, {"wait": "x"}, {"segments": "x"}):
        error = await error_of(await q.get(f"{S}/w/messages", params=params), 400)
        assert error["code"] == "invalid_request", params


async def test_replicas(q: TestClient) -> None:
    await commit(q, "dc2", {"last_id": 5, "replica": True}, 201)
    await commit(q, "dc3", {"last_id": 9, "replica": True}, 201)
    await commit(q, "local", {"last_id": 10}, 201)
    got = await (await q.get(f"{Q}/replicas", params={"id": "5"})).json()
    assert got == {"id": 5, "count": 2, "subscriptions": ["dc2", "dc3"]}
    got = await (await q.get(f"{Q}/replicas", params={"id": "7"})).json()
    assert got == {"id": 7, "count": 1, "subscriptions": ["dc3"]}
    assert (await commit(q, "dc2", {"replica": False}, 200))["replica"] is False
    got = await (await q.get(f"{Q}/replicas", params={"id": "1"})).json()
    assert got["count"] == 1
    for params in ({}, {"id": "x"}, {"id": "-1"}):
        error = await error_of(await q.get(f"{Q}/replicas", params=params), 400)
        assert error["code"] == "invalid_request"


async def test_a_cursors_group_and_metadata_show_when_it_has_them(q: TestClient, cluster: Cluster) -> None:
    # What the Kafka listener commits for a group whose id is no subscription name.
    group = "orders/eu-west: the billing consumers"
    await cluster.queue("q").commit("kafka.5f0c1a2b3c4d5e6f", 6, group=group, metadata="")
    await commit(q, "plain", {"last_id": 2}, 201)
    sub = await commit(q, "kafka.5f0c1a2b3c4d5e6f", {"last_id": 8}, 200)
    # An HTTP commit moves the group's cursor and keeps what the group said.
    assert (sub["last_id"], sub["lag"], sub["group"], sub["metadata"]) == (8, 2, group, "")
    resp = await q.get(f"{S}/kafka.5f0c1a2b3c4d5e6f")
    assert {k: v for k, v in (await resp.json()).items() if k in ("group", "metadata")} == {
        "group": group,
        "metadata": "",
    }
    listed = (await (await q.get(S)).json())["subscriptions"]
    # Absent, not null, on a cursor without them.
    plain = ["created", "lag", "last_id", "mode", "name", "replica", "updated"]
    assert [sorted(s) for s in listed][1] == plain
    assert [s.get("group") for s in listed] == [group, None]
