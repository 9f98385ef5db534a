"""M-of-K writes from the client against real clusters on loopback (and dead addresses)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from support.supervisor import launched

from capella.api import create_app
from capella.client import MultiWriter
from capella.config import ServerSettings, parse_config
from capella.core.cluster import Cluster
from capella.errors import InvalidRequest, NotEnoughReplicas

DEAD = ["http://127.0.0.1:9", "http://127.0.0.1:7"]  # discard/echo: nothing listens there


@pytest.fixture
async def urls(
    tmp_path: Path, aiohttp_server: Callable[[web.Application], Awaitable[TestServer]]
) -> AsyncIterator[dict[str, tuple[str, Cluster]]]:
    made: dict[str, tuple[str, Cluster]] = {}
    supervisors = []
    for name in ("a", "b", "c"):
        config = parse_config(
            {"cluster": {"name": name}, "mounts": {"default": {"provider": "memory"}}}, {}, tmp_path
        )
        cluster = await Cluster.open(config)
        await cluster.put_queue("orders", {})
        supervisor = await launched(cluster)
        supervisors.append(supervisor)
        server = await aiohttp_server(create_app(cluster, ServerSettings(), supervisor))
        made[name] = (str(server.make_url("")).rstrip("/"), cluster)
    yield made
    for supervisor in supervisors:
        await supervisor.close()
    for _, cluster in made.values():
        await cluster.close()


async def identities(cluster: Cluster) -> list[tuple[str, int, bytes]]:
    page = await cluster.queue("orders").read_after(0, 100)
    return [(m.source, m.external_id, m.payload) for m in page.messages]


async def test_returns_once_m_clusters_hold_the_batch(urls: dict[str, tuple[str, Cluster]]) -> None:
    async with MultiWriter([urls["a"][0], urls["b"][0], urls["c"][0]], 2, source="shop") as writer:
        receipt = await writer.produce("orders", ["one", "two"])
    assert sorted(receipt.holders) == sorted([urls["a"][0], urls["b"][0]])
    assert receipt.failures == {}
    assert await identities(urls["a"][1]) == await identities(urls["b"][1])
    assert [i[0] for i in await identities(urls["a"][1])] == ["shop", "shop"]
    assert await identities(urls["c"][1]) == []  # not needed, not written


async def test_a_dead_cluster_is_replaced_by_the_next_one(urls: dict[str, tuple[str, Cluster]]) -> None:
    async with MultiWriter([DEAD[0], urls["a"][0], urls["b"][0]], 2, source="shop", timeout=2) as writer:
        receipt = await writer.produce("orders", [{"data": "x", "external_id": 7}])
    assert sorted(receipt.holders) == sorted([urls["a"][0], urls["b"][0]])
    assert DEAD[0] in receipt.failures and "unreachable" in receipt.failures[DEAD[0]]
    assert receipt.external_ids == [7]


async def test_fewer_than_m_is_an_error_that_says_who_has_it(urls: dict[str, tuple[str, Cluster]]) -> None:
    async with MultiWriter([DEAD[0], DEAD[1], urls["c"][0]], 2, source="shop", timeout=2) as writer:
        with pytest.raises(NotEnoughReplicas) as info:
            await writer.produce("orders", ["x"])
    assert info.value.details["holders"] == [urls["c"][0]]
    assert len(await identities(urls["c"][1])) == 1


async def test_resending_a_batch_stores_it_once(urls: dict[str, tuple[str, Cluster]]) -> None:
    async with MultiWriter([urls["a"][0], urls["b"][0]], 2, source="shop") as writer:
        first = await writer.produce("orders", [{"data": "x", "external_id": 1}])
        again = await writer.produce("orders", [{"data": "x", "external_id": 1}])
    assert first.holders == again.holders
    assert len(await identities(urls["a"][1])) == 1


def test_bad_settings_are_refused() -> None:
    with pytest.raises(InvalidRequest):
        MultiWriter([], 1, source="s")
    with pytest.raises(InvalidRequest):
        MultiWriter(["http://127.0.0.1:1"], 2, source="s")
    with pytest.raises(InvalidRequest):
        MultiWriter(["http://127.0.0.1:1"], 1, source="")
