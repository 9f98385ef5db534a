"""The connection guard: a cap on open connections and a deadline for every request head.

aiohttp parses request heads itself. While a head is incomplete, only its keep-alive timer
(``keepalive_timeout``, 75 s here) would ever close the connection, so a few hundred clients
that send a head one byte at a time (slowloris) could hold a server's connections for minutes.
``ConnectionGuard`` wraps each aiohttp protocol and adds:

- ``max_connections``: a connection over the cap is answered ``503 too_many_connections``
  and closed, without reaching aiohttp; the others are served as usual.
- ``header_timeout``: a request head must be complete within this time of the connection
  opening (after the TLS handshake), or, on a keep-alive connection, of the first byte of the
  next request; otherwise the connection gets ``408 request_timeout`` and is closed. An idle
  keep-alive connection is left to ``keepalive_timeout``, and a request being handled (a long
  poll, a stream) has no head deadline at all.
- Header limits (``max_header_size``, ``max_headers``) and every request aiohttp cannot parse
  are answered with Capella's JSON errors (431 ``headers_too_large``, 400 ``invalid_request``)
  instead of aiohttp's plain text.

The guard learns that a head is complete from its middleware, which must run first, and
finds the connection by ``request.transport``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from http import HTTPStatus
from ssl import SSLContext
from typing import cast

import msgspec
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError, LineTooLong
from aiohttp.typedefs import Handler, Middleware
from aiohttp.web_request import BaseRequest

from capella import wire
from capella.api.browser import ANSWER_HEADERS
from capella.api.errors import status_for
from capella.api.request import json_response
from capella.config import ServerSettings
from capella.errors import (
    CapellaError,
    HeadersTooLarge,
    InvalidRequest,
    RequestTimeout,
    TooManyConnections,
)
from capella.wire.answers import Error

log = logging.getLogger(__name__)

# After its 503, a refused connection is half-closed and its input discarded until the client
# closes, or for this long: closing at once, with the client's request unread, would reset
# the connection and could destroy the 503 before the client reads it.
REFUSED_LINGER = 2.0
# Floods are logged as one line with a count, at most this often.
LOG_EVERY = 10.0


class ConnectionGuard:
    """Counts open connections and times request heads; one per server, shared by its sites."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self._open: dict[asyncio.BaseTransport, _Connection] = {}
        self._lingering = 0
        self._refused = _Tally("connections refused: %d over max_connections=%d", settings.max_connections)
        self._timed_out = _Tally(
            "connections closed: %d sent no complete request head within header_timeout=%gs",
            settings.header_timeout,
        )
        self.refused_answer = _answer(
            TooManyConnections(
                f"the server already holds {settings.max_connections} connections; try again later",
                limit=settings.max_connections,
            )
        )
        self.timeout_answer = _answer(
            RequestTimeout(f"the request head did not arrive within {settings.header_timeout:g} s")
        )
        self.middleware = self._tracking_middleware()

    def close(self) -> None:
        """Log what is still uncounted; call after the sites have stopped."""
        self._refused.close()
        self._timed_out.close()

    def protocol_factory(
        self, server: web.Server, loop: asyncio.AbstractEventLoop
    ) -> Callable[[], asyncio.Protocol]:
        """What ``loop.create_server`` calls for each accepted connection."""
        settings = self.settings

        def handler() -> web.RequestHandler:
            return JsonErrorRequestHandler(
                server,
                loop=loop,
                keepalive_timeout=settings.keepalive_timeout,
                access_log=None,  # type: ignore[arg-type]  # None turns access logs off (aiohttp docs)
                max_line_size=settings.max_header_size,
                max_field_size=settings.max_header_size,
                max_headers=settings.max_headers,
            )

        return lambda: _Connection(self, handler, loop)

    def _tracking_middleware(self) -> Middleware:
        connections = self._open

        @web.middleware
        async def track_request(request: web.Request, handler: Handler) -> web.StreamResponse:
            transport = request.transport
            connection = None if transport is None else connections.get(transport)
            if connection is None:  # not through a guarded site (the test client)
                return await handler(request)
            connection.request_started()
            try:
                return await handler(request)
            finally:
                connection.request_finished()

        return track_request


class _Connection(asyncio.Protocol):
    """One accepted connection: aiohttp's protocol behind a head deadline, or a refusal."""

    __slots__ = ("_due", "_guard", "_handler", "_idle", "_loop", "_make_handler", "_timer", "_transport")

    def __init__(
        self,
        guard: ConnectionGuard,
        make_handler: Callable[[], web.RequestHandler],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._guard = guard
        self._make_handler = make_handler
        self._loop = loop
        self._handler: web.RequestHandler | None = None
        self._transport: asyncio.Transport | None = None
        # One timer at a time, moved forward lazily (as aiohttp's keep-alive timer is): a request
        # only sets ``_due``, so a busy connection costs no timer per request.
        self._timer: asyncio.TimerHandle | None = None
        self._due: float | None = None  # when the pending request head must be complete
        self._idle = False  # between an answer and the first byte of the next request

    def connection_made(self, base: asyncio.BaseTransport) -> None:
        # A stream transport, though uvloop's does not subclass asyncio.Transport.
        transport = cast(asyncio.Transport, base)
        self._transport = transport
        guard = self._guard
        # Counted here, not in the factory: a failed TLS handshake never reaches this point,
        # and never calls connection_lost either.
        if len(guard._open) >= guard.settings.max_connections:
            self._refuse(transport)
            return
        guard._open[transport] = self
        self._head_due()
        self._handler = self._make_handler()
        self._handler.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._handler is None:
            return  # refused: read and discard until the client closes
        if self._idle:
            self._idle = False
            self._head_due()
        self._handler.data_received(data)

    def eof_received(self) -> bool | None:
        if self._handler is None:
            return False  # refused: the client is done, close
        self._handler.eof_received()  # aiohttp's returns None: the transport closes itself
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._handler is None:
            self._guard._lingering -= 1
            return
        if self._transport is not None:
            self._guard._open.pop(self._transport, None)
        self._handler.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._handler is not None:
            self._handler.pause_writing()

    def resume_writing(self) -> None:
        if self._handler is not None:
            self._handler.resume_writing()

    def request_started(self) -> None:
        self._idle = False
        self._due = None

    def request_finished(self) -> None:
        self._idle = True

    def _refuse(self, transport: asyncio.Transport) -> None:
        guard = self._guard
        guard._refused.add(self._loop)
        guard._lingering += 1
        transport.write(guard.refused_answer)
        if guard._lingering > guard.settings.max_connections:
            transport.close()  # a flood: do not hold a second max_connections of sockets
            return
        if transport.can_write_eof():  # TLS cannot half-close; the client closes after the answer
            transport.write_eof()
        self._timer = self._loop.call_later(REFUSED_LINGER, transport.close)

    def _head_due(self) -> None:
        self._due = self._loop.time() + self._guard.settings.header_timeout
        if self._timer is None:
            self._timer = self._loop.call_at(self._due, self._check_head)

    def _check_head(self) -> None:
        self._timer = None
        transport = self._transport
        if self._due is None or transport is None or transport.is_closing():
            return  # no head pending: the next first byte schedules a check
        if self._loop.time() < self._due:
            self._timer = self._loop.call_at(self._due, self._check_head)
            return
        if transport.get_write_buffer_size() > 0:
            # The previous answer is still going out to a slow reader: no head is due yet.
            self._head_due()
            return
        self._guard._timed_out.add(self._loop)
        log.debug(
            "closing a connection: no complete request head peer=%s", transport.get_extra_info("peername")
        )
        transport.write(self._guard.timeout_answer)
        transport.close()


class JsonErrorRequestHandler(web.RequestHandler):
    """aiohttp's HTTP protocol, answering requests it cannot parse with Capella's JSON errors."""

    __slots__ = ()

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if not isinstance(exc, HttpProcessingError):
            return super().handle_error(request, status, exc, message)
        # A client error, expected on any public port: not worth aiohttp's logged traceback.
        error = self._protocol_error(exc)
        log.debug("unparsable request peer=%s code=%s: %s", request.remote, error.code, error.message)
        # No app here to add them when the answer is prepared.
        response = json_response(_error_body(error), status_for(error), dict(ANSWER_HEADERS))
        response.force_close()
        return response

    def _protocol_error(self, exc: HttpProcessingError) -> CapellaError:
        if isinstance(exc, LineTooLong):
            return HeadersTooLarge(
                f"the request line or a header is longer than {self.max_field_size} bytes",
                limit=self.max_field_size,
            )
        # aiohttp raises a plain BadHttpMessage for this one; its text is all that tells it apart
        # (tests/client/test_transport.py pins it, so an aiohttp upgrade that changes it is noticed).
        if exc.message.startswith("Too many headers"):
            return HeadersTooLarge(
                f"the request has more than {self.max_headers} headers", limit=self.max_headers
            )
        return InvalidRequest(f"the request is not valid HTTP: {exc.message}")


class GuardedSite(web.BaseSite):
    """A TCP listener (TLS when given a context) whose connections go through a guard."""

    __slots__ = ("_guard", "_host", "_port")

    def __init__(
        self,
        runner: web.BaseRunner,
        guard: ConnectionGuard,
        host: str,
        port: int,
        *,
        ssl_context: SSLContext | None = None,
        backlog: int = 1024,
    ) -> None:
        super().__init__(runner, ssl_context=ssl_context, backlog=backlog)
        self._guard = guard
        self._host = host
        self._port = port

    @property
    def port(self) -> int:
        """The bound port (the real one when 0 was asked for)."""
        if self._server is not None and (sockets := getattr(self._server, "sockets", None)):
            return int(sockets[0].getsockname()[1])
        return self._port

    @property
    def name(self) -> str:
        scheme = "https" if self._ssl_context is not None else "http"
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"{scheme}://{host}:{self.port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None  # the runner is set up before any site starts
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._guard.protocol_factory(server, loop),
            self._host,
            self._port,
            ssl=self._ssl_context,
            backlog=self._backlog,
            reuse_address=True,
            # A client that opens a connection and never finishes the handshake is a slow head too.
            ssl_handshake_timeout=self._guard.settings.header_timeout if self._ssl_context else None,
        )


class _Tally:
    """Counts an event and logs how many happened, at most once per ``LOG_EVERY`` seconds.

    The first event is logged at once; later ones are summed into one line per window, so a
    flood of a thousand refusals is a handful of lines and none goes unreported.
    """

    __slots__ = ("_count", "_limit", "_message", "_window")

    def __init__(self, message: str, limit: float) -> None:
        self._message = message
        self._limit = limit
        self._count = 0
        self._window: asyncio.TimerHandle | None = None

    def add(self, loop: asyncio.AbstractEventLoop) -> None:
        self._count += 1
        if self._window is None:
            self._report(loop)

    def close(self) -> None:
        if self._window is not None:
            self._window.cancel()
            self._window = None
        if self._count:
            log.warning(self._message, self._count, self._limit)
            self._count = 0

    def _report(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self._count:
            self._window = None
            return
        log.warning(self._message, self._count, self._limit)
        self._count = 0
        self._window = loop.call_later(LOG_EVERY, self._report, loop)


def _answer(error: CapellaError) -> bytes:
    """A whole ``Connection: close`` HTTP response carrying ``error``, for writing to a transport."""
    status = status_for(error)
    body = msgspec.json.encode(_error_body(error))
    head = (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
        f"Content-Type: {wire.JSON}\r\n"
        f"Content-Length: {len(body)}\r\n"
        + "".join(f"{name}: {value}\r\n" for name, value in ANSWER_HEADERS.items())
        + "Connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


def _error_body(error: CapellaError) -> Error:
    return Error.of(error.code, error.message, error.details)
