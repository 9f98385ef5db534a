"""Queues over HTTP: create, update, describe, list, drop, and every error they answer."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from support.http import only_error_of


async def test_put_creates_then_updates(api: TestClient) -> None:
    resp = await api.put("/v1/queues/orders", json={"block": {"max_messages": 5}, "save": "mark"})
    assert resp.status == 201
    info = await resp.json()
    assert info["name"] == "orders"
    assert info["definition"]["block"]["max_messages"] == 5
    assert info["definition"]["save"] == "mark"
    assert info["stats"]["last_id"] == 0
    assert info["stats"]["messages"] == 0

    resp = await api.put("/v1/queues/orders", json={"block": {"max_bytes": "1MiB", "max_age": "1h"}})
    assert resp.status == 200
    definition = (await resp.json())["definition"]
    assert definition["block"] == {"max_messages": 5, "max_bytes": 1024 * 1024, "max_age": 3600.0}


async def test_put_with_an_empty_body_uses_the_defaults(api: TestClient) -> None:
    resp = await api.put("/v1/queues/plain")
    assert resp.status == 201
    assert (await resp.json())["definition"]["save"] == "wait"


async def test_get_and_list(api: TestClient) -> None:
    for name in ("zeta", "alpha"):
        assert (await api.put(f"/v1/queues/{name}", json={})).status == 201
    await api.post("/v1/queues/alpha/messages", json={"data": "x"})
    resp = await api.get("/v1/queues/alpha")
    assert resp.status == 200
    info = await resp.json()
    assert info["stats"]["last_id"] == 1
    assert info["stats"]["messages"] == 1
    resp = await api.get("/v1/queues")
    assert [q["name"] for q in (await resp.json())["queues"]] == ["alpha", "zeta"]


async def test_delete(api: TestClient) -> None:
    await api.put("/v1/queues/gone", json={})
    resp = await api.delete("/v1/queues/gone")
    assert resp.status == 204
    assert (await only_error_of(await api.get("/v1/queues/gone"), 404))["code"] == "queue_not_found"
    assert (await only_error_of(await api.delete("/v1/queues/gone"), 404))["code"] == "queue_not_found"


async def test_unknown_queue_is_404(api: TestClient) -> None:
    for resp in (
        await api.get("/v1/queues/nope"),
        await api.post("/v1/queues/nope/messages", json={"data": "x"}),
        await api.get("/v1/queues/nope/messages"),
        await api.get("/v1/queues/nope/stream"),
        await api.get("/v1/queues/nope/subscriptions"),
        await api.get("/v1/queues/nope/replicas", params={"id": "1"}),
    ):
        assert (await only_error_of(resp, 404))["code"] == "queue_not_found"


async def test_bad_queue_name_is_invalid_name(api: TestClient) -> None:
    for name in (".hidden", "-dash", "a" * 129, "sp%20ace"):
        error = await only_error_of(await api.put(f"/v1/queues/{name}", json={}), 400)
        assert error["code"] == "invalid_name", name


async def test_bad_definitions(api: TestClient) -> None:
    cases: list[tuple[Any, str]] = [
        ({"colour": "blue"}, "invalid_request"),
        ({"block": {"max_messages": 0}}, "invalid_request"),
        ({"block": {"max_bytes": "lots"}}, "invalid_request"),
        ({"save": "sometimes"}, "invalid_save_mode"),
        ({"segments": {"min": 5, "max": 1}}, "invalid_request"),
        ({"mounts": {"meta": "nowhere"}}, "invalid_request"),
        ([1, 2], "invalid_request"),
    ]
    for body, code in cases:
        error = await only_error_of(await api.put("/v1/queues/q", json=body), 400)
        assert error["code"] == code, body
    assert (await api.get("/v1/queues/q")).status == 404


async def test_limits_past_a_float_are_400_not_500_or_null(api: TestClient) -> None:
    # Found by test_fuzz.py: enough digits make float() inf. A size then raised OverflowError
    # (500) and an age was stored as inf, which the definition's JSON holds as null.
    for limits in ({"max_bytes": "9" * 400}, {"max_age": "9" * 400}, {"max_age": "9" * 400 + "s"}):
        error = await only_error_of(await api.put("/v1/queues/q", json={"limits": limits}), 400)
        assert error["code"] == "invalid_request", limits
    assert (await api.get("/v1/queues/q")).status == 404


async def test_invalid_json_body(api: TestClient) -> None:
    resp = await api.put("/v1/queues/q", data=b"{not json", headers={"Content-Type": "application/json"})
    error = await only_error_of(resp, 400)
    assert error["code"] == "invalid_request"
    assert "JSON" in error["message"]


@pytest.mark.parametrize("mounts", [{"meta": {}}, {"marks": {"0": []}}])
async def test_a_mount_name_that_is_not_a_string_is_400_not_500(api: TestClient, mounts: object) -> None:
    # Found by test_fuzz.py: a dict looked up in the set of mount names raised TypeError.
    resp = await api.put("/v1/queues/q", json={"mounts": mounts})

    assert resp.status == 400
    assert (await resp.json())["error"]["code"] == "invalid_request"
