"""A message's headers are bounded (server.max_message_headers, max_message_headers_size) on
every produce path, against a real server with its default limits."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from support.servers import ServerProcess, running

from capella.config import ServerSettings

pytestmark = pytest.mark.slow

DEFAULTS = ServerSettings()
COUNT = DEFAULTS.max_message_headers
SIZE = DEFAULTS.max_message_headers_size
CODE = "message_headers_too_large"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from running(ServerProcess(tmp_path_factory.mktemp("headers") / "data"))


@pytest.fixture
async def http(server: ServerProcess) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(server.url) as session:
        yield session


@pytest.fixture
async def queue(http: aiohttp.ClientSession, request: pytest.FixtureRequest) -> str:
    name = request.node.name.replace("[", "-").replace("]", "").replace("_", "-")[:60]
    async with http.put(f"/v1/queues/{name}", json={}) as resp:
        assert resp.status == 201, await resp.text()
    return f"/v1/queues/{name}"


def headers(count: int, value: str = "v") -> dict[str, str]:
    return {f"h{i}": value for i in range(count)}


async def refused(resp: aiohttp.ClientResponse, index: int = 0) -> dict[str, Any]:
    assert resp.status == 400, await resp.text()
    error = dict((await resp.json())["error"])
    assert (error["code"], error["index"], error["field"]) == (CODE, index, "headers")
    return error


async def stored(http: aiohttp.ClientSession, queue: str) -> list[dict[str, Any]]:
    async with http.get(f"{queue}/messages") as resp:
        assert resp.status == 200
        messages: list[dict[str, Any]] = (await resp.json())["messages"]
    async with http.get(f"{queue}/scheduled") as resp:
        assert resp.status == 200
        scheduled: list[dict[str, Any]] = (await resp.json())["scheduled"]
    return messages + scheduled


async def test_3000_headers_are_refused_and_nothing_of_the_batch_is_stored(
    http: aiohttp.ClientSession, queue: str
) -> None:
    batch = [{"data": "ok"}, {"data": "bad", "headers": headers(3000)}, {"data": "ok"}]
    async with http.post(f"{queue}/messages", json={"messages": batch}) as resp:
        error = await refused(resp, index=1)
    assert error["limit"] == COUNT
    assert "3000 headers" in error["message"] and "server.max_message_headers" in error["message"]
    assert await stored(http, queue) == []


async def test_exactly_the_limits_are_accepted(http: aiohttp.ClientSession, queue: str) -> None:
    # COUNT headers whose names and values add up to exactly SIZE bytes (names "h00".."h63").
    names = [f"h{i:02d}" for i in range(COUNT)]
    value = "v" * ((SIZE - sum(map(len, names))) // COUNT)
    full = dict.fromkeys(names, value)
    full[names[0]] += "v" * (SIZE - sum(len(n) + len(v) for n, v in full.items()))
    assert sum(len(n) + len(v) for n, v in full.items()) == SIZE
    async with http.post(f"{queue}/messages", json={"data": "a", "headers": full}) as resp:
        assert resp.status == 200, await resp.text()
    (message,) = await stored(http, queue)
    assert message["headers"] == full


async def test_one_header_more_than_the_count_is_refused(http: aiohttp.ClientSession, queue: str) -> None:
    async with http.post(f"{queue}/messages", json={"data": "a", "headers": headers(COUNT + 1)}) as resp:
        assert (await refused(resp))["limit"] == COUNT
    assert await stored(http, queue) == []


async def test_one_byte_more_than_the_size_is_refused_counting_utf8_bytes(
    http: aiohttp.ClientSession, queue: str
) -> None:
    # "é" is two bytes: SIZE // 2 characters of it are SIZE bytes, plus the name "k".
    for value in ("x" * SIZE, "é" * (SIZE // 2)):
        async with http.post(f"{queue}/messages", json={"data": "a", "headers": {"k": value}}) as resp:
            error = await refused(resp)
        assert error["limit"] == SIZE
        assert f"{SIZE + 1} bytes" in error["message"] and "max_message_headers_size" in error["message"]
    assert await stored(http, queue) == []


async def test_ndjson_is_refused_naming_the_line(http: aiohttp.ClientSession, queue: str) -> None:
    lines = [{"data": "ok"}, {"data": "ok"}, {"data": "bad", "headers": headers(3000)}]
    body = b"\n".join(map(orjson.dumps, lines))
    async with http.post(
        f"{queue}/messages", data=body, headers={"Content-Type": "application/x-ndjson"}
    ) as resp:
        await refused(resp, index=2)
    assert await stored(http, queue) == []


async def test_a_delayed_message_is_refused_before_it_is_scheduled(
    http: aiohttp.ClientSession, queue: str
) -> None:
    for timing in ({"delay": "1h"}, {"deliver_at": 4_000_000_000}):
        message = {"data": "later", "headers": headers(3000), **timing}
        async with http.post(f"{queue}/messages", json=message) as resp:
            await refused(resp)
    assert await stored(http, queue) == []


async def test_raw_produce_counts_its_capella_header_request_headers(
    http: aiohttp.ClientSession, queue: str
) -> None:
    raw = {"Content-Type": "application/octet-stream"}
    over = raw | {f"Capella-Header-H{i}": "v" for i in range(COUNT + 1)}
    async with http.post(f"{queue}/messages", data=b"x", headers=over) as resp:
        assert (await refused(resp))["limit"] == COUNT
    # The size: four headers of 4 KiB each (one HTTP header is at most server.max_header_size).
    big = raw | {f"Capella-Header-Big{i}": "v" * 4096 for i in range(4)}
    async with http.post(f"{queue}/messages", data=b"x", headers=big) as resp:
        assert (await refused(resp))["limit"] == SIZE
    assert await stored(http, queue) == []
    at_limit = raw | {f"Capella-Header-H{i}": "v" for i in range(COUNT)}
    async with http.post(f"{queue}/messages", data=b"x", headers=at_limit) as resp:
        assert resp.status == 200, await resp.text()
    (message,) = await stored(http, queue)
    assert len(message["headers"]) == COUNT


async def test_the_limits_are_settings(tmp_path: Path) -> None:
    config = tmp_path / "capella.toml"
    config.write_text("[server]\nmax_message_headers = 2\nmax_message_headers_size = 10\n")
    server = ServerProcess(tmp_path / "data", config=config)
    try:
        await asyncio.to_thread(server.wait_ready)
        async with aiohttp.ClientSession(server.url) as http:
            async with http.put("/v1/queues/q", json={}) as resp:
                assert resp.status == 201
            for bad, limit in ((headers(3), 2), ({"k": "v" * 10}, 10)):
                async with http.post("/v1/queues/q/messages", json={"data": "a", "headers": bad}) as resp:
                    assert (await refused(resp))["limit"] == limit
            async with http.post("/v1/queues/q/messages", json={"data": "a", "headers": headers(2)}) as resp:
                assert resp.status == 200
    finally:
        assert server.stop() == 0
