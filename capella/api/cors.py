"""Browsers on other origins (``[server.cors]``): preflights, and CORS headers on every answer.

A preflight (``OPTIONS`` with ``Access-Control-Request-Method``) from an allowed origin is
answered here, before the access check: browsers send it without credentials. Every other
answer to an allowed origin, streams included, gets its headers in ``on_response_prepare``,
which runs before the first byte is sent. An origin that is not allowed gets no CORS header,
so the browser keeps the answer from the page; the server itself still answers as usual.

With a list of origins, credentials are allowed (``fetch(..., {credentials: "include"})``,
``new EventSource(url, {withCredentials: true})``); with ``*`` they are not, as browsers
require.
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from capella.config import CorsSettings

METHODS = "GET, HEAD, POST, PUT, PATCH, DELETE"
# What a page's script may read besides the CORS-safelisted headers.
EXPOSED = "Capella-Last-Id, Retry-After, WWW-Authenticate"


class Cors:
    """The CORS behaviour of one app, from its settings."""

    def __init__(self, settings: CorsSettings) -> None:
        self._any = "*" in settings.origins
        self._origins = frozenset(settings.origins)
        self._max_age = str(int(settings.max_age))

    def allowed(self, origin: str | None) -> bool:
        return origin is not None and (self._any or origin.lower() in self._origins)

    def _allow(self, origin: str, headers: dict[str, str]) -> dict[str, str]:
        if self._any:
            headers["Access-Control-Allow-Origin"] = "*"
        else:
            headers["Access-Control-Allow-Origin"] = origin
            headers["Access-Control-Allow-Credentials"] = "true"
        return headers

    @property
    def middleware(self) -> Middleware:
        @web.middleware
        async def preflight(request: web.Request, handler: Handler) -> web.StreamResponse:
            origin = request.headers.get("Origin")
            if (
                request.method != "OPTIONS"
                or "Access-Control-Request-Method" not in request.headers
                or not self.allowed(origin)
            ):
                return await handler(request)
            assert origin is not None
            headers = {
                "Access-Control-Allow-Methods": METHODS,
                "Access-Control-Max-Age": self._max_age,
            }
            # Any header the page asks for (Authorization, Content-Type, Last-Event-ID on an
            # EventSource reconnect, Capella-Header-*): the access check still decides.
            if requested := request.headers.get("Access-Control-Request-Headers"):
                headers["Access-Control-Allow-Headers"] = requested
            return web.Response(status=204, headers=self._allow(origin, headers))

        return preflight

    async def on_prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        origin = request.headers.get("Origin")
        if not self.allowed(origin) or "Access-Control-Allow-Origin" in response.headers:
            return
        assert origin is not None
        response.headers.update(self._allow(origin, {"Access-Control-Expose-Headers": EXPOSED}))
        if not self._any:  # the answer depends on the origin: caches must keep them apart
            vary = response.headers.get("Vary")
            response.headers["Vary"] = f"{vary}, Origin" if vary else "Origin"
