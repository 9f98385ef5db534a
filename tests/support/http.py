"""HTTP helpers: the error body of an answer, a produce that may meet a server going down, a
whole queue read page by page (over aiohttp), and one answer read off a raw connection (for
tests that hold sockets themselves)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson


async def error_of(resp: Any, status: int) -> dict[str, Any]:
    """The ``error`` object of an answer that must have ``status``."""
    assert resp.status == status, await resp.text()
    return dict((await resp.json())["error"])


async def only_error_of(resp: Any, status: int) -> dict[str, Any]:
    """``error_of``, and the body holds nothing but the error, whose message is a non-empty text."""
    assert resp.status == status, await resp.text()
    body = await resp.json()
    assert set(body) == {"error"}
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return dict(body["error"])


async def produced(
    session: aiohttp.ClientSession,
    queue_url: str,
    messages: list[dict[str, Any]],
    save: str,
    request_timeout: float | None = None,
) -> list[dict[str, Any]] | None:
    """The results of one produce to the queue at ``queue_url``, or None when it was refused or
    the server could not be reached (it is being killed, cut off or has lost its power)."""
    extra: dict[str, Any] = (
        {} if request_timeout is None else {"timeout": aiohttp.ClientTimeout(total=request_timeout)}
    )
    try:
        async with session.post(
            f"{queue_url}/messages", params={"save": save}, json={"messages": messages}, **extra
        ) as resp:
            if resp.status != 200:
                return None
            results: list[dict[str, Any]] = (await resp.json())["results"]
            return results
    except (TimeoutError, aiohttp.ClientError):
        return None


async def read_all(
    session: aiohttp.ClientSession, queue_url: str, limit: int = 1000, request_timeout: float | None = None
) -> list[dict[str, Any]]:
    """Every message of the queue at ``queue_url`` (``.../v1/queues/<name>``), oldest first."""
    # Without a timeout of its own, a request keeps the session's.
    extra: dict[str, Any] = (
        {} if request_timeout is None else {"timeout": aiohttp.ClientTimeout(total=request_timeout)}
    )
    messages: list[dict[str, Any]] = []
    after = 0
    while True:
        async with session.get(
            f"{queue_url}/messages", params={"after": str(after), "limit": str(limit)}, **extra
        ) as resp:
            assert resp.status == 200, await resp.text()
            page = await resp.json()
        if not page["messages"]:
            return messages
        messages.extend(page["messages"])
        after = page["last_id"]


@dataclass
class RawAnswer:
    """One HTTP/1.1 answer read off a raw connection; header names in lower case."""

    status: int
    headers: dict[str, str]
    body: bytes

    def error(self) -> dict[str, Any]:
        assert self.headers["content-type"].startswith("application/json"), self.headers
        error: dict[str, Any] = orjson.loads(self.body)["error"]
        return error


async def read_head(reader: asyncio.StreamReader, within: float) -> tuple[int, dict[str, str]]:
    """The status and headers of the next answer on ``reader``, within ``within`` seconds."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), within)
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers


async def read_answer(reader: asyncio.StreamReader, within: float) -> RawAnswer:
    """The next answer on ``reader``, which has a Content-Length, within ``within`` seconds each
    for its head and its body."""
    status, headers = await read_head(reader, within)
    body = await asyncio.wait_for(reader.readexactly(int(headers.get("content-length", "0"))), within)
    return RawAnswer(status, headers, body)
