"""Browsers on other origins (``[server.cors]``): preflights, and CORS headers on every answer.

A preflight (``OPTIONS`` with ``Access-Control-Request-Method``) from an allowed origin is
answered here, before the access check: browsers send it without credentials. It allows a
fixed list of request headers, those the API reads (``ALLOWED_HEADERS``), whatever the page
asks for. Every other answer to an allowed origin, streams included, gets its headers in
``on_response_prepare``, which runs before the first byte is sent. An origin that is not
allowed gets no CORS header, so the browser keeps the answer from the page (and a
state-changing request from it is refused before that, ``api/browser.py``).

Every answer carries ``Vary: Origin`` while CORS is on, with an Origin or without, allowed or
not, preflights too: the headers depend on the Origin, so a cache must not hand one page's
answer to another.

With a list of origins, credentials are allowed (``fetch(..., {credentials: "include"})``,
``new EventSource(url, {withCredentials: true})``); with ``*`` they are not, as browsers
require.
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from capella.config import CorsSettings

METHODS = "GET, HEAD, POST, PUT, PATCH, DELETE"
# The request headers the API reads that a page may have to ask for: credentials, the body's
# type and encoding, the read's form, an EventSource's resume point, the console's marker.
# Capella-Header-<Name> (a raw produce's per-message headers) cannot be allowed by prefix in
# CORS, so pages send message headers in a JSON produce instead.
ALLOWED_HEADERS = "Authorization, Content-Type, Content-Encoding, Accept, Last-Event-ID, X-Requested-With"
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
                "Access-Control-Allow-Headers": ALLOWED_HEADERS,
                "Access-Control-Max-Age": self._max_age,
            }
            return web.Response(status=204, headers=self._allow(origin, headers))

        return preflight

    async def on_prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        vary = response.headers.get("Vary")
        if vary is None:
            response.headers["Vary"] = "Origin"
        elif "origin" not in (part.strip().lower() for part in vary.split(",")):
            response.headers["Vary"] = f"{vary}, Origin"
        origin = request.headers.get("Origin")
        if not self.allowed(origin) or "Access-Control-Allow-Origin" in response.headers:
            return
        assert origin is not None
        response.headers.update(self._allow(origin, {"Access-Control-Expose-Headers": EXPOSED}))
