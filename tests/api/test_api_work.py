"""Work queues over HTTP: ack-mode subscriptions, claim (long-poll), ack, nack, extend, errors."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from support.http import error_of
from support.wait import parked

from api.test_api_operations import parse_metrics

Q = "/v1/queues/q"
W = f"{Q}/subscriptions/w"


async def ok(resp: Any, status: int = 200) -> Any:
    assert resp.status == status, await resp.text()
    return await resp.json()


@pytest.fixture
async def q(api: TestClient) -> TestClient:
    assert (await api.put(Q, json={})).status == 201
    assert (await api.put("/v1/queues/q.dead", json={})).status == 201
    policy = {"max_attempts": 2, "backoff": "fixed", "delay": 0, "jitter": 0, "dead_letter": "q.dead"}
    await ok(await api.put(W, json={"mode": "ack", "policy": policy}), 201)
    await ok(await api.post(f"{Q}/messages", json={"messages": [{"data": f"job{i}"} for i in range(5)]}))
    return api


async def claim(api: TestClient, **params: str) -> list[dict[str, Any]]:
    return list((await ok(await api.post(f"{W}/claim", params=params)))["messages"])


async def test_an_ack_mode_subscription_is_defined_shown_and_updated(q: TestClient) -> None:
    info = await ok(await q.get(W))
    assert info["mode"] == "ack" and info["last_id"] == 0 and info["lag"] == 5
    assert info["policy"] == {
        "lease": 30.0,
        "max_attempts": 2,
        "backoff": "fixed",
        "delay": 0.0,
        "max_delay": 300.0,
        "jitter": 0.0,
        "dead_letter": "q.dead",
    }
    assert info["work"] == {"claimed_through": 0, "backlog": 5, "in_flight": 0, "failed": 0, "dead": 0}
    info = await ok(await q.put(W, json={"policy": {"lease": "1m"}}))
    assert info["policy"]["lease"] == 60.0 and info["policy"]["max_attempts"] == 2
    listed = (await ok(await q.get(f"{Q}/subscriptions")))["subscriptions"]
    assert [(s["name"], s["mode"]) for s in listed] == [("w", "ack")]


async def test_claim_ack_one_and_many(q: TestClient) -> None:
    first = await claim(q, limit="2", save="wait")
    assert [(m["id"], m["data"], m["receipt"], m["attempt"]) for m in first] == [
        (1, "job0", "1.1", 1),
        (2, "job1", "2.1", 1),
    ]
    assert first[0]["last_error"] is None and first[0]["lease_until"] > 0
    (third,) = await claim(q)
    answer = await ok(await q.post(f"{W}/ack", json={"receipts": ["1.1", "2.1", "9.1"]}))
    assert [(r["receipt"], r["ok"]) for r in answer["results"]] == [
        ("1.1", True),
        ("2.1", True),
        ("9.1", False),
    ]
    assert answer["results"][2]["error"]["code"] == "unknown_receipt"
    assert await ok(await q.post(f"{W}/ack", json={"receipt": third["receipt"]})) == {
        "receipt": "3.1",
        "id": 3,
        "ok": True,
    }
    assert (await error_of(await q.post(f"{W}/ack", json={"receipt": "9.1"}), 404))[
        "code"
    ] == "unknown_receipt"
    info = await ok(await q.get(W))
    assert (info["last_id"], info["lag"], info["work"]["claimed_through"]) == (3, 2, 3)


async def test_nack_retries_then_dead_letters_with_the_error(q: TestClient) -> None:
    (m,) = await claim(q)
    result = await ok(await q.post(f"{W}/nack", json={"receipt": m["receipt"], "error": "boom"}))
    assert result["ok"] and "retry_at" in result
    # Stale receipts cannot touch the message again.
    error = await error_of(await q.post(f"{W}/extend", json={"receipt": m["receipt"]}), 409)
    assert error["code"] == "lease_lost"
    (again,) = await claim(q)
    assert (again["id"], again["attempt"], again["receipt"], again["last_error"]) == (1, 2, "1.2", "boom")
    result = await ok(await q.post(f"{W}/nack", json={"receipts": [again["receipt"]], "error": "boom 2"}))
    assert result["results"][0]["dead"] is True
    dead = (await ok(await q.get("/v1/queues/q.dead/messages")))["messages"]
    assert [
        (d["data"], d["headers"]["capella-last-error"], d["headers"]["capella-attempts"]) for d in dead
    ] == [("job0", "boom 2", "2")]
    assert (await ok(await q.get(W)))["work"]["dead"] == 1
    (next_one,) = await claim(q)
    assert next_one["id"] == 2


async def test_extend_and_lease_expiry(q: TestClient) -> None:
    (m,) = await claim(q, lease="50ms")
    extended = await ok(await q.post(f"{W}/extend", json={"receipts": [m["receipt"]], "lease": "100ms"}))
    assert extended["results"][0]["lease_until"] > m["lease_until"]
    await asyncio.sleep(0.15)  # the extended lease (100 ms) runs out
    (again,) = await claim(q)
    assert (again["id"], again["attempt"], again["last_error"]) == (1, 2, "the lease ran out")
    error = await error_of(await q.post(f"{W}/ack", json={"receipt": m["receipt"]}), 409)
    assert error["code"] == "lease_lost"


async def test_a_long_poll_claim_wakes_for_a_new_or_a_returned_message(q: TestClient) -> None:
    taken = await claim(q, limit="10")
    assert len(taken) == 5
    waiting = asyncio.create_task(claim(q, wait="5"))
    await parked("Queue.wait_for")  # the claim is parked before the message comes, so it is woken
    await ok(await q.post(f"{Q}/messages", json={"data": "new"}))
    (new,) = await asyncio.wait_for(waiting, 5)
    assert new["data"] == "new"
    waiting = asyncio.create_task(claim(q, wait="5"))
    await parked("Queue.wait_for")  # parked again, before the nack returns a message
    await ok(await q.post(f"{W}/nack", json={"receipt": taken[2]["receipt"], "delay": 0}))
    (returned,) = await asyncio.wait_for(waiting, 5)
    assert (returned["id"], returned["attempt"]) == (3, 2)
    assert await claim(q, wait="0.1") == []


async def test_modes_do_not_mix_over_http(q: TestClient) -> None:
    assert (await error_of(await q.put(W, json={"last_id": 3}), 409))["code"] == "wrong_subscription_mode"
    assert (await error_of(await q.put(W, json={"mode": "cursor"}), 409))["code"] == "wrong_subscription_mode"
    resp = await q.get(f"{W}/messages")
    assert (await error_of(resp, 409))["code"] == "wrong_subscription_mode"
    await ok(await q.put(f"{Q}/subscriptions/c", json={"last_id": 1}), 201)
    resp = await q.post(f"{Q}/subscriptions/c/claim")
    assert (await error_of(resp, 409))["code"] == "wrong_subscription_mode"
    resp = await q.put(f"{Q}/subscriptions/c", json={"mode": "ack"})
    assert (await error_of(resp, 409))["code"] == "wrong_subscription_mode"
    resp = await q.post(f"{Q}/subscriptions/none/claim")
    assert (await error_of(resp, 404))["code"] == "subscription_not_found"
    resp = await q.post("/v1/queues/nope/subscriptions/w/claim")
    assert (await error_of(resp, 404))["code"] == "queue_not_found"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"mode": "ack", "last_id": 1}, "last_id"),
        ({"mode": "sometimes"}, "mode"),
        ({"mode": "ack", "policy": {"lease": -1}}, "policy.lease"),
        ({"mode": "ack", "policy": {"dead_letter": "missing"}}, "policy.dead_letter"),
        ({"mode": "ack", "policy": {"dead_letter": "q2"}}, "policy.dead_letter"),
        ({"mode": "ack", "policy": []}, "policy"),
        ({"mode": "cursor", "policy": {}}, "policy"),
    ],
)
async def test_bad_definitions(api: TestClient, body: dict[str, Any], field: str) -> None:
    await ok(await api.put("/v1/queues/q2", json={}), 201)
    error = await error_of(await api.put("/v1/queues/q2/subscriptions/w", json=body), 400)
    assert (error["code"], error["field"]) == ("invalid_request", field)


@pytest.mark.parametrize(
    ("verb", "body", "field"),
    [
        ("ack", {}, "receipts"),
        ("ack", {"receipts": []}, "receipts"),
        ("ack", {"receipts": "1.1"}, "receipts"),
        ("ack", {"receipts": ["1"]}, "receipts"),
        ("ack", {"receipt": "1.1", "receipts": ["1.1"]}, "receipts"),
        ("ack", {"receipt": "1.1", "delay": 1}, "delay"),
        ("nack", {"receipt": "1.1", "delay": "soon"}, "delay"),
        ("nack", {"receipt": "1.1", "error": 5}, "error"),
        ("extend", {"receipt": "1.1", "lease": "1d"}, "lease"),
        ("extend", {"receipt": "1.1", "lease": 0}, "lease"),
    ],
)
async def test_bad_receipt_requests(q: TestClient, verb: str, body: dict[str, Any], field: str) -> None:
    error = await error_of(await q.post(f"{W}/{verb}", json=body), 400)
    assert (error["code"], error["field"]) == ("invalid_request", field)


async def test_bad_claims(q: TestClient) -> None:
    for params in ({"lease": "x"}, {"lease": "0"}, {"limit": "0"}, {"wait": "x"}, {"save": "x"}):
        resp = await q.post(f"{W}/claim", params=params)
        assert resp.status == 400, params
    assert (await q.get(f"{W}/claim")).status == 405


# --- the operator's view -------------------------------------------------------------------


@pytest.fixture
async def shop(api: TestClient) -> TestClient:
    """Orders 1-8: JSON payloads from two sources, segments 0/1, a header on the even ones."""
    await ok(await api.put("/v1/queues/shop", json={}), 201)
    policy = {"max_attempts": 1, "delay": 0, "jitter": 0}
    await ok(await api.put("/v1/queues/shop/subscriptions/w", json={"mode": "ack", "policy": policy}), 201)
    orders = [
        {
            "data": f'{{"customer": {{"id": {40 + i % 3}}}, "rush": {str(i % 2 == 0).lower()}}}',
            "source": "web" if i <= 4 else "app",
            "segment": i % 2,
            "headers": {"kind": "even"} if i % 2 == 0 else {},
        }
        for i in range(1, 9)
    ]
    await ok(await api.post("/v1/queues/shop/messages", json={"messages": orders}))
    return api


SW = "/v1/queues/shop/subscriptions/w"


async def listed(api: TestClient, **params: str) -> tuple[list[tuple[int, str]], Any]:
    page = await ok(await api.get(f"{SW}/work", params=params))
    return [(m["id"], m["status"]) for m in page["messages"]], page["next_after"]


async def test_operators_list_messages_by_status_and_filters(shop: TestClient) -> None:
    claimed = (await ok(await shop.post(f"{SW}/claim", params={"limit": "3"})))["messages"]
    await ok(await shop.post(f"{SW}/nack", json={"receipt": claimed[0]["receipt"], "error": "no stock"}))
    assert await listed(shop) == (
        [(1, "dead"), (2, "in_flight"), (3, "in_flight"), *((i, "pending") for i in range(4, 9))],
        None,
    )
    assert await listed(shop, status="in_flight,dead") == (
        [(1, "dead"), (2, "in_flight"), (3, "in_flight")],
        None,
    )
    assert await listed(shop, status="pending", source="app") == (
        [(5, "pending"), (6, "pending"), (7, "pending"), (8, "pending")],
        None,
    )
    assert (await listed(shop, segments="1"))[0] == [
        (1, "dead"),
        (3, "in_flight"),
        (5, "pending"),
        (7, "pending"),
    ]
    assert (await listed(shop, **{"header.kind": "even"}))[0] == [
        (2, "in_flight"),
        (4, "pending"),
        (6, "pending"),
        (8, "pending"),
    ]
    assert (await listed(shop, **{"json.customer.id": "41"}))[0] == [
        (1, "dead"),
        (4, "pending"),
        (7, "pending"),
    ]
    assert (await listed(shop, **{"json.rush": "true", "status": "pending"}))[0] == [
        (4, "pending"),
        (6, "pending"),
        (8, "pending"),
    ]
    assert (await listed(shop, **{"json.customer.id": '"41"'}))[0] == []  # the string is not the number
    page, next_after = await listed(shop, limit="2")
    assert (page, next_after) == ([(1, "dead"), (2, "in_flight")], 2)
    page, next_after = await listed(shop, limit="4", after="2")
    assert (page, next_after) == ([(3, "in_flight"), (4, "pending"), (5, "pending"), (6, "pending")], 6)

    one = await ok(await shop.get(f"{SW}/work/1"))
    assert (one["status"], one["attempts"], one["last_error"], one["source"]) == (
        "dead",
        1,
        "no stock",
        "web",
    )
    assert "died" in one
    two = await ok(await shop.get(f"{SW}/work/2"))
    assert (two["status"], two["attempts"], two["lease_until"]) == ("in_flight", 1, claimed[1]["lease_until"])
    assert (await error_of(await shop.get(f"{SW}/work/99"), 404))["code"] == "message_not_found"
    assert (await error_of(await shop.get(f"{SW}/work/x"), 400))["parameter"] == "id"


async def test_operators_retry_and_move_dead_back(shop: TestClient) -> None:
    claimed = (await ok(await shop.post(f"{SW}/claim", params={"limit": "2"})))["messages"]
    receipts = [m["receipt"] for m in claimed]
    await ok(await shop.post(f"{SW}/nack", json={"receipts": receipts, "error": "down"}))
    assert (await listed(shop, status="dead"))[0] == [(1, "dead"), (2, "dead")]
    answer = await ok(await shop.post(f"{SW}/work/retry", json={"json": {"customer.id": 42}}))
    assert answer == {"retried": [2], "next_after": None}
    (back,) = (await ok(await shop.post(f"{SW}/claim")))["messages"]
    assert (back["id"], back["attempt"], back["last_error"]) == (2, 1, "down")
    answer = await ok(await shop.post(f"{SW}/work/retry", json={"ids": [1], "delay": "1h"}))
    assert answer["retried"] == [1]
    assert (await listed(shop, status="failed"))[0] == [(1, "failed")]
    await ok(await shop.post(f"{SW}/work/retry", json={"status": ["failed"]}))
    assert (await listed(shop, status="pending", limit="1"))[0] == [(1, "pending")]


async def test_operators_delete_by_filter(shop: TestClient) -> None:
    answer = await ok(await shop.post(f"{SW}/work/delete", json={"status": ["pending"], "source": "app"}))
    assert answer == {"deleted": [5, 6, 7, 8], "next_after": None}
    answer = await ok(await shop.post(f"{SW}/work/delete", json={"ids": [3, 99]}))
    assert answer["deleted"] == [3]
    claimed = (await ok(await shop.post(f"{SW}/claim", params={"limit": "10"})))["messages"]
    assert [m["id"] for m in claimed] == [1, 2, 4]
    answer = await ok(await shop.post(f"{SW}/work/delete", json={"status": ["in_flight"], "limit": 1}))
    assert answer == {"deleted": [1], "next_after": 1}
    info = await ok(await shop.get(SW))
    assert info["work"]["in_flight"] == 2


@pytest.mark.parametrize(
    ("verb", "body", "field"),
    [
        ("delete", {}, "status"),
        ("delete", {"status": ["gone"]}, "status"),
        ("delete", {"status": "pending"}, "status"),
        ("retry", {"status": ["in_flight"]}, "status"),
        ("retry", {"limit": 0}, "limit"),
        ("retry", {"after": -1}, "after"),
        ("retry", {"ids": ["1"]}, "ids"),
        ("retry", {"segments": [0, 1]}, "segments"),
        ("retry", {"headers": {"k": 1}}, "headers"),
        ("retry", {"json": ["a"]}, "json"),
        ("retry", {"source": 5}, "source"),
        ("retry", {"at": "tomorrow"}, "at"),
        ("retry", {"at": 1, "delay": 1}, "delay"),
        ("retry", {"everything": True}, "everything"),
    ],
)
async def test_bad_operator_requests(shop: TestClient, verb: str, body: dict[str, Any], field: str) -> None:
    error = await error_of(await shop.post(f"{SW}/work/{verb}", json=body), 400)
    assert (error["code"], error["field"]) == ("invalid_request", field)


async def test_bad_operator_queries(shop: TestClient) -> None:
    for params in ({"status": "gone"}, {"after": "x"}, {"segments": "a"}, {"color": "red"}):
        assert (await shop.get(f"{SW}/work", params=params)).status == 400, params
    await ok(await shop.put("/v1/queues/shop/subscriptions/c", json={}), 201)
    resp = await shop.get("/v1/queues/shop/subscriptions/c/work")
    assert (await error_of(resp, 409))["code"] == "wrong_subscription_mode"


async def test_metrics_of_work_queues_and_schedules(q: TestClient) -> None:
    (m1, m2) = await claim(q, limit="2")
    await ok(await q.post(f"{W}/ack", json={"receipt": m1["receipt"]}))
    await ok(await q.post(f"{W}/nack", json={"receipt": m2["receipt"], "delay": "1h"}))
    (m3,) = await claim(q)
    await ok(await q.post(f"{Q}/messages", json={"messages": [{"data": "later", "delay": "1h"}] * 3}))
    scheduled = await ok(await q.get(f"{Q}/scheduled"))
    assert (await q.delete(f"{Q}/scheduled/{scheduled['scheduled'][0]['scheduled_id']}")).status == 204
    samples = parse_metrics(await (await q.get("/metrics")).text())
    labels = 'queue="q",subscription="w"'
    assert samples[f'capella_work_messages{{{labels},state="in_flight"}}'] == 1
    assert samples[f'capella_work_messages{{{labels},state="failed"}}'] == 1
    assert samples[f'capella_work_messages{{{labels},state="dead"}}'] == 0
    assert m3["id"] == 3 and samples[f"capella_work_backlog{{{labels}}}"] == 2  # ids 4 and 5
    assert samples[f"capella_work_claimed_total{{{labels}}}"] == 3
    assert samples[f"capella_work_acked_total{{{labels}}}"] == 1
    assert samples[f"capella_work_nacked_total{{{labels}}}"] == 1
    assert samples[f"capella_work_dead_lettered_total{{{labels}}}"] == 0
    assert samples['capella_scheduled_messages{queue="q"}'] == 2
    assert samples['capella_scheduled_total{queue="q"}'] == 3
    assert samples['capella_scheduled_cancelled_total{queue="q"}'] == 1
    assert samples['capella_released_total{queue="q"}'] == 0
    assert samples['capella_scheduled_overdue_seconds{queue="q"}'] == 0
    assert samples['capella_subscription_last_id{queue="q",subscription="w",replica="false"}'] == 1
    assert samples[f"capella_work_redelivered_total{{{labels}}}"] == 0
    await ok(await q.post(f"{W}/nack", json={"receipt": m3["receipt"], "delay": "0s"}))
    (again,) = await claim(q)
    samples = parse_metrics(await (await q.get("/metrics")).text())
    assert again["id"] == 3 and samples[f"capella_work_redelivered_total{{{labels}}}"] == 1
