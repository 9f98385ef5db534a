"""Authentication and authorization over HTTP: the permission matrix for every route, tokens,
user management without privilege escalation, filtered listings, and handlers that run as a
user. A real cluster (memory mount) behind the real aiohttp app with authentication on."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from support.supervisor import launched

from capella.api import create_app
from capella.api.app import ROUTES
from capella.auth.authenticator import Authenticator
from capella.auth.store import AuthStore
from capella.config import AuthSettings, ServerSettings
from capella.core.cluster import Cluster

Client = TestClient[web.Request, web.Application]
MakeClient = Callable[[web.Application], Awaitable[Client]]


def basic(name: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{name}:{password}".encode()).decode()}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


ROOT = basic("root", "root-password")
BOB = basic("bob", "bob-password")


@pytest.fixture
def users(tmp_path: Path) -> AuthStore:
    store = AuthStore(tmp_path / "auth")
    store.add_user("root", "root-password", admin=True)
    store.add_user("bob", "bob-password")
    return store


@pytest.fixture
async def secured_api(
    aiohttp_client: MakeClient, cluster: Cluster, users: AuthStore, api_settings: ServerSettings
) -> AsyncIterator[Client]:
    supervisor = await launched(cluster, users=users)
    authenticator = Authenticator(users, AuthSettings(enabled=True, token_ttl=3600))
    yield await aiohttp_client(create_app(cluster, api_settings, supervisor, authenticator=authenticator))
    await supervisor.close()


def set_rules(users: AuthStore, name: str, *rules: str) -> None:
    users.put_user(name, {"rules": list(rules)})


# --- the matrix --------------------------------------------------------------------------

NAMES = {"queue": "orders", "name": "target", "id": "0123456789abcdef", "cluster": "test", "path": "queues"}
NAMES["topic"] = "events"
BODIES: dict[tuple[str, str], Any] = {
    ("POST", "/v1/queues/{queue}/messages"): {"messages": [{"data": "x"}]},
    ("PUT", "/v1/handlers/{name}"): {"type": "flush", "queues": ["orders"], "started": False},
    ("PUT", "/v1/clusters/{name}"): {"url": "http://127.0.0.1:9"},
    ("PUT", "/v1/users/{name}"): {"password": "target-password"},
    ("POST", "/v1/users/{name}/password"): {"password": "target-password-2"},
    ("PUT", "/v1/topics/{topic}"): {"partitions": 2},
}
# Beside its route's need, defining or dropping a topic needs queue admin on every partition
# (the handler checks them: they follow from the body or the topic, not from the path).
PARTITION_RULES = ["allow:queue:admin:events~0", "allow:queue:admin:events~1"]
EXACT_EXTRA = {
    ("PUT", "/v1/topics/{topic}"): PARTITION_RULES,
    ("DELETE", "/v1/topics/{topic}"): PARTITION_RULES,
}
QUERIES = {("GET", "/v1/queues/{queue}/subscriptions/{name}/messages"): "?commit=none"}
PERMISSIONS = {(r.method, r.path): r.need for r in ROUTES if r.need is not None}
PUBLIC = {(r.method, r.path) for r in ROUTES if r.need is None}
GUARDED = sorted(key for key, needs in PERMISSIONS.items() if needs)
# The relay's cluster points at no server here: its 502 means the access check let the call through.
RELAYED = {key for key in PERMISSIONS if key[1].endswith("/v1/{path}")}


def path_of(template: str) -> str:
    return template.format_map(NAMES)


async def call(client: Client, key: tuple[str, str], headers: dict[str, str]) -> int:
    method, template = key
    body = BODIES.get(key)
    async with client.request(
        method, path_of(template) + QUERIES.get(key, ""), json=body, headers=headers
    ) as resp:
        if resp.status in (401, 403):
            error = (await resp.json())["error"]
            assert error["code"] == ("unauthorized" if resp.status == 401 else "forbidden")
        if resp.status == 401:
            assert "Basic" in resp.headers["WWW-Authenticate"]
        assert resp.status < 500 or (key in RELAYED and resp.status == 502), await resp.text()
        return resp.status


async def prepare(client: Client) -> None:
    """The objects the paths name, so allowed calls reach real things."""
    assert (await client.put("/v1/queues/orders", json={}, headers=ROOT)).status in (200, 201)
    await client.put("/v1/queues/orders/subscriptions/target", json={}, headers=ROOT)
    # Bob's own handler: one that runs as another user needs everything that user holds too
    # (tests/security/test_attenuation.py), beside what the route needs.
    handler = {"type": "flush", "queues": ["orders"], "started": False, "user": "bob"}
    await client.put("/v1/handlers/target", json=handler, headers=ROOT)
    await client.put("/v1/clusters/target", json={"url": "http://127.0.0.1:9"}, headers=ROOT)
    await client.put("/v1/users/target", json={"password": "target-password"}, headers=ROOT)
    await client.put("/v1/topics/events", json={"partitions": 2}, headers=ROOT)


def needed(key: tuple[str, str], pattern: bool) -> list[str]:
    rules = []
    for need in PERMISSIONS[key]:
        name = "*" if pattern else need.name.format_map(NAMES)
        rules.append(f"allow:{need.type}:{need.action}:{name}")
    return rules


def test_every_route_is_public_or_in_the_permission_table(api: Client) -> None:
    routes = {
        (r.method, r.resource.canonical)
        for r in api.app.router.routes()
        if r.resource is not None and r.method != "HEAD"
    }
    assert routes == set(PERMISSIONS) | PUBLIC


@pytest.mark.parametrize("key", GUARDED, ids=lambda k: f"{k[0]} {k[1]}")
async def test_every_guarded_route_allows_denies_and_needs_credentials(
    secured_api: Client, users: AuthStore, key: tuple[str, str]
) -> None:
    await prepare(secured_api)

    assert await call(secured_api, key, {}) == 401
    assert await call(secured_api, key, basic("bob", "wrong-password")) == 401
    set_rules(users, "bob")
    assert await call(secured_api, key, BOB) == 403, "no rule must mean no"
    set_rules(users, "bob", *needed(key, pattern=True), f"deny:{PERMISSIONS[key][-1].type}:*:*")
    assert await call(secured_api, key, BOB) == 403, "deny must win over allow"
    set_rules(
        users, "bob", *needed(key, pattern=False), *EXACT_EXTRA.get(key, []), "allow:queue:read:unrelated"
    )
    assert await call(secured_api, key, BOB) not in (401, 403), "exact allow rules"
    await prepare(secured_api)
    set_rules(users, "bob", *needed(key, pattern=True))
    assert await call(secured_api, key, BOB) not in (401, 403), "wildcard allow rules"
    await prepare(secured_api)
    assert await call(secured_api, key, ROOT) not in (401, 403), "an admin may do everything"


@pytest.mark.parametrize(
    "key", sorted(k for k, needs in PERMISSIONS.items() if not needs), ids=lambda k: f"{k[0]} {k[1]}"
)
async def test_routes_open_to_every_user_still_need_credentials(
    secured_api: Client, key: tuple[str, str]
) -> None:
    assert await call(secured_api, key, {}) == 401
    assert await call(secured_api, key, ROOT) not in (401, 403)


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/v1/openapi.json"])
async def test_public_routes_need_no_credentials(secured_api: Client, path: str) -> None:
    async with secured_api.get(path) as resp:
        assert resp.status == 200


async def test_an_unknown_path_needs_credentials_before_it_is_a_404(secured_api: Client) -> None:
    assert (await secured_api.get("/v1/nothing-here")).status == 401
    assert (await secured_api.get("/v1/nothing-here", headers=ROOT)).status == 404


@pytest.mark.parametrize(
    "header",
    [
        "Basic",
        "Basic !!!notbase64",
        "Basic " + base64.b64encode(b"no-colon").decode(),
        "Basic " + base64.b64encode(b"\xff\xfe:x").decode(),
        "Bearer",
        "Bearer cap_short",
        "Digest username=x",
        "",
        "Basic " + base64.b64encode(b"root:" + b"x" * 5000).decode(),
    ],
)
async def test_malformed_credentials_are_a_401_never_a_crash(secured_api: Client, header: str) -> None:
    async with secured_api.get("/v1/queues", headers={"Authorization": header}) as resp:
        assert resp.status == 401
        assert (await resp.json())["error"]["code"] == "unauthorized"


# --- listings ------------------------------------------------------------------------------


async def test_listings_show_only_what_the_user_may_read(secured_api: Client, users: AuthStore) -> None:
    for name in ("orders", "orders-eu", "payroll"):
        await secured_api.put(f"/v1/queues/{name}", json={}, headers=ROOT)
        await secured_api.put(f"/v1/queues/{name}/subscriptions/s1", json={}, headers=ROOT)
        await secured_api.put(f"/v1/queues/{name}/subscriptions/s2", json={}, headers=ROOT)
        await secured_api.put(
            f"/v1/handlers/flush-{name}",
            json={"type": "flush", "queues": [name], "started": False},
            headers=ROOT,
        )
        await secured_api.put(f"/v1/clusters/dc-{name}", json={"url": "http://127.0.0.1:9"}, headers=ROOT)
    set_rules(
        users,
        "bob",
        "allow:queue:read:orders*",
        "allow:subscription:read:orders/s1",
        "allow:handler:read:flush-payroll",
        "allow:external_cluster:admin:dc-orders-eu",
    )

    async def names(path: str, key: str) -> list[str]:
        async with secured_api.get(path, headers=BOB) as resp:
            assert resp.status == 200
            return [item["name"] for item in (await resp.json())[key]]

    assert await names("/v1/queues", "queues") == ["orders", "orders-eu"]
    assert await names("/v1/queues/orders/subscriptions", "subscriptions") == ["s1"]
    assert await names("/v1/handlers", "handlers") == ["flush-payroll"]
    assert await names("/v1/clusters", "clusters") == ["dc-orders-eu"]
    async with secured_api.get("/v1/queues", headers=ROOT) as resp:
        assert len((await resp.json())["queues"]) == 3


# --- reading with a subscription -------------------------------------------------------------


async def test_reading_with_commit_auto_needs_write_on_the_subscription(
    secured_api: Client, users: AuthStore
) -> None:
    await secured_api.put("/v1/queues/orders", json={}, headers=ROOT)
    set_rules(users, "bob", "allow:queue:read:orders", "allow:subscription:read:orders/*")

    path = "/v1/queues/orders/subscriptions/mine/messages"
    assert (await secured_api.get(path, params={"commit": "none"}, headers=BOB)).status == 200
    assert (await secured_api.get(path, headers=BOB)).status == 403
    set_rules(users, "bob", "allow:queue:read:orders", "allow:subscription:*:orders/*")
    assert (await secured_api.get(path, headers=BOB)).status == 200


# --- tokens ----------------------------------------------------------------------------------


async def test_a_token_from_basic_credentials_works_until_revoked(
    secured_api: Client, users: AuthStore
) -> None:
    set_rules(users, "bob", "allow:queue:read:*")
    async with secured_api.post(
        "/v1/tokens", json={"ttl": "1h", "description": "laptop"}, headers=BOB
    ) as resp:
        assert resp.status == 201
        created = await resp.json()
    assert created["user"] == "bob" and created["token"].startswith("cap_")
    assert created["expires"] - created["created"] == pytest.approx(3600)

    async with secured_api.get("/v1/me", headers=bearer(created["token"])) as resp:
        assert await resp.json() == {
            "user": "bob",
            "admin": False,
            "via": "token",
            "rules": [{"effect": "allow", "type": "queue", "action": "read", "name": "*"}],
            "cluster": "test",
        }
    # A token cannot mint tokens.
    assert (await secured_api.post("/v1/tokens", json={}, headers=bearer(created["token"]))).status == 403
    async with secured_api.get("/v1/tokens", headers=BOB) as resp:
        listed = (await resp.json())["tokens"]
    assert [t["id"] for t in listed] == [created["id"]] and "token" not in listed[0]

    assert (await secured_api.delete(f"/v1/tokens/{created['id']}", headers=BOB)).status == 204
    assert (await secured_api.get("/v1/queues", headers=bearer(created["token"]))).status == 401


async def test_tokens_of_others_are_invisible_except_to_an_admin(secured_api: Client) -> None:
    async with secured_api.post("/v1/tokens", json={}, headers=ROOT) as resp:
        roots = await resp.json()
    async with secured_api.post("/v1/tokens", json={}, headers=BOB) as resp:
        bobs = await resp.json()

    async with secured_api.get("/v1/tokens", headers=BOB) as resp:
        assert [t["id"] for t in (await resp.json())["tokens"]] == [bobs["id"]]
    async with secured_api.get("/v1/tokens", headers=ROOT) as resp:
        assert {t["id"] for t in (await resp.json())["tokens"]} == {roots["id"], bobs["id"]}
    assert (await secured_api.delete(f"/v1/tokens/{roots['id']}", headers=BOB)).status == 404
    assert (await secured_api.delete(f"/v1/tokens/{bobs['id']}", headers=ROOT)).status == 204
    assert (await secured_api.get("/v1/me", headers=bearer(bobs["token"]))).status == 401


async def test_a_token_for_another_user_needs_user_admin(secured_api: Client, users: AuthStore) -> None:
    assert (await secured_api.post("/v1/tokens", json={"user": "root"}, headers=BOB)).status == 403
    async with secured_api.post("/v1/tokens", json={"user": "bob", "ttl": 60}, headers=ROOT) as resp:
        assert resp.status == 201
        token = (await resp.json())["token"]
    async with secured_api.get("/v1/me", headers=bearer(token)) as resp:
        assert (await resp.json())["user"] == "bob"


@pytest.mark.parametrize("body", [{"ttl": 0}, {"ttl": "400d"}, {"ttl": "soon"}, {"user": 5}, {"colour": 1}])
async def test_a_bad_token_request_is_a_400(secured_api: Client, body: dict[str, Any]) -> None:
    async with secured_api.post("/v1/tokens", json=body, headers=ROOT) as resp:
        assert resp.status == 400
        assert (await resp.json())["error"]["code"] == "invalid_request"


# --- users -----------------------------------------------------------------------------------


async def test_a_user_manager_cannot_hand_out_more_than_it_holds(
    secured_api: Client, users: AuthStore
) -> None:
    set_rules(users, "bob", "allow:user:admin:team-*")

    assert (
        await secured_api.put("/v1/users/team-1", json={"password": "team-1-password"}, headers=BOB)
    ).status == 201
    for body in ({"admin": True}, {"rules": ["allow:*:*:*"]}):
        async with secured_api.put("/v1/users/team-1", json=body, headers=BOB) as resp:
            assert resp.status == 403
    assert (await secured_api.put("/v1/users/root", json={"enabled": False}, headers=BOB)).status == 403
    assert (await secured_api.put("/v1/users/team-1", json={"enabled": False}, headers=BOB)).status == 200
    assert (await secured_api.get("/v1/users/root", headers=BOB)).status == 403
    async with secured_api.get("/v1/users", headers=BOB) as resp:
        assert [u["name"] for u in (await resp.json())["users"]] == ["team-1"]


async def test_users_never_show_a_password_or_hash(secured_api: Client) -> None:
    async with secured_api.get("/v1/users", headers=ROOT) as resp:
        text = await resp.text()
    assert "scrypt" not in text and "password" not in text


async def test_changing_your_own_password_needs_the_old_one(secured_api: Client) -> None:
    path = "/v1/users/bob/password"

    assert (await secured_api.post(path, json={"password": "bob-password-2"}, headers=BOB)).status == 403
    body = {"password": "bob-password-2", "old_password": "wrong"}
    assert (await secured_api.post(path, json=body, headers=BOB)).status == 403
    body = {"password": "bob-password-2", "old_password": "bob-password"}
    assert (await secured_api.post(path, json=body, headers=BOB)).status == 200
    assert (await secured_api.get("/v1/me", headers=BOB)).status == 401  # the cached check is gone
    assert (await secured_api.get("/v1/me", headers=basic("bob", "bob-password-2"))).status == 200
    # Someone else's password: only with user admin.
    assert (
        await secured_api.post("/v1/users/root/password", json=body, headers=basic("bob", "bob-password-2"))
    ).status == 403


async def test_a_disabled_user_is_turned_away_at_once(secured_api: Client) -> None:
    assert (await secured_api.get("/v1/me", headers=BOB)).status == 200
    assert (await secured_api.put("/v1/users/bob", json={"enabled": False}, headers=ROOT)).status == 200
    async with secured_api.get("/v1/me", headers=BOB) as resp:
        assert resp.status == 401
        assert (await resp.json())["error"]["message"] == "invalid user name or password"


async def test_the_last_admin_stays(secured_api: Client) -> None:
    async with secured_api.delete("/v1/users/root", headers=ROOT) as resp:
        assert resp.status == 409
        assert (await resp.json())["error"]["code"] == "conflict"


async def test_with_auth_off_everything_is_allowed_and_there_are_no_users(api: Client) -> None:
    async with api.get("/v1/me") as resp:
        me = await resp.json()
        assert me == {"user": None, "admin": True, "via": "none", "rules": [], "cluster": "test"}
    async with api.get("/v1/users") as resp:
        assert resp.status == 404
        assert "authentication is off" in (await resp.json())["error"]["message"]


# --- handlers run as a user ------------------------------------------------------------------


async def test_a_handler_runs_as_its_user_and_within_its_rules(secured_api: Client, users: AuthStore) -> None:
    for name in ("mine", "theirs"):
        await secured_api.put(f"/v1/queues/{name}", json={}, headers=ROOT)
    set_rules(users, "bob", "allow:handler:admin:bob-*", "allow:queue:write:mine")

    definition = {"type": "flush", "queues": ["mine", "theirs"], "started": False}
    async with secured_api.put("/v1/handlers/bob-flush", json=definition, headers=BOB) as resp:
        assert resp.status == 201
        assert (await resp.json())["user"] == "bob"
    async with secured_api.post("/v1/handlers/bob-flush/run", headers=BOB) as resp:
        status = (await resp.json())["status"]
    assert "theirs: user 'bob' may not write it" in status["last_error"]["message"]
    assert "mine" not in status["last_error"]["message"]

    # A pattern skips what the user may not touch instead of failing.
    definition = {"type": "flush", "queues": ["*"], "started": False}
    await secured_api.put("/v1/handlers/bob-all", json=definition, headers=BOB)
    async with secured_api.post("/v1/handlers/bob-all/run", headers=BOB) as resp:
        status = (await resp.json())["status"]
    assert status["last_error"] is None and status["items"] == 1

    # Rules apply as they are now; a disabled user's handler stops working.
    set_rules(users, "bob", "allow:handler:admin:bob-*")
    async with secured_api.post("/v1/handlers/bob-all/run", headers=ROOT) as resp:
        assert (await resp.json())["status"]["items"] == 1  # still the one earlier pass
    users.put_user("bob", {"enabled": False})
    async with secured_api.post("/v1/handlers/bob-all/run", headers=ROOT) as resp:
        error = (await resp.json())["status"]["last_error"]["message"]
    assert error == "handler user 'bob' does not exist or is disabled"


async def test_a_copy_handler_needs_write_on_its_destination(secured_api: Client, users: AuthStore) -> None:
    for name in ("src", "dst"):
        await secured_api.put(f"/v1/queues/{name}", json={}, headers=ROOT)
    await secured_api.post("/v1/queues/src/messages", json={"messages": [{"data": "a"}]}, headers=ROOT)
    set_rules(users, "bob", "allow:handler:admin:*", "allow:queue:read:src", "allow:subscription:write:src/*")
    definition = {"type": "copy", "queues": ["src"], "params": {"to": "dst", "wait": 0}, "started": False}
    await secured_api.put("/v1/handlers/cp", json=definition, headers=BOB)

    async with secured_api.post("/v1/handlers/cp/run", headers=BOB) as resp:
        assert "may not write queue 'dst'" in (await resp.json())["status"]["last_error"]["message"]
    set_rules(
        users,
        "bob",
        "allow:handler:admin:*",
        "allow:queue:read:src",
        "allow:subscription:write:src/*",
        "allow:queue:write:dst",
    )
    async with secured_api.post("/v1/handlers/cp/run", headers=BOB) as resp:
        assert (await resp.json())["status"]["last_error"] is None
    async with secured_api.get("/v1/queues/dst/messages", headers=ROOT) as resp:
        assert [m["data"] for m in (await resp.json())["messages"]] == ["a"]


async def test_a_handler_for_another_user_needs_user_admin(secured_api: Client, users: AuthStore) -> None:
    await secured_api.put("/v1/queues/q", json={}, headers=ROOT)
    set_rules(users, "bob", "allow:handler:admin:*")
    definition = {"type": "flush", "queues": ["q"], "started": False, "user": "root"}

    assert (await secured_api.put("/v1/handlers/escalate", json=definition, headers=BOB)).status == 403
    # A user who does not exist yet is a name too: naming it needs user admin on it.
    later = {**definition, "user": "nobody"}
    assert (await secured_api.put("/v1/handlers/early", json=later, headers=BOB)).status == 403
    async with secured_api.put("/v1/handlers/h", json=later, headers=ROOT) as resp:
        assert resp.status == 201
        waiting = (await resp.json())["status"]["cannot_run"]
        assert waiting == "handler user 'nobody' does not exist or is disabled"
    async with secured_api.put("/v1/handlers/h", json={**definition, "user": "bob"}, headers=ROOT) as resp:
        assert resp.status == 200 and (await resp.json())["user"] == "bob"


# --- work queues ---------------------------------------------------------------------------


async def test_defining_a_work_queue_needs_subscription_admin_and_write_on_its_dead_letters(
    secured_api: Client, users: AuthStore
) -> None:
    for name in ("jobs", "jobs-dead", "payroll"):
        await secured_api.put(f"/v1/queues/{name}", json={}, headers=ROOT)
    path = "/v1/queues/jobs/subscriptions/workers"
    set_rules(users, "bob", "allow:queue:read:jobs", "allow:subscription:write:jobs/*")

    assert (await secured_api.put(path, json={"mode": "ack"}, headers=BOB)).status == 403
    set_rules(
        users,
        "bob",
        "allow:queue:read:jobs",
        "allow:subscription:admin:jobs/*",
        "allow:queue:write:jobs-dead",
    )
    body = {"mode": "ack", "policy": {"dead_letter": "payroll"}}
    async with secured_api.put(path, json=body, headers=BOB) as resp:
        assert resp.status == 403
        assert (await resp.json())["error"]["name"] == "payroll"
    body = {"mode": "ack", "policy": {"dead_letter": "jobs-dead", "max_attempts": 2}}
    assert (await secured_api.put(path, json=body, headers=BOB)).status == 201
    # A worker with write on the subscription claims; without it, it cannot.
    await secured_api.post("/v1/queues/jobs/messages", json={"messages": [{"data": "job"}]}, headers=ROOT)
    set_rules(users, "bob", "allow:queue:read:jobs", "allow:subscription:read:jobs/*")
    assert (await secured_api.post(f"{path}/claim", headers=BOB)).status == 403
    set_rules(users, "bob", "allow:queue:read:jobs", "allow:subscription:write:jobs/*")
    async with secured_api.post(f"{path}/claim", headers=BOB) as resp:
        assert resp.status == 200
