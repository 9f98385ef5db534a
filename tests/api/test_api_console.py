"""The console's files at ``/ui`` and the blocks listing it draws, against the real app.

The browser side is tests/e2e/test_ui.py; here are the answers themselves: what is served, with
which headers, what is refused, and that the page needs no credentials while the API does.
"""

from __future__ import annotations

import gzip
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from support.app import signed_in_api
from support.wait import until

from capella.api.console import ROOT
from capella.config import ServerSettings
from capella.core.cluster import Cluster

Q = "/v1/queues/orders"
MakeClient = Callable[[web.Application], Awaitable[TestClient[web.Request, web.Application]]]


@pytest.fixture
async def secured_api(
    aiohttp_client: MakeClient, cluster: Cluster, tmp_path: Path
) -> AsyncIterator[TestClient[Any, Any]]:
    async with signed_in_api(aiohttp_client, cluster, tmp_path, ServerSettings()) as api:
        yield api


async def test_ui_redirects_to_the_page_and_the_page_loads_its_modules(api: TestClient[Any, Any]) -> None:
    resp = await api.get("/ui", allow_redirects=False)
    assert resp.status == 308
    assert resp.headers["Location"] == "/ui/"

    resp = await api.get("/ui/")
    assert resp.status == 200
    assert resp.content_type == "text/html"
    page = await resp.text()
    assert '<script type="module" src="app.js"></script>' in page
    csp = resp.headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "default-src 'none'" in csp
    assert resp.headers["X-Content-Type-Options"] == "nosniff"

    # Every module the page imports, followed from app.js, is served as JavaScript.
    seen: set[str] = set()
    todo = ["app.js"]
    while todo:
        name = todo.pop()
        seen.add(name)
        resp = await api.get(f"/ui/{name}")
        assert resp.status == 200, name
        assert resp.content_type == "text/javascript"
        text = await resp.text()
        todo += [m for m in re.findall(r'from "\./([\w.-]+\.js)"', text) if m not in seen]
    assert seen == {p.name for p in ROOT.glob("*.js")}, "a module nobody imports, or one not served"
    resp = await api.get("/ui/app.css")
    assert resp.content_type == "text/css"


async def test_files_are_sent_gzipped_to_browsers_that_take_it(api: TestClient[Any, Any]) -> None:
    plain = await api.get("/ui/page-queue.js", headers={"Accept-Encoding": "identity"})
    assert "Content-Encoding" not in plain.headers
    raw = await api.get("/ui/page-queue.js", headers={"Accept-Encoding": "gzip, br"}, auto_decompress=False)
    assert raw.headers["Content-Encoding"] == "gzip"
    assert raw.headers["Vary"] == "Accept-Encoding"
    assert raw.headers["ETag"] != plain.headers["ETag"]
    zipped = await raw.read()
    assert gzip.decompress(zipped) == await plain.read() == (ROOT / "page-queue.js").read_bytes()
    assert len(zipped) < len(await plain.read()) / 2


async def test_an_unchanged_file_is_not_sent_again(api: TestClient[Any, Any]) -> None:
    resp = await api.get("/ui/app.js")
    etag = resp.headers["ETag"]
    again = await api.get("/ui/app.js", headers={"If-None-Match": etag})
    assert again.status == 304
    assert await again.read() == b""
    other = await api.get("/ui/app.js", headers={"If-None-Match": '"0000"'})
    assert other.status == 200


@pytest.mark.parametrize("name", ["nothing.js", "..%2Fconsole.py", "__init__.py", "%2e%2e"])
async def test_a_file_the_console_does_not_have_is_a_404(api: TestClient[Any, Any], name: str) -> None:
    resp = await api.get(f"/ui/{name}")
    assert resp.status == 404
    assert (await resp.json())["error"]["code"] == "not_found"


async def test_the_page_is_public_and_the_api_behind_it_is_not(secured_api: TestClient[Any, Any]) -> None:
    assert (await secured_api.get("/ui/")).status == 200
    assert (await secured_api.get("/ui/api.js")).status == 200
    resp = await secured_api.get("/v1/queues")
    assert resp.status == 401
    assert "Basic" in resp.headers["WWW-Authenticate"]
    # The page's own calls say they come from a script: no Basic challenge, so no browser
    # password prompt over the page's sign-in form.
    resp = await secured_api.get("/v1/queues", headers={"X-Requested-With": "XMLHttpRequest"})
    assert resp.status == 401
    assert resp.headers["WWW-Authenticate"] == 'Bearer realm="capella"'


# --- GET /v1/queues/{queue}/blocks -----------------------------------------------------------


async def test_blocks_come_in_id_order_with_their_tier_and_state(api: TestClient[Any, Any]) -> None:
    assert (await api.put(Q, json={"block": {"max_messages": 2}})).status == 201
    await api.post(f"{Q}/messages", json={"messages": [{"data": "x" * i} for i in range(1, 6)]})
    resp = await api.get(f"{Q}/blocks")
    assert resp.status == 200
    body = await resp.json()
    blocks = body["blocks"]
    assert [(b["first_id"], b["last_id"], b["count"]) for b in blocks] == [(1, 2, 2), (3, 4, 2), (5, 5, 1)]
    assert blocks[-1]["state"] == "open" and blocks[-1]["sealed"] is None
    assert {b["state"] for b in blocks[:-1]} <= {"sealed", "sealing"}

    # A seal changes a block's bytes (journal -> block file): compare once the sealer is done.
    async def all_sealed() -> bool:
        nonlocal blocks
        blocks = (await (await api.get(f"{Q}/blocks")).json())["blocks"]
        return {b["state"] for b in blocks[:-1]} == {"sealed"}

    await until(all_sealed, what="every full block sealed", every=0.05)
    stats = (await (await api.get(Q)).json())["stats"]
    assert sum(b["bytes"] for b in blocks) == stats["bytes"]
    assert sum(b["count"] for b in blocks) == stats["messages"]
    assert body["next_after"] is None


async def test_blocks_come_a_page_at_a_time(api: TestClient[Any, Any]) -> None:
    await api.put(Q, json={"block": {"max_messages": 2}})
    await api.post(f"{Q}/messages", json={"messages": [{"data": "x"}] * 7})
    first = await (await api.get(f"{Q}/blocks", params={"limit": "2"})).json()
    assert [b["first_id"] for b in first["blocks"]] == [1, 3]
    assert first["next_after"] == 4
    rest = await (await api.get(f"{Q}/blocks", params={"after": "4"})).json()
    assert [b["first_id"] for b in rest["blocks"]] == [5, 7]
    assert rest["next_after"] is None
    # An id inside a block starts the page at that block.
    middle = await (await api.get(f"{Q}/blocks", params={"after": "5", "limit": "1"})).json()
    assert [b["first_id"] for b in middle["blocks"]] == [5]


@pytest.mark.parametrize(("query", "parameter"), [({"after": "-1"}, "after"), ({"limit": "0"}, "limit")])
async def test_bad_block_parameters_are_named(
    api: TestClient[Any, Any], query: dict[str, str], parameter: str
) -> None:
    await api.put(Q, json={})
    resp = await api.get(f"{Q}/blocks", params=query)
    assert resp.status == 400
    assert (await resp.json())["error"]["parameter"] == parameter


async def test_blocks_of_an_unknown_queue_are_a_404(api: TestClient[Any, Any]) -> None:
    resp = await api.get("/v1/queues/nope/blocks")
    assert resp.status == 404
    assert (await resp.json())["error"]["code"] == "queue_not_found"
