"""How the client talks HTTP: one session, credentials, compression, errors back as classes.

``Transport.call`` sends one request and gives the answer's bytes (``answers.decode_answer``
makes them a wire struct; ``send`` gives its status too); ``Transport.events`` follows one
Server-Sent Events connection.
Every non-2xx answer becomes the ``capella.errors`` class whose ``code`` the server sent
(``answers.error_from_answer``); a server that cannot be reached, or does not answer in time,
raises ``Unreachable``. Redirects are not followed (a Capella server never sends one): a
3xx is an error, so credentials never travel to a place the caller did not name and the
egress policy sees only the URL it was given.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import ssl as ssl_module
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
import zstandard

from capella import __version__
from capella.client.answers import error_from_answer
from capella.client.connector import EgressConnector
from capella.client.events import EventParser, message_event
from capella.egress import Egress
from capella.errors import GatewayTimeout, Unreachable
from capella.wire.messages import StoredMessage

# The server sends an SSE comment every 15 s; four missed ones mean the connection is dead.
STREAM_IDLE_TIMEOUT = 60.0
# Request bodies below this size are sent as they are, even with compression on.
COMPRESS_FROM = 1024
# Answers that mean "the server is there but cannot serve right now": a stream retries them.
RETRYABLE_STATUSES = frozenset({502, 503, 504})


class Transport:
    """The HTTP side of a client: a lazily opened session (or the caller's), and its options."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float,
        session: aiohttp.ClientSession | None,
        connect_timeout: float | None,
        username: str | None,
        password: str | None,
        token: str | None,
        ssl: ssl_module.SSLContext | bool | None,
        compression: str | None,
        egress: Egress | None = None,
    ) -> None:
        if compression not in (None, "gzip", "zstd"):
            raise ValueError(f"compression must be gzip or zstd, not {compression!r}")
        self.base_url = base_url.rstrip("/")
        self._timeout = timeout
        self._connect_timeout = connect_timeout
        self._session = session
        self._owns_session = session is None
        self._authorization = _authorization(username, password, token)
        self._ssl = ssl
        self._compression = compression
        self._egress = egress

    async def close(self) -> None:
        if self._owns_session and self._session is not None:
            await self._session.close()
            self._session = None

    def http(self) -> aiohttp.ClientSession:
        if self._session is None:
            headers = {"User-Agent": f"capella-client/{__version__}"}
            if self._authorization is not None:
                headers["Authorization"] = self._authorization
            options: dict[str, Any] = {} if self._ssl is None else {"ssl": self._ssl}
            connector: aiohttp.TCPConnector | None = None
            if self._egress is not None:
                connector = EgressConnector(self._egress, **options)
            elif options:
                connector = aiohttp.TCPConnector(**options)
            self._session = aiohttp.ClientSession(headers=headers, connector=connector)
        return self._session

    def compressed(self, data: bytes, headers: dict[str, str]) -> bytes:
        # Small bodies are not worth it; large batches of JSON shrink several times.
        if self._compression is None or len(data) < COMPRESS_FROM:
            return data
        headers["Content-Encoding"] = self._compression
        if self._compression == "gzip":
            return gzip.compress(data, compresslevel=5)
        return zstandard.ZstdCompressor(level=3).compress(data)

    async def call(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        json: object = None,
        data: Any = None,
        headers: dict[str, str] | None = None,
        wait: float | None = None,
    ) -> bytes:
        """Send one request; the answer's body (empty when there is none)."""
        answer = await self.send(
            method, path, params=params, json=json, data=data, headers=headers, wait=wait
        )
        return answer[1]

    async def send(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        json: object = None,
        data: Any = None,
        headers: dict[str, str] | None = None,
        wait: float | None = None,
    ) -> tuple[int, bytes]:
        """``call``, with the answer's status too (a PUT answers 201 when it created)."""
        url = self.base_url + path
        if json is not None:
            headers = {"Content-Type": "application/json"}
            data = self.compressed(orjson.dumps(json), headers)
        timeout = aiohttp.ClientTimeout(total=self._timeout + (wait or 0.0), connect=self._connect_timeout)
        try:
            async with self.http().request(
                method, url, params=params, data=data, headers=headers, timeout=timeout, allow_redirects=False
            ) as resp:
                body = await resp.read()
                status = resp.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _unreachable(url, exc, self._timeout) from exc
        if status >= 300:
            raise error_from_answer(status, body)
        return status, body

    @contextlib.asynccontextmanager
    async def relay(
        self, method: str, path: str, params: dict[str, str], headers: dict[str, str], data: bytes | None
    ) -> AsyncIterator[Relayed]:
        """Send one request as it came and hold its answer open, for the server's cluster relay.

        Any status is an answer here (it is the far side's to give); only not reaching the
        server raises. The body is read as it arrives, so a tail or a long poll streams through.
        """
        url = self.base_url + path
        timeout = aiohttp.ClientTimeout(
            total=None,
            connect=self._connect_timeout or self._timeout,
            sock_read=self._timeout + STREAM_IDLE_TIMEOUT,
        )
        try:
            async with self.http().request(
                method, url, params=params, data=data, headers=headers, timeout=timeout, allow_redirects=False
            ) as resp:
                yield Relayed(resp.status, dict(resp.headers), url, resp)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _unreachable(url, exc, self._timeout) from exc

    async def events(
        self, path: str, params: dict[str, str], after: int
    ) -> AsyncGenerator[tuple[int, StoredMessage] | None, None]:
        """One SSE connection: ``(id, message)`` per message event until the server closes.

        ``None`` stands for an event that carries no message (the first, on connecting).
        """
        url = self.base_url + path
        headers = {"Accept": "text/event-stream", "Last-Event-ID": str(after)}
        timeout = aiohttp.ClientTimeout(total=None, connect=self._timeout, sock_read=STREAM_IDLE_TIMEOUT)
        try:
            async with self.http().get(
                url, params=params, headers=headers, timeout=timeout, allow_redirects=False
            ) as resp:
                if resp.status >= 300:
                    error = error_from_answer(resp.status, await resp.read())
                    if resp.status in RETRYABLE_STATUSES:
                        raise Unreachable(f"{url}: {error.code}: {error.message}", url=url)
                    raise error
                yield None  # connected: tells ``stream`` this server answers
                parser = EventParser()
                async for chunk in resp.content.iter_any():
                    for event in parser.feed(chunk):
                        yield message_event(event)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _unreachable(url, exc, STREAM_IDLE_TIMEOUT) from exc


@dataclass(slots=True)
class Relayed:
    """An answer being relayed: its status and headers, and its body as it arrives."""

    status: int
    headers: dict[str, str]
    url: str
    _response: aiohttp.ClientResponse

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.content.iter_any():
                yield chunk
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _unreachable(self.url, exc, STREAM_IDLE_TIMEOUT) from exc


def _authorization(username: str | None, password: str | None, token: str | None) -> str | None:
    # Built by hand: aiohttp 3.14 deprecates BasicAuth, and its replacement is not in 3.10.
    if token is not None:
        return f"Bearer {token}"
    if username is not None:
        pair = f"{username}:{password or ''}".encode()
        return "Basic " + base64.b64encode(pair).decode("ascii")
    return None


def _unreachable(url: str, exc: BaseException, timeout: float) -> Unreachable:
    reason = str(exc) or f"no answer within {timeout:g}s"
    # aiohttp's connect and read timeouts are TimeoutErrors: the far side was there, too slow.
    kind = GatewayTimeout if isinstance(exc, TimeoutError) else Unreachable
    return kind(f"cannot reach {url}: {reason}", url=url)
