"""What the shared fault tests ask of the nodes over HTTP, and the settings they run with.

The nodes run with a short ``storage.write_timeout`` (``EXTRA``) and a 50 ms window, so a
write that cannot be saved is answered within ``WRITE_TIMEOUT + WINDOW + ANSWER_SLACK``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import aiohttp

from support.pg import PgServer
from support.servers import S3Server
from support.shared import SharedRig
from support.wait import until

WRITE_TIMEOUT = 2.0
WINDOW = 0.05
# A failed write is answered within write_timeout past the window; this much more is the
# request's own way through the server and the client on 2 busy cores.
ANSWER_SLACK = 2.5
EXTRA = f'[storage]\nwrite_timeout = "{WRITE_TIMEOUT:g}s"\n'
RECOVER_WITHIN = 15.0
IDLE_DETECT_WITHIN = 10.0  # the lease is renewed every 3 s: an idle node notices PostgreSQL gone


def make_rig(root: Path, pg: PgServer, s3: S3Server, **options: Any) -> SharedRig:
    return SharedRig(root, pg=pg, s3=s3, flush_interval=f"{int(WINDOW * 1000)}ms", extra=EXTRA, **options)


async def call(
    http: aiohttp.ClientSession, method: str, url: str, body: Any = None, **params: str
) -> tuple[int, Any, float]:
    """Status, JSON body and seconds of one request."""
    started = time.monotonic()
    async with http.request(method, url, json=body, params=params or None) as resp:
        found = await resp.json(content_type=None)
        return resp.status, found, time.monotonic() - started


def messages(source: str, first: int, count: int) -> dict[str, Any]:
    return {
        "messages": [
            {"data": f"{source}-{e}", "source": source, "external_id": e} for e in range(first, first + count)
        ]
    }


async def create_shared(http: aiohttp.ClientSession, url: str, name: str) -> None:
    status, body, _ = await call(http, "PUT", f"{url}/v1/queues/{name}", {"storage": "shared"})
    assert status in (200, 201), body


async def produce(
    http: aiohttp.ClientSession, url: str, queue: str, source: str, first: int, count: int
) -> tuple[int, Any, float]:
    body = messages(source, first, count)
    return await call(http, "POST", f"{url}/v1/queues/{queue}/messages", body, save="wait")


async def read(http: aiohttp.ClientSession, url: str, queue: str) -> tuple[int, Any]:
    status, body, _ = await call(http, "GET", f"{url}/v1/queues/{queue}/messages", after="0", limit="1000")
    return status, body


async def readiness(http: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    status, body, _ = await call(http, "GET", f"{url}/readyz")
    return status, body


async def until_ready(http: aiohttp.ClientSession, url: str, within: float = RECOVER_WITHIN) -> None:
    async def ready() -> bool:
        return (await readiness(http, url))[0] == 200

    await until(ready, within, f"{url}/readyz 200", every=0.1)


async def until_not_ready(http: aiohttp.ClientSession, url: str, part: str, within: float) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    async def faulty() -> bool:
        status, body = await readiness(http, url)
        seen.update(body)
        return status == 503 and part in body.get("shared", {}).get("parts", [])

    await until(faulty, within, f"{url}/readyz 503 naming {part}", every=0.1)
    return seen


def assert_stored_once(body: dict[str, Any], source: str, count: int) -> None:
    ids = [m["id"] for m in body["messages"]]
    assert ids == list(range(1, count + 1))
    assert [m["external_id"] for m in body["messages"]] == list(range(1, count + 1))
    assert [m["data"] for m in body["messages"]] == [f"{source}-{e}" for e in range(1, count + 1)]
