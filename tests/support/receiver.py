"""HTTP servers on loopback that record what they are sent: the far end of a push handler.

``listening(handle)`` serves one aiohttp handler for every method and path on a free loopback
port (and on more loopback addresses, on the same port) and yields that port. ``Receiver``
records each request as a ``Received`` and answers ``status`` (with a JSON body of its own for
the paths in ``json``: a far end that plays a Capella cluster); a test that scripts its answers
keeps its own ``handle`` and records the same ``Received``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

Handle = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Received:
    """One request as the receiver saw it, and what it answered."""

    method: str
    path: str  # with the query string
    headers: dict[str, str]
    body: bytes
    answer: str = ""  # the status sent, or what happened instead ("slow", "reset", "held")
    at: float = field(default_factory=time.monotonic)

    @property
    def ids(self) -> list[int]:
        """The message ids a push request carries (its ``Capella-Ids`` header)."""
        return [int(i) for i in self.headers["Capella-Ids"].split(",")]

    @classmethod
    async def of(cls, request: web.Request, answer: str = "") -> Received:
        return cls(request.method, request.path_qs, dict(request.headers), await request.read(), answer)


@contextlib.asynccontextmanager
async def listening(
    handle: Handle,
    hosts: Sequence[str] = ("127.0.0.1",),
    route: str = "/{tail:.*}",
    shutdown_timeout: float = 60.0,
) -> AsyncIterator[int]:
    """``handle`` answers every request to ``route`` on each of ``hosts``, all on one free port."""
    app = web.Application()
    app.router.add_route("*", route, handle)
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=shutdown_timeout)
    await runner.setup()
    await web.TCPSite(runner, hosts[0], 0).start()
    port = int(runner.addresses[0][1])
    for host in hosts[1:]:
        await web.TCPSite(runner, host, port).start()
    try:
        yield port
    finally:
        await runner.cleanup()


@dataclass
class Receiver:
    """Records every request and answers each with ``status``, as JSON for a path in ``json``."""

    url: str = ""  # http://127.0.0.1:PORT, once it listens
    status: int = 200
    seen: list[Received] = field(default_factory=list)
    json: dict[str, Any] = field(default_factory=dict)  # path -> the body answered there

    async def handle(self, request: web.Request) -> web.Response:
        self.seen.append(await Received.of(request, str(self.status)))
        if request.path in self.json:
            return web.json_response(self.json[request.path], status=self.status)
        return web.Response(status=self.status, text="receiver answer")

    def authorizations(self, path: str) -> list[str]:
        """The ``Authorization`` header of each request to ``path`` (empty where none came)."""
        return [r.headers.get("Authorization", "") for r in self.seen if r.path == path]
