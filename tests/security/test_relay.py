"""A link's far-side authority in the hands of a narrow user: the relay and nested calls narrow it.

Real servers on loopback: ``near`` (auth on, the original protocol on, a user ``dev`` with the
narrow rules of issue 20 plus what each test grants) holds the link ``toB`` to ``far`` (auth
on), signed in there as ``link``, a far *admin*: the link an operator should not make, and the
one that shows what a relay could hand out. ``edge`` has authentication off (the loopback
default) and the same link. A recording server (``support/receiver.py``) stands in for a far
side of the attacker's own, to see what left the broker and to answer what the attacker likes.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from support.original import call, envelope
from support.receiver import Received, listening
from support.servers import ServerProcess, running

from security.conftest import ADMIN_PASSWORD, DEV_PASSWORD, DEV_RULES, Answer, Secured

LINK_PASSWORD = "link-password-of-a-far-admin"
EGRESS = '[egress]\nallow = ["127.0.0.0/8"]\n'
ORIGINAL = "[compat]\noriginal = true\n"
SECURITY_HEADERS = ("X-Content-Type-Options", "Content-Security-Policy")
AUTH = '[auth]\nenabled = true\nbootstrap_user = "admin"\nbootstrap_password_env = "CAPELLA_ADMIN_PASSWORD"\n'
# What relays before (write) and after (relay) the change: an attack test shows the attack itself
# succeeding on the old code, not a refusal for the other right.
BOTH = "allow:external_cluster:write:{name} allow:external_cluster:relay:{name}"
CROSS_SITE = {"Sec-Fetch-Site": "cross-site", "Origin": "https://evil.example"}
PERMISSION_DENIED = 10110000  # capella/api/original/codes.py
INVALID = 10990006


def start(tmp: Path, name: str, extra: str, auth: bool = True) -> Iterator[ServerProcess]:
    config = tmp / f"{name}.toml"
    login = AUTH if auth else ""
    config.write_text(f'[cluster]\nname = "{name}"\n{login}{extra}')
    return running(ServerProcess(tmp / name, config=config, env={"CAPELLA_ADMIN_PASSWORD": ADMIN_PASSWORD}))


@dataclass
class Sites:
    near: Secured
    far: Secured
    edge: Secured  # authentication off: call it with user=None

    def grant(self, *rules: str) -> None:
        """``dev`` on ``near`` holds DEV_RULES and ``rules``, no more."""
        got = self.near.call(
            "PUT", "/v1/users/dev", {"password": DEV_PASSWORD, "rules": [*DEV_RULES, *rules]}, user="admin"
        )
        assert got.status == 200, got.body


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sites]:
    tmp = tmp_path_factory.mktemp("relay")
    lifetimes = [
        start(tmp, "near", EGRESS + ORIGINAL),
        start(tmp, "far", ORIGINAL),
        start(tmp, "edge", EGRESS, auth=False),
    ]
    near, far, edge = (Secured(server, server.url) for server in map(next, lifetimes))
    try:
        made = far.call("PUT", "/v1/users/link", {"password": LINK_PASSWORD, "admin": True}, user="admin")
        assert made.status == 201, made.body
        dev = near.call("PUT", "/v1/users/dev", {"password": DEV_PASSWORD, "rules": DEV_RULES}, user="admin")
        assert dev.status == 201, dev.body
        link = {"url": far.url, "username": "link", "password": LINK_PASSWORD}
        assert near.call("PUT", "/v1/clusters/toB", link, user="admin").status == 201
        assert edge.call("PUT", "/v1/clusters/toB", link, user=None).status == 201
        assert far.call("PUT", "/v1/queues/dev-orders", {}, user="admin").status == 201
        yield Sites(near, far, edge)
    finally:
        for lifetime in lifetimes:
            for _ in lifetime:
                pass


# --- the right to relay ----------------------------------------------------------------------


def test_external_cluster_write_alone_no_longer_relays_and_relay_does(sites: Sites) -> None:
    far_queues = "/v1/clusters/toB/v1/queues"
    sites.grant("allow:external_cluster:write:toB")
    refused = sites.near.call("GET", far_queues)
    assert refused.status == 403 and refused.body["error"]["code"] == "forbidden", refused.body
    assert refused.body["error"]["action"] == "relay"
    # Neither a * type nor admin on the link grants it.
    sites.grant("allow:*:*:*", "allow:external_cluster:admin:toB")
    assert sites.near.call("GET", far_queues).status == 403
    sites.grant("allow:external_cluster:relay:toB")
    allowed = sites.near.call("GET", far_queues)
    assert allowed.status == 200 and "dev-orders" in json.dumps(allowed.body), allowed.body
    sites.grant("allow:external_cluster:*:toB")
    assert sites.near.call("GET", far_queues).status == 200


def test_far_tokens_and_users_are_never_relayed(sites: Sites) -> None:
    sites.grant(*BOTH.format(name="toB").split())
    token = sites.near.call("POST", "/v1/clusters/toB/v1/tokens", {"ttl": "365d"})
    assert token.status == 403 and token.body["error"]["code"] == "relay_refused", token.body
    evil = sites.near.call(
        "PUT", "/v1/clusters/toB/v1/users/evil", {"password": "evil-password", "admin": True}
    )
    assert evil.status == 403 and evil.body["error"]["code"] == "relay_refused", evil.body
    assert sites.far.call("GET", "/v1/users/evil", user="admin").status == 404
    assert sites.far.call("GET", "/v1/tokens", user="admin").body["tokens"] == []
    # Not through more hops either (refused here, before any cluster is looked up), nor for an admin.
    for path in (
        "/v1/clusters/toB/v1/clusters/toC/v1/tokens",
        "/v1/clusters/toB/v1/users",
        "/v1/clusters/toB/v1/tokens/x",
    ):
        for user in ("dev", "admin"):
            got = sites.near.call("GET", path, user=user)
            assert got.status == 403 and got.body["error"]["code"] == "relay_refused", (path, user, got.body)
    # /v1/me only reads who the link signs in as.
    me = sites.near.call("GET", "/v1/clusters/toB/v1/me")
    assert me.status == 200 and me.body["user"] == "link", me.body


# --- paths that change their segments ---------------------------------------------------------

TRICKS = [
    "queues/..%2F..%2Fmetrics",
    "%2e%2e/metrics",
    "queues/%2E%2E/%2e%2e/metrics",
    "queues/../../metrics",
    "queues/./dev-orders",
    "./queues",
    "queues%2Fdev-orders",
    "queues%2fdev-orders",
    "queues\\..\\..\\metrics",
    "queues%5C..%5Cmetrics",
    "queues%5c..",
    "queues//dev-orders",
    "queues/dev-orders/",
    "queues/%252e%252e/%252e%252e/metrics",
    "%75sers",  # "users", one letter encoded
    "queues/.hidden",
    "queues/dev%00orders",
]


@dataclass
class Far:
    """A far side of the attacker's own: answers /v1/me as a Capella would, and ``answer`` else."""

    url: str
    seen: list[Received]
    answer: Callable[[web.Request], Awaitable[web.StreamResponse]]


@pytest.fixture
async def attacker() -> AsyncIterator[Far]:
    async def fixed(request: web.Request) -> web.StreamResponse:
        return web.json_response({"queues": []})

    far = Far("", [], fixed)

    async def handle(request: web.Request) -> web.StreamResponse:
        if request.path == "/v1/me":
            return web.json_response(
                {"user": "x", "admin": False, "via": "basic", "rules": [], "cluster": "evil"}
            )
        far.seen.append(await Received.of(request))
        return await far.answer(request)

    async with listening(handle) as port:
        far.url = f"http://127.0.0.1:{port}"
        yield far


async def raw_get(url: str, target: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    """One GET with ``target`` sent byte for byte (no client normalizes it); HTTP/1.0, so the
    answer is not chunked."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        writer.write(
            f"GET {target} HTTP/1.0\r\nHost: {host}:{port}\r\n{head}Connection: close\r\n\r\n".encode()
        )
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()
    top, _, body = answer.partition(b"\r\n\r\n")
    lines = top.decode("latin-1").split("\r\n")
    got = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), got, body


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


async def test_paths_that_change_their_segments_are_refused_and_never_leave(
    sites: Sites, attacker: Far
) -> None:
    define = {"url": attacker.url}
    assert (
        await asyncio.to_thread(sites.near.call, "PUT", "/v1/clusters/evil", define, user="admin")
    ).status in (200, 201)
    await asyncio.to_thread(sites.grant, *BOTH.format(name="evil").split())
    for trick in TRICKS:
        status, _, body = await raw_get(
            sites.near.url, f"/v1/clusters/evil/v1/{trick}", basic("dev", DEV_PASSWORD)
        )
        error = json.loads(body)["error"]
        assert (status, error["code"]) == (400, "invalid_relay_path"), (trick, status, error)
    assert attacker.seen == []
    # A plain path still goes through, with its query.
    status, _, _ = await raw_get(
        sites.near.url, "/v1/clusters/evil/v1/queues?limit=5", basic("dev", DEV_PASSWORD)
    )
    assert status == 200 and [r.path for r in attacker.seen] == ["/v1/queues?limit=5"]


# --- what comes back ----------------------------------------------------------------------------


async def test_a_far_page_comes_back_as_an_attachment_never_rendered_here(
    sites: Sites, attacker: Far
) -> None:
    async def page(request: web.Request) -> web.StreamResponse:
        if request.path == "/v1/queues/json":
            return web.Response(
                body=b'{"fine": true}', headers={"Content-Type": "application/json; charset=utf-7"}
            )
        return web.Response(body=b"<script>steal(document.cookie)</script>", content_type="text/html")

    attacker.answer = page
    assert (
        await asyncio.to_thread(sites.edge.call, "PUT", "/v1/clusters/evil", {"url": attacker.url}, user=None)
    ).status in (200, 201)
    status, headers, body = await raw_get(sites.edge.url, "/v1/clusters/evil/v1/queues/page", {})
    assert status == 200 and body == b"<script>steal(document.cookie)</script>"
    assert headers["Content-Type"] == "application/octet-stream", headers
    assert headers["Content-Disposition"] == "attachment"
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert "default-src 'none'" in headers["Content-Security-Policy"]
    # Capella's own types pass, as the type alone (no far charset).
    status, headers, body = await raw_get(sites.edge.url, "/v1/clusters/evil/v1/queues/json", {})
    assert (
        status == 200 and headers["Content-Type"] == "application/json" and json.loads(body) == {"fine": True}
    )
    assert "Content-Disposition" not in headers


async def test_a_far_redirect_is_a_502_without_its_location(sites: Sites, attacker: Far) -> None:
    async def redirect(request: web.Request) -> web.StreamResponse:
        return web.Response(status=302, headers={"Location": "https://evil.example/phish"})

    attacker.answer = redirect
    assert (
        await asyncio.to_thread(sites.edge.call, "PUT", "/v1/clusters/evil", {"url": attacker.url}, user=None)
    ).status in (200, 201)
    status, headers, body = await raw_get(sites.edge.url, "/v1/clusters/evil/v1/queues", {})
    assert status == 502 and "Location" not in headers, (status, headers)
    error = json.loads(body)["error"]
    assert error["code"] == "unreachable" and "redirect" in error["message"], error
    assert len(attacker.seen) == 1


# --- every answer ---------------------------------------------------------------------------------


def test_every_answer_says_nosniff_and_forbids_rendering(sites: Sites) -> None:
    near = sites.near
    sites.grant()
    ping = json.dumps(envelope("ping", user="admin", password=ADMIN_PASSWORD)).encode()
    answers: dict[str, Answer] = {
        "ok": near.call("GET", "/v1/queues", user="admin"),
        "public": near.call("GET", "/readyz", user=None),
        "401": near.call("GET", "/v1/queues", user=None),
        "403": near.call("GET", "/v1/clusters/toB", user="dev"),
        "404": near.call("GET", "/v1/no-such-thing", user="admin"),
        "400": near.call("GET", "/v1/clusters/toB/v1/a%2Fb", user="admin"),
        "relayed": near.call("GET", "/v1/clusters/toB/v1/queues", user="admin"),
        "original": near.call("POST", "/cluster", data=ping, user=None),
        "cross-site": near.call("DELETE", "/v1/queues/dev-x", headers=CROSS_SITE),
    }
    for what, answer in answers.items():
        assert answer.headers.get("X-Content-Type-Options") == "nosniff", (what, answer.headers)
        policy = answer.headers.get("Content-Security-Policy", "")
        assert "default-src 'none'" in policy and "frame-ancestors 'none'" in policy, (what, policy)
    statuses = {what: answer.status for what, answer in answers.items()}
    assert statuses == {
        "ok": 200,
        "public": 200,
        "401": 401,
        "403": 403,
        "404": 404,
        "400": 400,
        "relayed": 200,
        "original": 200,
        "cross-site": 403,
    }
    # The console keeps its own policy, which lets its scripts run.
    console = near.call("GET", "/ui/", user=None)
    assert "script-src 'self'" in console.headers["Content-Security-Policy"], console.headers
    assert console.headers["X-Content-Type-Options"] == "nosniff"


async def test_a_request_that_is_not_http_is_answered_with_the_headers_too(sites: Sites) -> None:
    host, port = sites.near.url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n")
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 30)
    writer.close()
    assert (
        answer.split(b"\r\n")[0].endswith(b" 400 Bad Request")
        and b"X-Content-Type-Options: nosniff" in answer
    ), answer


async def test_a_connection_over_the_cap_is_refused_with_the_headers_too(tmp_path: Path) -> None:
    # The 503 (and the 408 of a slow head) is written straight to the socket, not by the app.
    lifetime = start(tmp_path, "capped", "[server]\nmax_connections = 1\n", auth=False)
    server = await asyncio.to_thread(next, lifetime)
    try:
        held = await asyncio.open_connection("127.0.0.1", server.port)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        answer = await asyncio.wait_for(reader.read(), 30)
        writer.close()
        held[1].close()
        assert b" 503 " in answer.split(b"\r\n")[0] and b"too_many_connections" in answer, answer
        assert b"X-Content-Type-Options: nosniff\r\n" in answer and b"default-src 'none'" in answer, answer
    finally:
        await asyncio.to_thread(lambda: [None for _ in lifetime])


# --- cross-site writes whatever the method ------------------------------------------------------


def cursor(site: Secured, queue: str, user: str | None) -> int:
    got = site.call("GET", f"/v1/queues/{queue}/subscriptions/reader", user=user)
    assert got.status == 200, got.body
    return int(got.body["last_id"])


def test_an_img_cannot_move_a_cursor_and_a_plain_read_still_can(sites: Sites) -> None:
    edge = sites.edge
    assert edge.call("PUT", "/v1/queues/inbox", {}, user=None).status == 201
    messages = {"messages": [{"data": str(n)} for n in range(4)]}
    assert edge.call("POST", "/v1/queues/inbox/messages", messages, user=None).status == 200
    assert edge.call("PUT", "/v1/queues/inbox/subscriptions/reader", {}, user=None).status in (200, 201)
    read = "/v1/queues/inbox/subscriptions/reader/messages"
    # What an <img src=...> on another site sends: Sec-Fetch-Site, no Origin; older browsers: Origin only.
    for marks in (
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
        {"Origin": "https://evil.example"},
    ):
        for query in ("", "?commit=auto", "?commit=AUTO", "?commit=bogus"):
            got = edge.call("GET", read + query, user=None, headers=marks)
            assert got.status == 403 and got.body["error"]["code"] == "cross_site_request", (
                marks,
                query,
                got.body,
            )
    assert cursor(edge, "inbox", None) == 0
    # Reading without committing is a read, and the same origin (or no browser) still commits.
    assert edge.call("GET", read + "?commit=none", user=None, headers=CROSS_SITE).status == 200
    assert edge.call("GET", read, user=None, headers={"Sec-Fetch-Site": "same-origin"}).status == 200
    assert cursor(edge, "inbox", None) == 4
    # The original protocol's /cluster runs any action, by GET as well.
    got = sites.near.call("GET", "/cluster", user=None, headers={"Sec-Fetch-Site": "cross-site"})
    assert got.status == 403 and got.body["error"]["code"] == "cross_site_request", got.body


def test_a_cross_site_relayed_request_is_refused_whatever_its_method(sites: Sites) -> None:
    far = sites.far
    assert far.call("PUT", "/v1/queues/dev-orders/subscriptions/reader", {}, user="admin").status in (
        200,
        201,
    )
    messages = {"messages": [{"data": str(n)} for n in range(4)]}
    assert far.call("POST", "/v1/queues/dev-orders/messages", messages, user="admin").status == 200
    before = cursor(far, "dev-orders", "admin")
    # Through the auth-off edge: its link's credentials would commit on the auth-on far side.
    relayed = "/v1/clusters/toB/v1/queues/dev-orders/subscriptions/reader/messages"
    for method in ("GET", "HEAD"):
        got = sites.edge.call(
            method, relayed + "?commit=none", user=None, headers={"Sec-Fetch-Site": "cross-site"}
        )
        assert got.status == 403, (method, got.status)
    got = sites.edge.call("GET", relayed, user=None, headers=CROSS_SITE)
    assert got.body["error"]["code"] == "cross_site_request", got.body
    assert cursor(far, "dev-orders", "admin") == before
    # With auth on, refused before the login.
    sites.grant(*BOTH.format(name="toB").split())
    assert sites.near.call("GET", "/v1/clusters/toB/v1/queues", headers=CROSS_SITE).status == 403
    assert sites.near.call("GET", "/v1/clusters/toB/v1/queues").status == 200


# --- the original protocol's nested calls --------------------------------------------------------


def cluster_call(site: Secured, sent: dict[str, Any]) -> dict[str, Any]:
    return call(site.url, sent)


def dev_call(site: Secured, action: str, body: object = None, object_name: str = "") -> dict[str, Any]:
    return cluster_call(
        site, envelope(action, body, user="dev", password=DEV_PASSWORD, object_name=object_name)
    )


ADD_USER = {"action": "SecurityATCB_add_use_cluster", "body": {"name": "evil", "pwd": "evil-password"}}


def test_nested_calls_need_relay_not_write(sites: Sites) -> None:
    sites.grant("allow:external_cluster:write:toB")
    refused = dev_call(sites.near, "nested_call", {"action": "ping"}, "toB")
    assert refused["error"]["code"] == PERMISSION_DENIED, refused
    assert (
        dev_call(sites.near, "q_get", {"id_start": 0, "cnt_limit": 1}, "toB/dev-orders")["error"]["code"]
        == PERMISSION_DENIED
    )
    sites.grant("allow:external_cluster:relay:toB")
    assert dev_call(sites.near, "nested_call", {"action": "ping"}, "toB")["error"] is None
    assert dev_call(sites.near, "q_get", {"id_start": 0, "cnt_limit": 1}, "toB/dev-orders")["error"] is None
    listed = dev_call(sites.near, "nested_call", {"action": "list_q"}, "toB")
    assert listed["error"] is None and "dev-orders" in listed["body"], listed


def test_nested_calls_never_reach_far_users(sites: Sites) -> None:
    sites.grant(*BOTH.format(name="toB").split())
    nested = [
        ADD_USER,
        {"action": "nested_call", "object_name": "toC", "body": ADD_USER},  # peeled: the last hop's body
        {"action": "SecurityATRZ_set_user_admin", "body": {"name": "dev", "is_admin": True}},
    ]
    for body in nested:
        for who, password in (("dev", DEV_PASSWORD), ("admin", ADMIN_PASSWORD)):
            got = cluster_call(
                sites.near, envelope("nested_call", body, user=who, password=password, object_name="toB")
            )
            assert got["error"]["code"] == PERMISSION_DENIED, (body, who, got)
            assert "never run through an external cluster" in got["error"]["msg"], got
    # A far side refuses them too when another cluster sent them on (for a sender that did not check).
    sent_on = {
        **envelope(ADD_USER["action"], ADD_USER["body"], user="admin", password=ADMIN_PASSWORD),
        "hops": ["near"],
    }
    assert cluster_call(sites.far, sent_on)["error"]["code"] == PERMISSION_DENIED
    assert sites.far.call("GET", "/v1/users/evil", user="admin").status == 404


def test_a_malformed_nested_body_is_a_client_error_and_no_traceback(sites: Sites) -> None:
    sites.grant(*BOTH.format(name="toB").split())
    for body in (7, "ping", [1, 2], {"action": 5}, {"action": "ping", "object_name": ["x"]}):
        got = dev_call(sites.near, "nested_call", body, "toB")
        assert got["error"]["code"] == INVALID, (body, got)
        assert "not a request" in got["error"]["msg"], got
    log = sites.near.server.log()
    assert "Traceback" not in log and "original call failed" not in log, log[-3000:]
