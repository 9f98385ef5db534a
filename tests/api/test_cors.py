"""Browsers on other origins: ``[server.cors]`` against the real app on loopback.

What a browser does is spelled out as requests: a preflight ``OPTIONS`` (no credentials) before
a non-simple request, then the request with its ``Origin``; an ``EventSource`` on the stream,
which reconnects with ``Last-Event-ID`` (not a safelisted header, so it is preflighted too).
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from support.app import signed_in_api

from capella.api import create_app
from capella.config import CorsSettings, ServerSettings, parse_config
from capella.core.cluster import Cluster
from capella.errors import InvalidConfig
from capella.handlers.supervisor import Supervisor

PAGE = "https://console.example.com"
OTHER = "https://evil.example.net"
Q = "/v1/queues/orders"
ROOT = {"Authorization": "Basic " + base64.b64encode(b"root:root-password").decode()}
MakeClient = Callable[[web.Application], Awaitable[TestClient[web.Request, web.Application]]]


def settings(*origins: str) -> ServerSettings:
    return ServerSettings(cors=CorsSettings(origins=origins, max_age=120))


@pytest.fixture
async def listed(
    aiohttp_client: MakeClient, cluster: Cluster, supervisor: Supervisor
) -> TestClient[Any, Any]:
    return await aiohttp_client(create_app(cluster, settings(PAGE), supervisor))


@pytest.fixture
async def secured_api(
    aiohttp_client: MakeClient, cluster: Cluster, tmp_path: Path
) -> AsyncIterator[TestClient[Any, Any]]:
    async with signed_in_api(aiohttp_client, cluster, tmp_path, settings(PAGE)) as api:
        yield api


async def test_a_preflight_from_a_listed_origin_is_answered_without_credentials(
    secured_api: TestClient[Any, Any],
) -> None:
    resp = await preflight(secured_api, f"{Q}/messages", "POST", "authorization, content-type")
    assert resp.status == 204
    assert resp.headers["Access-Control-Allow-Origin"] == PAGE
    assert resp.headers["Access-Control-Allow-Credentials"] == "true"
    assert "POST" in resp.headers["Access-Control-Allow-Methods"]
    assert allowed_headers(resp) >= {"authorization", "content-type"}
    assert resp.headers["Access-Control-Max-Age"] == "120"
    assert resp.headers["Vary"] == "Origin"

    # The request itself still needs credentials, and its answer (an error too) carries the headers.
    resp = await secured_api.put(Q, json={}, headers={"Origin": PAGE})
    assert resp.status == 401
    assert resp.headers["Access-Control-Allow-Origin"] == PAGE
    assert "WWW-Authenticate" in resp.headers["Access-Control-Expose-Headers"]
    resp = await secured_api.put(Q, json={}, headers={"Origin": PAGE, **ROOT})
    assert resp.status == 201
    assert resp.headers["Access-Control-Allow-Origin"] == PAGE
    assert "Origin" in resp.headers["Vary"]


async def test_an_origin_not_listed_gets_no_cors_header(listed: TestClient[Any, Any]) -> None:
    resp = await listed.options(Q, headers={"Origin": OTHER, "Access-Control-Request-Method": "PUT"})
    assert resp.status == 405  # no route answers OPTIONS: the browser refuses the request
    assert "Access-Control-Allow-Origin" not in resp.headers
    assert resp.headers["Vary"] == "Origin"
    # A state-changing request from its pages is refused before it is read (api/browser.py).
    resp = await listed.put(Q, json={}, headers={"Origin": OTHER})
    assert resp.status == 403 and (await resp.json())["error"]["code"] == "cross_site_request"
    assert "Access-Control-Allow-Origin" not in resp.headers
    resp = await listed.get(Q, headers={"Origin": OTHER})
    assert resp.status == 404  # the server answers a read; the browser keeps it from the page
    assert "Access-Control-Allow-Origin" not in resp.headers
    assert resp.headers["Vary"] == "Origin"
    resp = await listed.get("/v1/queues")  # no Origin: not a cross-origin request
    assert "Access-Control-Allow-Origin" not in resp.headers
    assert resp.headers["Vary"] == "Origin"  # a cache must not give this answer to a page


async def test_without_origins_there_is_no_cors(api: TestClient[Any, Any]) -> None:
    resp = await api.options(Q, headers={"Origin": PAGE, "Access-Control-Request-Method": "PUT"})
    assert resp.status == 405 and "Access-Control-Allow-Origin" not in resp.headers


async def test_any_origin_with_auth_off_allows_no_credentials(
    aiohttp_client: MakeClient, cluster: Cluster, supervisor: Supervisor
) -> None:
    client = await aiohttp_client(create_app(cluster, settings("*"), supervisor))
    resp = await client.options(Q, headers={"Origin": OTHER, "Access-Control-Request-Method": "PUT"})
    assert resp.status == 204
    assert resp.headers["Access-Control-Allow-Origin"] == "*"
    assert "Access-Control-Allow-Credentials" not in resp.headers
    resp = await client.get("/v1/queues", headers={"Origin": OTHER})
    assert resp.headers["Access-Control-Allow-Origin"] == "*"
    # Only answers to a request with an Origin carry the header: caches must keep them apart.
    assert resp.headers["Vary"] == "Origin"
    resp = await client.put(Q, json={}, headers={"Origin": OTHER, "Sec-Fetch-Site": "cross-site"})
    assert resp.status == 201  # "*" trusts every page, as it lets every page call the API


async def test_an_event_source_from_a_listed_origin_reads_and_resumes(listed: TestClient[Any, Any]) -> None:
    await listed.put(Q, json={})
    await listed.post(f"{Q}/messages", json={"messages": [{"data": str(i)} for i in range(1, 6)]})

    async def events(last_event_id: str | None) -> list[str]:
        headers = {"Origin": PAGE, "Accept": "text/event-stream"}
        if last_event_id is not None:
            headers["Last-Event-ID"] = last_event_id
        async with listed.get(f"{Q}/stream", headers=headers) as resp:
            assert resp.status == 200
            assert resp.headers["Access-Control-Allow-Origin"] == PAGE
            assert resp.headers["Access-Control-Allow-Credentials"] == "true"
            ids: list[str] = []
            async with asyncio.timeout(5):
                async for line in resp.content:
                    if line.startswith(b"id: "):
                        ids.append(line[4:].strip().decode())
                    if len(ids) == 5 - int(last_event_id or 0):
                        return ids
        return ids

    assert await events(None) == ["1", "2", "3", "4", "5"]
    # The reconnect: Last-Event-ID is not safelisted, so the browser asks first.
    resp = await preflight(listed, f"{Q}/stream", "GET", "last-event-id")
    assert resp.status == 204 and "last-event-id" in allowed_headers(resp)
    assert await events("3") == ["4", "5"]


async def test_a_preflight_allows_a_fixed_list_of_headers_whatever_is_asked(
    listed: TestClient[Any, Any],
) -> None:
    resp = await preflight(listed, f"{Q}/messages", "POST", "capella-header-kind, x-anything, cookie")
    assert resp.status == 204
    # The headers the API reads; Capella-Header-<Name> cannot be allowed by prefix (JSON produce).
    assert allowed_headers(resp) == {
        "authorization",
        "content-type",
        "content-encoding",
        "accept",
        "last-event-id",
        "x-requested-with",
    }


async def test_answers_that_already_vary_also_vary_by_origin(listed: TestClient[Any, Any]) -> None:
    resp = await listed.get("/ui/", headers={"Origin": OTHER})
    assert resp.status == 200
    assert resp.headers["Vary"] == "Accept-Encoding, Origin"


async def preflight(client: TestClient[Any, Any], path: str, method: str, headers: str) -> Any:
    """The browser's question before a request from PAGE: may it send ``method`` with ``headers``?"""
    return await client.options(
        path,
        headers={
            "Origin": PAGE,
            "Access-Control-Request-Method": method,
            "Access-Control-Request-Headers": headers,
        },
    )


def allowed_headers(resp: Any) -> set[str]:
    return {h.strip().lower() for h in resp.headers["Access-Control-Allow-Headers"].split(",")}


@pytest.mark.parametrize(
    ("table", "words"),
    [
        (
            {"server": {"cors": {"origins": ["*"]}}, "auth": {"enabled": True}},
            "refused while [auth] is enabled",
        ),
        ({"server": {"cors": {"origins": ["https://a.example.com/app"]}}}, "no path"),
        ({"server": {"cors": {"origins": "https://a.example.com"}}}, "a list of origins"),
        ({"server": {"cors": {"origin": []}}}, "did you mean server.cors.origins"),
    ],
)
def test_bad_cors_settings_stop_the_start(table: dict[str, Any], words: str) -> None:
    with pytest.raises(InvalidConfig) as caught:
        parse_config(table, {}, Path("."), "capella.toml")
    assert words in caught.value.message


def test_origins_are_compared_as_browsers_send_them() -> None:
    config = parse_config(
        {"server": {"cors": {"origins": ["https://Console.Example.com:8443"]}}}, {}, Path(".")
    )
    assert msgspec.structs.asdict(config.server.cors)["origins"] == ("https://console.example.com:8443",)
