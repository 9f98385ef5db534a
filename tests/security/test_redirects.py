"""A cluster's client never follows a redirect: its credentials stay with the cluster it names.

An external cluster (or whatever answers at its URL) that redirects could otherwise send the
cluster's token to another host, and past an egress check made on the URL the cluster names.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from capella.client import AsyncClient
from capella.errors import CapellaError


async def serve(app: web.Application) -> AsyncIterator[str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@pytest.fixture
async def elsewhere() -> AsyncIterator[tuple[str, list[str]]]:
    """A server that records the Authorization of every request it gets."""
    seen: list[str] = []

    async def record(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        return web.json_response({"queues": []})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", record)
    async for url in serve(app):
        yield url, seen


async def test_a_redirect_is_an_error_and_nothing_reaches_its_target(
    elsewhere: tuple[str, list[str]],
) -> None:
    target, seen = elsewhere

    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect(target + request.path_qs)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", redirect)
    async for url in serve(app):
        async with AsyncClient(url, token="cap_cluster_token") as client:
            with pytest.raises(CapellaError) as refused:
                await client.queues()
            assert refused.value.details.get("status") == 307, refused.value.details
            with pytest.raises(CapellaError):
                async for _ in client.stream("orders", retries=0):
                    break
    assert seen == []
