"""Topics over HTTP: define, grow, describe, list, drop; their partitions as queues; access."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from support.http import only_error_of
from support.supervisor import launched

from capella.api import create_app
from capella.auth.authenticator import Authenticator
from capella.auth.store import AuthStore
from capella.config import AuthSettings, ServerSettings
from capella.core.cluster import Cluster

Client = TestClient[web.Request, web.Application]


async def test_put_creates_then_grows_and_updates(api: Client) -> None:
    resp = await api.put("/v1/topics/orders", json={"partitions": 2, "queue": {"save": "mark"}})
    assert resp.status == 201, await resp.text()
    info = await resp.json()
    assert (info["name"], info["partitions"], info["queues"]) == ("orders", 2, ["orders~0", "orders~1"])
    assert info["definition"]["save"] == "mark" and info["definition"]["storage"] == "local"

    resp = await api.put("/v1/topics/orders", json={"partitions": 3})
    assert resp.status == 200
    info = await resp.json()
    assert info["queues"] == ["orders~0", "orders~1", "orders~2"] and info["definition"]["save"] == "mark"
    queues = (await (await api.get("/v1/queues")).json())["queues"]
    assert [(q["name"], q["definition"]["save"]) for q in queues] == [
        (f"orders~{n}", "mark") for n in range(3)
    ]

    assert (await (await api.get("/v1/topics/orders")).json()) == info
    assert (await (await api.get("/v1/topics")).json()) == {"topics": [info]}


async def test_drop_removes_the_topic_and_its_partitions(api: Client) -> None:
    await api.put("/v1/topics/orders", json={"partitions": 2})
    await api.post("/v1/queues/orders~1/messages", json={"data": "x"})
    assert (await api.delete("/v1/topics/orders")).status == 204
    assert (await only_error_of(await api.get("/v1/topics/orders"), 404))["code"] == "topic_not_found"
    assert (await only_error_of(await api.get("/v1/queues/orders~1"), 404))["code"] == "queue_not_found"
    assert (await only_error_of(await api.delete("/v1/topics/orders"), 404))["code"] == "topic_not_found"
    assert (await (await api.get("/v1/queues")).json()) == {"queues": []}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "partitions"),
        ({"partitions": 0}, "partitions"),
        ({"partitions": 1001}, "partitions"),
        ({"partitions": "2"}, "partitions"),
        ({"partitions": 2, "extra": 1}, "extra"),
        ({"partitions": 2, "queue": {"save": "sometimes"}}, "save"),
        ({"partitions": 2, "queue": {"storage": "shared"}}, "queue.storage"),
        ({"partitions": 2, "queue": {"mounts": {"meta": "nowhere"}}}, "mounts.meta"),
    ],
)
async def test_a_bad_definition_is_a_400_naming_its_field(api: Client, body: object, field: str) -> None:
    error = await only_error_of(await api.put("/v1/topics/orders", json=body), 400)
    assert field in error["message"] or error.get("field") == field, error
    assert (await (await api.get("/v1/queues")).json()) == {"queues": []}


async def test_fewer_partitions_are_refused(api: Client) -> None:
    await api.put("/v1/topics/orders", json={"partitions": 3})
    error = await only_error_of(await api.put("/v1/topics/orders", json={"partitions": 2}), 400)
    assert error["code"] == "invalid_request" and "never removed" in error["message"]
    assert (await (await api.get("/v1/topics/orders")).json())["partitions"] == 3


async def test_a_topic_and_a_queue_never_share_a_name(api: Client) -> None:
    await api.put("/v1/queues/orders", json={})
    error = await only_error_of(await api.put("/v1/topics/orders", json={"partitions": 2}), 409)
    assert error["code"] == "name_taken"
    await api.put("/v1/topics/events", json={"partitions": 2})
    assert (await only_error_of(await api.put("/v1/queues/events", json={}), 409))["code"] == "name_taken"


async def test_a_partition_queue_is_not_created_or_dropped_as_a_queue(api: Client) -> None:
    error = await only_error_of(await api.put("/v1/queues/orders~0", json={}), 400)
    assert (
        error["code"] == "invalid_name"
        and "partition queues come from a topic definition" in error["message"]
    )
    await api.put("/v1/topics/orders", json={"partitions": 1})
    assert (await only_error_of(await api.put("/v1/queues/orders~0", json={}), 400))["code"] == "invalid_name"
    assert (await only_error_of(await api.delete("/v1/queues/orders~0"), 400))["code"] == "invalid_name"
    assert (await api.get("/v1/queues/orders~0")).status == 200


async def test_partition_queues_are_queues_in_every_other_api(api: Client) -> None:
    await api.put("/v1/topics/orders", json={"partitions": 2})
    q = "/v1/queues/orders~1"
    resp = await api.post(
        f"{q}/messages", json={"messages": [{"data": "a"}, {"data": "b", "headers": {"k": "v"}}]}
    )
    assert resp.status == 200, await resp.text()
    page = await (await api.get(f"{q}/messages", params={"after": "0"})).json()
    assert [(m["id"], m["data"]) for m in page["messages"]] == [(1, "a"), (2, "b")]
    assert (await api.put(f"{q}/subscriptions/billing", json={"last_id": 1})).status == 201
    sub = await (await api.get(f"{q}/subscriptions/billing")).json()
    assert (sub["last_id"], sub["lag"]) == (1, 1)
    read = await (await api.get(f"{q}/subscriptions/billing/messages")).json()
    assert [m["data"] for m in read["messages"]] == ["b"]
    # The other partition is a queue of its own.
    assert (await (await api.get("/v1/queues/orders~0")).json())["stats"]["last_id"] == 0
    # A handler names a partition queue as it names any queue.
    copy = {"type": "copy", "queue": "orders~1", "params": {"to": "orders~0"}, "started": False}
    assert (await api.put("/v1/handlers/copy-1", json=copy)).status == 201
    assert (await api.post("/v1/handlers/copy-1/run")).status == 200
    page = await (await api.get("/v1/queues/orders~0/messages", params={"after": "0"})).json()
    assert [m["data"] for m in page["messages"]] == ["a", "b"]


# --- access --------------------------------------------------------------------------------


def basic(name: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{name}:{password}".encode()).decode()}


ROOT = basic("root", "root-password")
BOB = basic("bob", "bob-password")


@pytest.fixture
def users(tmp_path: Path) -> AuthStore:
    store = AuthStore(tmp_path / "auth")
    store.add_user("root", "root-password", admin=True)
    store.add_user("bob", "bob-password")
    return store


@pytest.fixture
async def secured(
    aiohttp_client: Callable[[web.Application], Awaitable[Client]],
    cluster: Cluster,
    users: AuthStore,
    api_settings: ServerSettings,
) -> AsyncIterator[Client]:
    supervisor = await launched(cluster, users=users)
    authenticator = Authenticator(users, AuthSettings(enabled=True, token_ttl=3600))
    yield await aiohttp_client(create_app(cluster, api_settings, supervisor, authenticator=authenticator))
    await supervisor.close()


async def test_a_user_allowed_only_the_topics_name_cannot_make_its_partitions(
    secured: Client, users: AuthStore
) -> None:
    users.put_user("bob", {"rules": ["allow:queue:admin:orders"]})
    resp = await secured.put("/v1/topics/orders", json={"partitions": 2}, headers=BOB)
    error = await only_error_of(resp, 403)
    assert error["code"] == "forbidden" and "orders~0" in error["message"]
    assert (await (await secured.get("/v1/queues", headers=ROOT)).json()) == {"queues": []}

    # One partition short is refused as well: every partition needs the right.
    users.put_user("bob", {"rules": ["allow:queue:admin:orders", "allow:queue:admin:orders~0"]})
    assert (await secured.put("/v1/topics/orders", json={"partitions": 2}, headers=BOB)).status == 403

    users.put_user("bob", {"rules": ["allow:queue:admin:orders*"]})
    assert (await secured.put("/v1/topics/orders", json={"partitions": 2}, headers=BOB)).status == 201
    # Growing needs the new partitions too.
    users.put_user(
        "bob",
        {"rules": ["allow:queue:admin:orders", "allow:queue:admin:orders~0", "allow:queue:admin:orders~1"]},
    )
    assert (await secured.put("/v1/topics/orders", json={"partitions": 3}, headers=BOB)).status == 403
    assert (await secured.delete("/v1/topics/orders", headers=BOB)).status == 204


async def test_dropping_a_topic_needs_every_partition(secured: Client, users: AuthStore) -> None:
    assert (await secured.put("/v1/topics/orders", json={"partitions": 2}, headers=ROOT)).status == 201
    users.put_user("bob", {"rules": ["allow:queue:admin:orders", "allow:queue:admin:orders~0"]})
    assert (await only_error_of(await secured.delete("/v1/topics/orders", headers=BOB), 403))[
        "code"
    ] == "forbidden"
    assert (await secured.get("/v1/topics/orders", headers=ROOT)).status == 200


async def test_reading_topics_and_partitions_follows_queue_read_rules(
    secured: Client, users: AuthStore
) -> None:
    for name in ("orders", "payroll"):
        await secured.put(f"/v1/topics/{name}", json={"partitions": 3}, headers=ROOT)
    await secured.post("/v1/queues/orders~2/messages", json={"data": "x"}, headers=ROOT)
    users.put_user("bob", {"rules": ["allow:queue:read:orders*"]})
    listed = (await (await secured.get("/v1/topics", headers=BOB)).json())["topics"]
    assert [t["name"] for t in listed] == ["orders"]
    assert (await secured.get("/v1/topics/orders", headers=BOB)).status == 200
    assert (await secured.get("/v1/topics/payroll", headers=BOB)).status == 403
    page = await (await secured.get("/v1/queues/orders~2/messages", headers=BOB)).json()
    assert [m["data"] for m in page["messages"]] == ["x"]
    assert (await secured.get("/v1/queues/payroll~2/messages", headers=BOB)).status == 403
    # Reading is not defining.
    assert (await secured.put("/v1/topics/orders", json={"partitions": 4}, headers=BOB)).status == 403
