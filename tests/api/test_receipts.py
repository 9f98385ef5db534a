"""Cross-datacenter receipts: a producer waits until N replica subscriptions have its message."""

from __future__ import annotations

import asyncio
from typing import Any


async def test_produce_waits_for_replica_subscriptions(api: Any) -> None:
    await api.put("/v1/queues/orders", json={})
    await api.put("/v1/queues/orders/subscriptions/dc2", json={"replica": True})
    await api.put("/v1/queues/orders/subscriptions/reader", json={"replica": False})

    async def confirm_later() -> None:
        # Paced: the producer must still be waiting when each subscription moves.
        await asyncio.sleep(0.1)
        await api.put("/v1/queues/orders/subscriptions/reader", json={"last_id": 1})  # not a replica
        await asyncio.sleep(0.1)
        await api.put("/v1/queues/orders/subscriptions/dc2", json={"last_id": 1})

    confirmer = asyncio.create_task(confirm_later())
    started = asyncio.get_running_loop().time()
    resp = await api.post("/v1/queues/orders/messages?replicas=1&replica_timeout=2", json={"data": "a"})
    body = await resp.json()
    await confirmer
    assert resp.status == 200
    assert body["results"] == [{"id": 1, "duplicate": False}]
    assert body["replicas"] == {"required": 1, "count": 1, "subscriptions": ["dc2"]}
    assert asyncio.get_running_loop().time() - started >= 0.15


async def test_a_receipt_that_times_out_says_how_many_have_it(api: Any) -> None:
    await api.put("/v1/queues/orders", json={})
    await api.put("/v1/queues/orders/subscriptions/dc2", json={"replica": True, "last_id": 100})
    resp = await api.post("/v1/queues/orders/messages?replicas=2&replica_timeout=0.2", json={"data": "a"})
    assert resp.status == 200
    assert (await resp.json())["replicas"] == {"required": 2, "count": 1, "subscriptions": ["dc2"]}


async def test_bad_receipt_parameters_are_refused(api: Any) -> None:
    await api.put("/v1/queues/orders", json={})
    for query in ("replicas=-1", "replicas=many", "replicas=1&replica_timeout=soon"):
        resp = await api.post(f"/v1/queues/orders/messages?{query}", json={"data": "a"})
        assert resp.status == 400, query
        assert (await resp.json())["error"]["code"] == "invalid_request"
    assert (await (await api.get("/v1/queues/orders")).json())["stats"]["last_id"] == 0
