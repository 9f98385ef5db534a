"""The client against a Capella from before record batches: its defaults fall back to JSON.

The far end here answers as that server did (its error bodies, word for word): a record-batch
body is a 400 ``invalid_request`` naming the media type, a batch page is a 406
``not_acceptable``. A copy handler to a cluster not yet upgraded must go on, so the client
retries such a request as JSON once and keeps to JSON after.
"""

from __future__ import annotations

import orjson
from aiohttp import web
from support.receiver import listening

from capella.client import AsyncClient
from capella.errors import InvalidRequest
from capella.wire import batch_page


def error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status)


class OlderServer:
    """Answers produce and read as the previous Capella release did; records the forms asked."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def handle(self, request: web.Request) -> web.Response:
        if request.method == "POST":
            kind = request.content_type
            self.seen.append(f"POST {kind}")
            if kind != "application/json":
                return error(
                    400,
                    "invalid_request",
                    f"Content-Type {kind!r} is not supported: use application/json, "
                    "application/x-ndjson or application/octet-stream",
                )
            count = len(orjson.loads(await request.read())["messages"])
            return web.json_response({"results": [{"id": i + 1, "duplicate": False} for i in range(count)]})
        accept = request.headers.get("Accept", "")
        self.seen.append(f"GET {accept}")
        if batch_page.PAGE_MEDIA_TYPE in accept:
            return error(406, "not_acceptable", f"cannot answer in {accept}")
        message = {
            "id": 1,
            "time": 1.0,
            "source": "old",
            "external_id": 1,
            "external_time": 1.0,
            "segment": 0,
            "headers": {},
            "data": "a",
        }
        return web.json_response({"messages": [message], "last_id": 1})


async def test_produce_falls_back_to_json_once_and_stays_there() -> None:
    old = OlderServer()
    async with listening(old.handle) as port, AsyncClient(f"http://127.0.0.1:{port}") as client:
        assert [r.id for r in await client.produce("q", [b"a", b"b"])] == [1, 2]
        await client.produce("q", [b"c"])
        assert [m.data for m in (await client.read("q")).messages] == ["a"]
    batch = f"POST {batch_page.BATCH_MEDIA_TYPE}"
    assert old.seen == [batch, "POST application/json", "POST application/json", "GET */*"]


async def test_a_read_falls_back_to_json_once_and_stays_there() -> None:
    old = OlderServer()
    async with listening(old.handle) as port, AsyncClient(f"http://127.0.0.1:{port}") as client:
        assert [m.data for m in (await client.read("q")).messages] == ["a"]
        await client.read("q")
    assert old.seen == [f"GET {batch_page.PAGE_MEDIA_TYPE}", "GET */*", "GET */*"]


async def test_other_refusals_are_not_taken_for_an_older_server() -> None:
    async def refuse(request: web.Request) -> web.Response:
        return error(400, "invalid_request", "message 0: segment 9 is outside the queue's range 0-1")

    async with listening(refuse) as port, AsyncClient(f"http://127.0.0.1:{port}") as client:
        try:
            await client.produce("q", [b"a"])
        except InvalidRequest as exc:
            assert "segment" in exc.message
        else:
            raise AssertionError("the refusal was swallowed")
