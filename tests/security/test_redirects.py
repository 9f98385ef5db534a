"""A cluster's client never follows a redirect: its credentials stay with the cluster it names.

An external cluster (or whatever answers at its URL) that redirects could otherwise send the
cluster's token to another host, and past an egress check made on the URL the cluster names.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from support.receiver import Received, Receiver, listening

from capella.client import AsyncClient
from capella.errors import CapellaError


@pytest.fixture
async def elsewhere() -> AsyncIterator[tuple[str, list[Received]]]:
    """A server that records every request it gets."""
    found = Receiver()
    async with listening(found.handle) as port:
        yield f"http://127.0.0.1:{port}", found.seen


async def test_a_redirect_is_an_error_and_nothing_reaches_its_target(
    elsewhere: tuple[str, list[Received]],
) -> None:
    target, seen = elsewhere

    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect(target + request.path_qs)

    async with (
        listening(redirect) as port,
        AsyncClient(f"http://127.0.0.1:{port}", token="cap_cluster_token") as client,
    ):
        with pytest.raises(CapellaError) as refused:
            await client.queues()
        assert refused.value.details.get("status") == 307, refused.value.details
        with pytest.raises(CapellaError):
            async for _ in client.stream("orders", retries=0):
                break
    assert seen == []
