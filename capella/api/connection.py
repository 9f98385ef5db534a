"""The connection guard: caps on open connections (in all and per client address), idle
keep-alive connections that give way when slots run low, and a deadline for every request head.

aiohttp parses request heads itself. While a head is incomplete, only its keep-alive timer
(``keepalive_timeout``, 75 s here) would ever close the connection, so a few hundred clients
that send a head one byte at a time (slowloris) could hold a server's connections for minutes.
``ConnectionGuard`` wraps each aiohttp protocol and adds:

- ``max_connections``: a connection over the cap is answered ``503 too_many_connections``
  and closed, without reaching aiohttp; the others are served as usual.
- ``max_connections_per_address``: one client address (IPv4, or an IPv6 /64 as for failed
  logins) holds at most this many; one more is answered ``503 too_many_connections_from_address``.
- Idle keep-alive connections give way: once the server holds 3/4 of ``max_connections``,
  each new connection first closes the oldest idle one (and an address at its cap closes its
  own oldest idle one), and an address keeps at most ``max_idle_per_address`` idle ones. So
  idle connections, however many an attacker opens, never keep anyone else out.
- ``max_bodies_per_address``: requests whose body is still arriving, per address; one more
  is answered ``429 too_many_bodies`` (with ``Retry-After``) and its connection closed unread.
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
import itertools
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
from capella.auth.throttle import client_key
from capella.config import ServerSettings
from capella.errors import (
    CapellaError,
    HeadersTooLarge,
    InvalidRequest,
    RequestTimeout,
    TooManyBodies,
    TooManyConnections,
    TooManyConnectionsFromAddress,
)
from capella.tally import Tally
from capella.wire.answers import Error

log = logging.getLogger(__name__)

# After its 503, a refused connection is half-closed and its input discarded until the client
# closes, or for this long: closing at once, with the client's request unread, would reset
# the connection and could destroy the 503 before the client reads it.
REFUSED_LINGER = 2.0
# Past this share of max_connections, a new connection first closes the oldest idle one.
RECLAIM_SHARE = 0.75
# How many of the oldest idle connections one reclaim looks at: one still writing its last
# answer is skipped, and the look stays bounded however many are idle.
RECLAIM_LOOK = 8


class ConnectionGuard:
    """Counts open connections and times request heads; one per server, shared by its sites."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self._open: dict[asyncio.BaseTransport, _Connection] = {}
        # Idle keep-alive connections, the longest idle first (a dict keeps insertion order).
        self._idle: dict[_Connection, None] = {}
        self._addresses: dict[str, _Address] = {}
        self._lingering = 0
        self.per_address = min(settings.max_connections_per_address, settings.max_connections)
        self.reclaim_at = int(settings.max_connections * RECLAIM_SHARE)
        self._refused = Tally(
            "connections refused: %d over max_connections=%d", settings.max_connections, log
        )
        self._refused_address = Tally(
            "connections refused: %d over max_connections_per_address=%d", self.per_address, log
        )
        self._reclaimed = Tally(
            "idle keep-alive connections closed early: %d, to keep slots free (max_connections=%d)",
            settings.max_connections,
            log,
        )
        self._too_many_bodies = Tally(
            "requests refused: %d over max_bodies_per_address=%d", settings.max_bodies_per_address, log
        )
        self._timed_out = Tally(
            "connections closed: %d sent no complete request head within header_timeout=%gs",
            settings.header_timeout,
            log,
        )
        self.refused_answer = _answer(
            TooManyConnections(
                f"the server already holds {settings.max_connections} connections; try again later",
                limit=settings.max_connections,
            )
        )
        self.refused_address_answer = _answer(
            TooManyConnectionsFromAddress(
                f"this client address already holds {self.per_address} connections; try again later",
                limit=self.per_address,
            )
        )
        self.timeout_answer = _answer(
            RequestTimeout(f"the request head did not arrive within {settings.header_timeout:g} s")
        )
        self._bodies_error = TooManyBodies(
            f"this client address already has {settings.max_bodies_per_address} request bodies arriving; "
            "try again later",
            limit=settings.max_bodies_per_address,
            retry_after=1,
        )
        self.middleware = self._tracking_middleware()

    def close(self) -> None:
        """Log what is still uncounted; call after the sites have stopped."""
        for tally in (self._refused, self._refused_address, self._reclaimed, self._too_many_bodies):
            tally.close()
        self._timed_out.close()

    def protocol_factory(
        self, server: web.Server, loop: asyncio.AbstractEventLoop
    ) -> Callable[[], asyncio.Protocol]:
        """What ``loop.create_server`` calls for each accepted connection."""
        settings = self.settings

        def handler() -> JsonErrorRequestHandler:
            return JsonErrorRequestHandler(
                server,
                loop=loop,
                keepalive_timeout=settings.keepalive_timeout,
                access_log=None,  # type: ignore[arg-type]  # None turns access logs off (aiohttp docs)
                max_line_size=settings.max_header_size,
                max_field_size=settings.max_header_size,
                max_headers=settings.max_headers,
                # An answer given before its body was read (refused, unauthorized) is followed
                # by discarding the rest of the body for this long, then the close: aiohttp's
                # 10 s would let a refused sender keep the connection that much longer.
                lingering_time=REFUSED_LINGER,
            )

        return lambda: _Connection(self, handler, loop)

    def _tracking_middleware(self) -> Middleware:
        connections = self._open
        max_bodies = self.settings.max_bodies_per_address

        @web.middleware
        async def track_request(request: web.Request, handler: Handler) -> web.StreamResponse:
            transport = request.transport
            connection = None if transport is None else connections.get(transport)
            if connection is None:  # not through a guarded site (the test client)
                return await handler(request)
            connection.request_started()
            try:
                if request.content.is_eof():  # no body, or all of it here already: the usual case
                    return await handler(request)
                address = connection.address
                if address.bodies >= max_bodies:
                    return self._refuse_body(request)
                address.bodies += 1
                try:
                    return await handler(request)
                finally:
                    address.bodies -= 1
                    if address.connections == 0 and address.bodies == 0:  # its connection is gone
                        self._addresses.pop(address.key, None)
            finally:
                connection.request_finished()

        return track_request

    def _refuse_body(self, request: web.Request) -> web.StreamResponse:
        self._too_many_bodies.add(asyncio.get_running_loop())
        error = self._bodies_error
        response = json_response(_error_body(error), status_for(error), headers={"Retry-After": "1"})
        response.force_close()  # the body stays unread: nothing more can follow on this connection
        return response

    def _address(self, transport: asyncio.BaseTransport) -> _Address:
        peer = transport.get_extra_info("peername")
        key = client_key(str(peer[0])) if isinstance(peer, tuple) and peer else str(peer)
        address = self._addresses.get(key)
        if address is None:
            address = self._addresses[key] = _Address(key)
        return address

    def _close_idle(self, idle: dict[_Connection, None]) -> bool:
        """Close the longest idle connection of ``idle`` that is really waiting; whether one was."""
        for connection in list(itertools.islice(idle, RECLAIM_LOOK)):
            if connection.close_idle():
                self._reclaimed.add(connection._loop)
                return True
        return False

    def _forget(self, connection: _Connection) -> None:
        """Stop counting ``connection``: it is closed or closing."""
        transport = connection._transport
        if transport is None or self._open.pop(transport, None) is None:
            return
        self._idle.pop(connection, None)
        address = connection.address
        address.idle.pop(connection, None)
        address.connections -= 1
        if address.connections == 0 and address.bodies == 0:
            self._addresses.pop(address.key, None)


class _Address:
    """What one client address (an IPv6 /64) holds: its connections, its idle ones, its bodies."""

    __slots__ = ("bodies", "connections", "idle", "key")

    def __init__(self, key: str) -> None:
        self.key = key
        self.connections = 0
        self.bodies = 0
        self.idle: dict[_Connection, None] = {}


class _Connection(asyncio.Protocol):
    """One accepted connection: aiohttp's protocol behind a head deadline, or a refusal."""

    __slots__ = (
        "_due",
        "_guard",
        "_handler",
        "_idle",
        "_loop",
        "_make_handler",
        "_timer",
        "_transport",
        "address",
    )

    def __init__(
        self,
        guard: ConnectionGuard,
        make_handler: Callable[[], JsonErrorRequestHandler],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._guard = guard
        self._make_handler = make_handler
        self._loop = loop
        self._handler: JsonErrorRequestHandler | None = None
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
        if len(guard._open) >= guard.reclaim_at and guard._idle:
            guard._close_idle(guard._idle)  # slots run low: the longest idle one gives way
        if len(guard._open) >= guard.settings.max_connections:
            self._refuse(transport, guard.refused_answer, guard._refused)
            return
        address = guard._address(transport)
        if address.connections >= guard.per_address and not guard._close_idle(address.idle):
            self._refuse(transport, guard.refused_address_answer, guard._refused_address)
            return
        self.address = address
        address.connections += 1
        guard._open[transport] = self
        self._head_due()
        self._handler = self._make_handler()
        self._handler.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._handler is None:
            return  # refused: read and discard until the client closes
        if self._idle:
            self._idle = False
            self._guard._idle.pop(self, None)
            self.address.idle.pop(self, None)
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
        self._guard._forget(self)
        self._handler.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._handler is not None:
            self._handler.pause_writing()

    def resume_writing(self) -> None:
        if self._handler is not None:
            self._handler.resume_writing()

    def request_started(self) -> None:
        if self._idle:  # a pipelined request: no first byte told us
            self._idle = False
            self._guard._idle.pop(self, None)
            self.address.idle.pop(self, None)
        self._due = None

    def request_finished(self) -> None:
        guard = self._guard
        transport = self._transport
        if transport is None or guard._open.get(transport) is not self:
            return  # closed while its request ran: no longer counted
        self._idle = True
        guard._idle[self] = None
        idle = self.address.idle
        idle[self] = None
        if len(idle) > guard.settings.max_idle_per_address:
            guard._close_idle(idle)

    def close_idle(self) -> bool:
        """Close this connection if it waits for its next request; whether it did.

        Marked idle when its handler returns, it may still be writing that answer: then it
        is left alone (aiohttp's own keep-alive timer makes the same check).
        """
        handler = self._handler
        if handler is None or not handler.waiting():
            return False
        self._guard._forget(self)
        self._idle = False
        handler.force_close()
        return True

    def _refuse(self, transport: asyncio.Transport, answer: bytes, tally: Tally) -> None:
        guard = self._guard
        tally.add(self._loop)
        guard._lingering += 1
        transport.write(answer)
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

    def waiting(self) -> bool:
        """Whether it waits, idle, for the next request: aiohttp's own keep-alive test."""
        waiter = self._waiter
        return waiter is not None and not waiter.done()

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
