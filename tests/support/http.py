"""HTTP helpers over aiohttp: the error body of an answer, and a whole queue read page by page."""

from __future__ import annotations

from typing import Any

import aiohttp


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
