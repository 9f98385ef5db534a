"""The egress connector against real listeners on loopback: what it lets through, and where.

The policy is checked on the address actually connected to: IP literals (which aiohttp never
resolves), every address a name resolves to, and a name whose answer changes (DNS rebinding).
A resolver that answers from a table stands in for DNS.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult
from support.receiver import listening

from capella.client import AsyncClient
from capella.client.connector import EgressConnector, check_destination
from capella.egress import Egress
from capella.errors import EgressRefused

LOOPBACK = Egress.of(["127.0.0.0/8", "::1/128"], auth_enabled=True)
PUBLIC_ONLY = Egress.of([], auth_enabled=True)


class Listeners:
    """One HTTP server on several loopback addresses, the same port on each; records who was hit."""

    def __init__(self) -> None:
        self.hits: list[str] = []
        self.port = 0

    async def handle(self, request: web.Request) -> web.Response:
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        self.hits.append(str(sockname[0]) if sockname else "?")
        return web.Response(text="ok")


@pytest.fixture
async def listeners() -> AsyncIterator[Listeners]:
    found = Listeners()
    async with listening(found.handle, hosts=("127.0.0.1", "127.0.0.2")) as port:
        found.port = port
        yield found


class Table(AbstractResolver):
    """Answers each name from a table; ``answers`` can change between calls (rebinding)."""

    def __init__(self, answers: dict[str, list[str]]) -> None:
        self.answers = answers

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        return [
            {"hostname": host, "host": a, "port": port, "family": socket.AF_INET, "proto": 0, "flags": 0}
            for a in self.answers[host]
        ]

    async def close(self) -> None:
        pass


async def get(url: str, egress: Egress, resolver: AbstractResolver | None = None) -> int:
    connector = EgressConnector(egress, resolver, use_dns_cache=False)
    async with aiohttp.ClientSession(connector=connector) as session, session.get(url) as resp:
        return resp.status


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "[::ffff:127.0.0.1]", "localhost"])
async def test_loopback_in_any_form_is_refused_before_a_connection(listeners: Listeners, host: str) -> None:
    with pytest.raises(EgressRefused) as info:
        await get(f"http://{host}:{listeners.port}/", PUBLIC_ONLY)

    assert "[egress] allow" in info.value.message
    assert listeners.hits == []


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "[::ffff:127.0.0.1]", "localhost"])
async def test_the_allow_list_lets_loopback_through(listeners: Listeners, host: str) -> None:
    assert await get(f"http://{host}:{listeners.port}/", LOOPBACK) == 200
    assert len(listeners.hits) == 1


async def test_a_name_connects_only_to_its_allowed_addresses(listeners: Listeners) -> None:
    only_two = Egress.of(["127.0.0.2/32"], auth_enabled=True)
    table = Table({"mixed.test": ["127.0.0.1", "127.0.0.2"]})

    for _ in range(3):
        assert await get(f"http://mixed.test:{listeners.port}/", only_two, table) == 200

    assert listeners.hits == ["127.0.0.2"] * 3


async def test_a_name_that_rebinds_to_a_refused_address_is_refused(listeners: Listeners) -> None:
    only_two = Egress.of(["127.0.0.2/32"], auth_enabled=True)
    table = Table({"rebind.test": ["127.0.0.2"]})
    assert await get(f"http://rebind.test:{listeners.port}/", only_two, table) == 200

    table.answers["rebind.test"] = ["127.0.0.1"]
    with pytest.raises(EgressRefused) as info:
        await get(f"http://rebind.test:{listeners.port}/", only_two, table)

    assert "rebind.test (127.0.0.1)" in info.value.message
    assert listeners.hits == ["127.0.0.2"]


async def test_the_check_ahead_refuses_what_the_connect_would(listeners: Listeners) -> None:
    with pytest.raises(EgressRefused):
        await check_destination(PUBLIC_ONLY, "http://[::ffff:127.0.0.1]:1/")
    with pytest.raises(EgressRefused):
        await check_destination(PUBLIC_ONLY, "http://localhost:1/")
    await check_destination(LOOPBACK, "http://localhost:1/")
    await check_destination(Egress.open(), "http://127.0.0.1:1/")
    await check_destination(PUBLIC_ONLY, "http://no-such-host.invalid/")  # the request reports it


async def test_a_client_with_an_egress_policy_refuses_a_loopback_server(listeners: Listeners) -> None:
    async with AsyncClient(f"http://127.0.0.1:{listeners.port}", egress=PUBLIC_ONLY) as client:
        with pytest.raises(EgressRefused):
            await client.ready()
    async with AsyncClient(f"http://127.0.0.1:{listeners.port}") as client:
        await client.ready()  # no policy: an SDK user reaches what they name
    assert len(listeners.hits) == 1
