"""The asynchronous client: one method per call of the HTTP API (docs/api.md).

Every non-2xx answer raises the ``capella.errors`` class whose ``code`` the server sent
(``QueueNotFound``, ``InvalidMessage``...), so callers catch the same classes the server
raises. A server that cannot be reached, or does not answer in time, raises ``Unreachable``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gzip
import logging
import ssl as ssl_module
from collections.abc import AsyncGenerator, AsyncIterable, Iterable, Mapping
from types import TracebackType
from typing import Any, Literal
from urllib.parse import quote

import aiohttp
import orjson
import zstandard

from capella import __version__
from capella.backoff import backoff
from capella.client.message import MessageLike, Segments, segments_param, to_wire, with_payload
from capella.errors import CapellaError, Unreachable

log = logging.getLogger(__name__)

DEFAULT_URL = "http://127.0.0.1:8676"

# The server sends an SSE comment every 15 s; four missed ones mean the connection is dead.
STREAM_IDLE_TIMEOUT = 60.0
# Request bodies below this size are sent as they are, even with compression on.
COMPRESS_FROM = 1024
STREAM_MAX_BACKOFF = 5.0
# Answers that mean "the server is there but cannot serve right now": a stream retries them.
RETRYABLE_STATUSES = frozenset({502, 503, 504})

Save = str | int | None
NdjsonLine = bytes | Mapping[str, Any]


class AsyncClient:
    """A Capella server at ``base_url``.

    ``timeout`` bounds every request in seconds (long-polling reads get their ``wait`` on
    top). Pass ``session`` to share an ``aiohttp.ClientSession``; the client then leaves
    closing it to you. Use as ``async with AsyncClient(url) as client:`` or call ``close()``.
    """

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        timeout: float = 30.0,
        session: aiohttp.ClientSession | None = None,
        connect_timeout: float | None = None,
        username: str | None = None,
        password: str | None = None,
        token: str | None = None,
        ssl: ssl_module.SSLContext | bool | None = None,
        compression: str | None = None,
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

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._owns_session and self._session is not None:
            await self._session.close()
            self._session = None

    # --- queues ----------------------------------------------------------------------

    async def put_queue(self, name: str, **definition: Any) -> dict[str, Any]:
        """Create or update a queue; ``definition`` holds the PUT fields (block, save...)."""
        return dict(await self._call("PUT", _queue_path(name), json=definition))

    async def queues(self) -> list[dict[str, Any]]:
        return list((await self._call("GET", "/v1/queues"))["queues"])

    async def queue(self, name: str) -> dict[str, Any]:
        return dict(await self._call("GET", _queue_path(name)))

    async def drop_queue(self, name: str) -> None:
        await self._call("DELETE", _queue_path(name))

    # --- messages --------------------------------------------------------------------

    async def produce(
        self, queue: str, messages: Iterable[MessageLike], *, save: Save = None
    ) -> list[dict[str, Any]]:
        """Append a batch; the answer holds ``{"id", "duplicate"}`` per message, in order."""
        body = {"messages": [to_wire(m) for m in messages]}
        answer = await self._call(
            "POST", _queue_path(queue, "messages"), params=_params(save=save), json=body
        )
        return list(answer["results"])

    async def produce_ndjson(
        self,
        queue: str,
        lines: AsyncIterable[NdjsonLine] | Iterable[NdjsonLine],
        *,
        save: Save = None,
    ) -> list[dict[str, Any]]:
        """Append a batch sent as NDJSON, streamed as ``lines`` are produced.

        A line is a wire message dict, or ``bytes`` already holding one JSON object.
        """
        return list(
            (
                await self._call(
                    "POST",
                    _queue_path(queue, "messages"),
                    params=_params(save=save),
                    data=_ndjson_body(lines),
                    headers={"Content-Type": "application/x-ndjson"},
                )
            )["results"]
        )

    async def read(
        self,
        queue: str,
        *,
        after: int = 0,
        limit: int = 100,
        segments: Segments | None = None,
        wait: float | None = None,
    ) -> dict[str, Any]:
        """Messages after ``after``: ``{"messages": [...], "last_id": N}``.

        Pass ``last_id`` as the next ``after``. Each message carries ``payload`` (bytes) next
        to the server's ``data``/``data_b64``. ``wait`` long-polls for up to that many seconds.
        """
        params = _params(after=after, limit=limit, segments=segments, wait=wait)
        return _with_payloads(
            await self._call("GET", _queue_path(queue, "messages"), params=params, wait=wait)
        )

    async def stream(
        self,
        queue: str,
        *,
        after: int = 0,
        segments: Segments | None = None,
        retries: int | None = None,
    ) -> AsyncGenerator[dict[str, Any], None]:
        """Follow the queue's Server-Sent Events tail, one message (with ``payload``) at a time.

        A lost connection is reopened with ``Last-Event-ID``, so no message is missed or
        repeated, after a backoff growing from 0.1 s to 5 s. ``retries`` bounds the reconnects
        in a row that fail (``None``: keep trying); a first connection that fails raises.
        """
        last_id = after
        failures = 0
        connected = False
        while True:
            try:
                async with contextlib.aclosing(self._events(queue, last_id, segments)) as events:
                    async for event_id, message in events:
                        connected = True
                        failures = 0
                        if event_id is not None:
                            last_id = event_id
                            yield message
                connected = True  # the server ended the stream cleanly: come back for more
            except Unreachable:
                if not connected or (retries is not None and failures >= retries):
                    raise
            failures += 1
            delay = backoff(failures, 0.1, STREAM_MAX_BACKOFF)
            log.debug("stream reconnect queue=%s after=%d in=%.1fs", queue, last_id, delay)
            await asyncio.sleep(delay)

    # --- delayed delivery -------------------------------------------------------------

    async def schedule(
        self,
        queue: str,
        messages: Iterable[MessageLike],
        *,
        deliver_at: float | str | None = None,
        delay: float | str | None = None,
        save: Save = None,
    ) -> list[dict[str, Any]]:
        """Produce messages held back until ``deliver_at`` or for ``delay`` (one of the two).

        ``deliver_at`` is UNIX seconds or an RFC 3339 string; ``delay`` is seconds or a
        duration such as ``"10m"``. Each answer holds ``scheduled_id`` and ``deliver_at``.
        """
        if (deliver_at is None) == (delay is None):
            raise ValueError("give exactly one of deliver_at and delay")
        due = {"deliver_at": deliver_at} if deliver_at is not None else {"delay": delay}
        return await self.produce(queue, [{**to_wire(m), **due} for m in messages], save=save)

    async def scheduled(self, queue: str, *, limit: int = 100, after: str | None = None) -> dict[str, Any]:
        """A page of delayed messages in delivery order: ``{"scheduled", "count", "next"}``.

        Pass ``next`` as ``after`` for the following page; it is ``None`` on the last one.
        """
        params = _params(limit=limit, after=after)
        return dict(await self._call("GET", _queue_path(queue, "scheduled"), params=params))

    async def scheduled_message(self, queue: str, id: int) -> dict[str, Any]:
        return dict(await self._call("GET", _queue_path(queue, "scheduled", str(id))))

    async def reschedule(
        self,
        queue: str,
        id: int,
        *,
        deliver_at: float | str | None = None,
        delay: float | str | None = None,
        save: Save = None,
    ) -> dict[str, Any]:
        """Move a delayed message; a time in the past delivers it at once."""
        body = {"deliver_at": deliver_at} if deliver_at is not None else {"delay": delay}
        path = _queue_path(queue, "scheduled", str(id))
        return dict(await self._call("PATCH", path, params=_params(save=save), json=body))

    async def cancel_scheduled(self, queue: str, id: int, *, save: Save = None) -> None:
        """Cancel one delayed message (``ScheduledNotFound`` once it was delivered)."""
        await self._call("DELETE", _queue_path(queue, "scheduled", str(id)), params=_params(save=save))

    async def cancel_scheduled_many(
        self, queue: str, ids: Iterable[int], *, save: Save = None
    ) -> dict[str, Any]:
        """Cancel many: ``{"cancelled": [...], "not_cancelled": [...]}``."""
        path = _queue_path(queue, "scheduled", "cancel")
        return dict(await self._call("POST", path, params=_params(save=save), json={"ids": list(ids)}))

    # --- subscriptions ---------------------------------------------------------------

    async def read_subscription(
        self,
        queue: str,
        name: str,
        *,
        limit: int = 100,
        wait: float | None = None,
        segments: Segments | None = None,
        commit: Literal["auto", "none"] = "auto",
    ) -> dict[str, Any]:
        """Messages after the subscription's cursor, shaped as ``read``.

        With ``commit="auto"`` the cursor moves to the answer's ``last_id`` (at-most-once);
        with ``"none"`` call ``commit`` once the messages are handled (at-least-once).
        """
        params = _params(limit=limit, wait=wait, segments=segments, commit=commit)
        path = _subscription_path(queue, name, "messages")
        return _with_payloads(await self._call("GET", path, params=params, wait=wait))

    async def commit(
        self,
        queue: str,
        name: str,
        last_id: int,
        *,
        replica: bool | None = None,
        reset: bool = False,
        save: Save = None,
    ) -> dict[str, Any]:
        """Move (or create) a subscription's cursor; it never moves back unless ``reset``."""
        body: dict[str, Any] = {"last_id": last_id}
        if replica is not None:
            body["replica"] = replica
        if reset:
            body["reset"] = True
        path = _subscription_path(queue, name)
        return dict(await self._call("PUT", path, params=_params(save=save), json=body))

    async def subscription(self, queue: str, name: str) -> dict[str, Any]:
        return dict(await self._call("GET", _subscription_path(queue, name)))

    async def subscriptions(self, queue: str) -> list[dict[str, Any]]:
        return list((await self._call("GET", _queue_path(queue, "subscriptions")))["subscriptions"])

    async def delete_subscription(self, queue: str, name: str) -> None:
        await self._call("DELETE", _subscription_path(queue, name))

    async def replicas(self, queue: str, id: int) -> dict[str, Any]:
        """The replica subscriptions at or past message ``id``: ``{"id", "count", "subscriptions"}``."""
        return dict(await self._call("GET", _queue_path(queue, "replicas"), params={"id": str(id)}))

    # --- work queues (ack-mode subscriptions) ---------------------------------------

    async def put_work(self, queue: str, name: str, *, save: Save = None, **policy: Any) -> dict[str, Any]:
        """Create an ack-mode subscription, or change its retry policy.

        ``policy`` holds ``lease``, ``max_attempts``, ``backoff`` (``"fixed"`` or
        ``"exponential"``), ``delay``, ``max_delay``, ``jitter`` and ``dead_letter`` (a queue).
        """
        body = {"mode": "ack", "policy": policy}
        path = _subscription_path(queue, name)
        return dict(await self._call("PUT", path, params=_params(save=save), json=body))

    async def claim(
        self,
        queue: str,
        name: str,
        *,
        limit: int = 1,
        lease: float | str | None = None,
        wait: float | None = None,
        save: Save = None,
    ) -> list[dict[str, Any]]:
        """Lease up to ``limit`` messages; each has ``payload``, ``receipt``, ``attempt``,
        ``lease_until`` and ``last_error``. ``wait`` long-polls when there is none."""
        params = _params(limit=limit, lease=lease, wait=wait, save=save)
        path = _subscription_path(queue, name, "claim")
        answer = await self._call("POST", path, params=params, wait=wait)
        return list(_with_payloads(answer)["messages"])

    async def ack(self, queue: str, name: str, receipts: str | Iterable[str], *, save: Save = None) -> Any:
        """Finish claimed messages. One receipt (a ``str``) raises its error (``LeaseLost``...);
        a list answers one ``{"receipt", "id", "ok"[, "error"]}`` per receipt."""
        return await self._receipts(queue, name, "ack", receipts, {}, save)

    async def nack(
        self,
        queue: str,
        name: str,
        receipts: str | Iterable[str],
        *,
        delay: float | str | None = None,
        error: str | None = None,
        save: Save = None,
    ) -> Any:
        """Give claimed messages back with ``error``: retried after ``delay`` (default: the
        policy's backoff), or dead once their attempts are used up (``"dead": true``)."""
        return await self._receipts(queue, name, "nack", receipts, {"delay": delay, "error": error}, save)

    async def extend(
        self,
        queue: str,
        name: str,
        receipts: str | Iterable[str],
        *,
        lease: float | str | None = None,
        save: Save = None,
    ) -> Any:
        """Hold claimed messages for ``lease`` more from now (default: the policy's lease)."""
        return await self._receipts(queue, name, "extend", receipts, {"lease": lease}, save)

    async def work(
        self,
        queue: str,
        name: str,
        *,
        status: str | Iterable[str] | None = None,
        source: str | None = None,
        segments: Segments | None = None,
        headers: Mapping[str, str] | None = None,
        json: Mapping[str, Any] | None = None,
        after: int = 0,
        limit: int = 100,
    ) -> dict[str, Any]:
        """An operator's page of messages: ``{"messages": [...], "next_after": id | None}``.

        ``status`` is some of leased, waiting, ready, dead; ``json`` maps a dotted path of the
        JSON payload to the value it must equal (``{"customer.id": 42}``).
        """
        params = _params(
            status=status if status is None or isinstance(status, str) else ",".join(status),
            source=source,
            segments=segments,
            after=after,
            limit=limit,
        )
        for key, value in (headers or {}).items():
            params[f"header.{key}"] = value
        for path, value in (json or {}).items():
            params[f"json.{path}"] = orjson.dumps(value).decode()
        answer = await self._call("GET", _subscription_path(queue, name, "work"), params=params)
        return _with_payloads(answer)

    async def work_message(self, queue: str, name: str, id: int) -> dict[str, Any]:
        """One message's ``status``, ``attempts`` and ``last_error``."""
        answer = await self._call("GET", _subscription_path(queue, name, "work", str(id)))
        return with_payload(answer)

    async def retry_work(
        self, queue: str, name: str, *, save: Save = None, **selection: Any
    ) -> dict[str, Any]:
        """Waiting messages become claimable now (or ``at``/after ``delay``); dead ones move back.

        ``selection`` holds ``status``, ``ids``, ``source``, ``segments``, ``headers``, ``json``,
        ``after`` and ``limit``; the answer has ``retried`` and ``next_after``.
        """
        path = _subscription_path(queue, name, "work", "retry")
        return dict(await self._call("POST", path, params=_params(save=save), json=selection))

    async def delete_work(
        self, queue: str, name: str, *, save: Save = None, **selection: Any
    ) -> dict[str, Any]:
        """Finish messages without processing them; ``status`` or ``ids`` is required."""
        path = _subscription_path(queue, name, "work", "delete")
        return dict(await self._call("POST", path, params=_params(save=save), json=selection))

    async def _receipts(
        self,
        queue: str,
        name: str,
        verb: str,
        receipts: str | Iterable[str],
        fields: dict[str, Any],
        save: Save,
    ) -> Any:
        body = {k: v for k, v in fields.items() if v is not None}
        if isinstance(receipts, str):
            body["receipt"] = receipts
        else:
            body["receipts"] = list(receipts)
        path = _subscription_path(queue, name, verb)
        answer = await self._call("POST", path, params=_params(save=save), json=body)
        return dict(answer) if isinstance(receipts, str) else list(answer["results"])

    # --- handlers --------------------------------------------------------------------

    async def put_handler(
        self,
        name: str,
        type: str,
        *,
        queues: str | Iterable[str],
        params: Mapping[str, Any] | None = None,
        started: bool = True,
    ) -> dict[str, Any]:
        """Create or replace a handler (``flush``, ``unload``, ``archive``, ``expire``).

        ``queues`` holds queue names or fnmatch patterns (``"logs-*"``); a single string is
        one of them. ``params`` are the type's parameters; durations may be ``"10m"``.
        """
        body = {
            "type": type,
            "queues": [queues] if isinstance(queues, str) else list(queues),
            "params": dict(params or {}),
            "started": started,
        }
        return dict(await self._call("PUT", _handler_path(name), json=body))

    async def handlers(self) -> list[dict[str, Any]]:
        return list((await self._call("GET", "/v1/handlers"))["handlers"])

    async def handler(self, name: str) -> dict[str, Any]:
        return dict(await self._call("GET", _handler_path(name)))

    async def drop_handler(self, name: str) -> None:
        await self._call("DELETE", _handler_path(name))

    async def start_handler(self, name: str) -> dict[str, Any]:
        return dict(await self._call("POST", _handler_path(name, "start")))

    async def stop_handler(self, name: str) -> dict[str, Any]:
        return dict(await self._call("POST", _handler_path(name, "stop")))

    async def run_handler(self, name: str) -> dict[str, Any]:
        """One pass now (also for a stopped handler); the handler as it is after the pass."""
        return dict(await self._call("POST", _handler_path(name, "run")))

    # --- external clusters -------------------------------------------------------------

    async def put_cluster(self, name: str, **fields: Any) -> dict[str, Any]:
        """Register or replace an external cluster; ``fields`` are the PUT fields (url, token_env...).

        The answer never holds the password or token, only where it comes from.
        """
        return dict(await self._call("PUT", _cluster_path(name), json=fields))

    async def clusters(self) -> list[dict[str, Any]]:
        return list((await self._call("GET", "/v1/clusters"))["clusters"])

    async def cluster(self, name: str) -> dict[str, Any]:
        return dict(await self._call("GET", _cluster_path(name)))

    async def drop_cluster(self, name: str) -> None:
        await self._call("DELETE", _cluster_path(name))

    async def ping_cluster(self, name: str) -> dict[str, Any]:
        """``{"ok", "ready", "latency_ms", "error"}``: a failed ping is an answer, not an error."""
        return dict(await self._call("POST", _cluster_path(name, "ping")))

    # --- users and tokens --------------------------------------------------------------

    async def users(self) -> list[dict[str, Any]]:
        """The users the caller may read; never a password hash."""
        return list((await self._call("GET", "/v1/users"))["users"])

    async def user(self, name: str) -> dict[str, Any]:
        return dict(await self._call("GET", _user_path(name)))

    async def put_user(self, name: str, **fields: Any) -> dict[str, Any]:
        """Create (``password`` required) or change a user: ``password``, ``admin``, ``enabled``, ``rules``.

        Rules are ``{"effect", "type", "action", "name"}`` objects or ``"allow:queue:read:orders-*"``.
        """
        return dict(await self._call("PUT", _user_path(name), json=fields))

    async def drop_user(self, name: str) -> None:
        """Delete the user; its tokens are revoked with it."""
        await self._call("DELETE", _user_path(name))

    async def change_password(
        self, name: str, password: str, old_password: str | None = None
    ) -> dict[str, Any]:
        """Set a new password; ``old_password`` is needed unless the caller may administer ``name``."""
        body = {"password": password}
        if old_password is not None:
            body["old_password"] = old_password
        return dict(await self._call("POST", _user_path(name, "password"), json=body))

    async def me(self) -> dict[str, Any]:
        """Who the server takes the caller for: ``{"user", "admin", "via", "rules"}``."""
        return dict(await self._call("GET", "/v1/me"))

    async def create_token(
        self, ttl: float | str | None = None, description: str | None = None, user: str | None = None
    ) -> dict[str, Any]:
        """A new bearer token (``ttl`` in seconds or ``"24h"``); its text, ``token``, is only here.

        Needs Basic credentials: a token cannot create tokens.
        """
        body = {
            key: value
            for key, value in (("ttl", ttl), ("description", description), ("user", user))
            if value is not None
        }
        return dict(await self._call("POST", "/v1/tokens", json=body))

    async def tokens(self) -> list[dict[str, Any]]:
        """The caller's unexpired tokens (and those of users it may administer), without their text."""
        return list((await self._call("GET", "/v1/tokens"))["tokens"])

    async def revoke_token(self, id: str) -> None:
        await self._call("DELETE", "/v1/tokens/" + quote(id, safe=""))

    # --- operations ------------------------------------------------------------------

    async def health(self) -> dict[str, Any]:
        """``{"status": "ok"}`` while the server process serves."""
        return dict(await self._call("GET", "/healthz"))

    async def ready(self) -> bool:
        """Whether every queue is recovered and the server takes traffic."""
        try:
            await self._call("GET", "/readyz")
        except Unreachable:
            raise
        except CapellaError:
            return False
        return True

    # --- plumbing --------------------------------------------------------------------

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            headers = {"User-Agent": f"capella-client/{__version__}"}
            if self._authorization is not None:
                headers["Authorization"] = self._authorization
            connector = aiohttp.TCPConnector(ssl=self._ssl) if self._ssl is not None else None
            self._session = aiohttp.ClientSession(headers=headers, connector=connector)
        return self._session

    def _compressed(self, data: bytes, headers: dict[str, str]) -> bytes:
        # Small bodies are not worth it; large batches of JSON shrink several times.
        if self._compression is None or len(data) < COMPRESS_FROM:
            return data
        headers["Content-Encoding"] = self._compression
        if self._compression == "gzip":
            return gzip.compress(data, compresslevel=5)
        return zstandard.ZstdCompressor(level=3).compress(data)

    async def _call(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        json: object = None,
        data: Any = None,
        headers: dict[str, str] | None = None,
        wait: float | None = None,
    ) -> Any:
        """Send one request; the decoded JSON answer, ``None`` for an empty one."""
        url = self.base_url + path
        if json is not None:
            headers = {"Content-Type": "application/json"}
            data = self._compressed(orjson.dumps(json), headers)
        timeout = aiohttp.ClientTimeout(total=self._timeout + (wait or 0.0), connect=self._connect_timeout)
        try:
            async with self._http().request(
                method, url, params=params, data=data, headers=headers, timeout=timeout
            ) as resp:
                body = await resp.read()
                status = resp.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _unreachable(url, exc, self._timeout) from exc
        if status >= 400:
            raise error_from_answer(status, body)
        if not body:
            return None
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            raise CapellaError(f"{method} {url}: the answer is not JSON") from None

    async def _events(
        self, queue: str, after: int, segments: Segments | None
    ) -> AsyncGenerator[tuple[int | None, dict[str, Any]], None]:
        """One SSE connection: ``(id, message)`` per message event until the server closes.

        ``id`` is ``None`` for events that carry no message (the first, on connecting).
        """
        url = self.base_url + _queue_path(queue, "stream")
        headers = {"Accept": "text/event-stream", "Last-Event-ID": str(after)}
        timeout = aiohttp.ClientTimeout(total=None, connect=self._timeout, sock_read=STREAM_IDLE_TIMEOUT)
        try:
            async with self._http().get(
                url, params=_params(after=after, segments=segments), headers=headers, timeout=timeout
            ) as resp:
                if resp.status >= 400:
                    error = error_from_answer(resp.status, await resp.read())
                    if resp.status in RETRYABLE_STATUSES:
                        raise Unreachable(f"{url}: {error.code}: {error.message}", url=url)
                    raise error
                yield None, {}  # connected: tells ``stream`` this server answers
                parser = EventParser()
                async for chunk in resp.content.iter_any():
                    for event in parser.feed(chunk):
                        yield _message_event(event)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _unreachable(url, exc, STREAM_IDLE_TIMEOUT) from exc


class EventParser:
    """Server-Sent Events from bytes as they arrive; lines may be split across chunks."""

    def __init__(self) -> None:
        self._pending = b""
        self._fields: dict[str, str] = {}
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[dict[str, str]]:
        """The events completed by ``chunk``, each as ``{"id", "event", "data"}`` (when given)."""
        events = []
        lines = (self._pending + chunk).split(b"\n")
        self._pending = lines.pop()
        for raw in lines:
            line = raw.rstrip(b"\r").decode("utf-8", errors="replace")
            if not line:
                if self._data or self._fields:
                    event = dict(self._fields)
                    if self._data:
                        event["data"] = "\n".join(self._data)
                    events.append(event)
                self._fields = {}
                self._data = []
                continue
            if line.startswith(":"):
                continue  # a keep-alive comment
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "data":
                self._data.append(value)
            elif name in ("id", "event", "retry"):
                self._fields[name] = value
        return events


def _message_event(event: dict[str, str]) -> tuple[int | None, dict[str, Any]]:
    kind = event.get("event", "message")
    if kind == "error":
        raise error_from_answer(500, event.get("data", "").encode())
    if kind != "message" or "data" not in event:
        return None, {}
    try:
        message = orjson.loads(event["data"])
    except orjson.JSONDecodeError:
        raise CapellaError("stream: an event's data is not JSON") from None
    event_id = event.get("id", "")
    return (int(event_id) if event_id.isdigit() else int(message["id"])), with_payload(message)


def error_codes() -> dict[str, type[CapellaError]]:
    """Every ``code`` → the most general ``CapellaError`` class that carries it."""
    table: dict[str, type[CapellaError]] = {}
    pending: list[type[CapellaError]] = [CapellaError]
    while pending:
        cls = pending.pop(0)
        table.setdefault(cls.code, cls)
        pending.extend(cls.__subclasses__())
    return table


def error_from_answer(status: int, body: bytes) -> CapellaError:
    """The error a non-2xx answer stands for: the class matching its JSON ``code``."""
    try:
        error = orjson.loads(body)["error"]
        code = str(error.pop("code"))
        message = str(error.pop("message", ""))
        details = {str(k): v for k, v in error.items()}
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        text = body[:200].decode("utf-8", errors="replace").strip()
        exc = CapellaError(f"HTTP {status}: {text}" if text else f"HTTP {status}", status=status)
        exc.code = "http_error"
        return exc
    cls = error_codes().get(code)
    if cls is None:
        exc = CapellaError(message, **details)
        exc.code = code
        return exc
    return cls(message, **details)


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
    return Unreachable(f"cannot reach {url}: {reason}", url=url)


def _with_payloads(answer: dict[str, Any]) -> dict[str, Any]:
    for message in answer["messages"]:
        with_payload(message)
    return answer


async def _ndjson_body(
    lines: AsyncIterable[NdjsonLine] | Iterable[NdjsonLine],
) -> AsyncGenerator[bytes, None]:
    if isinstance(lines, AsyncIterable):
        async for line in lines:
            yield _ndjson_line(line)
    else:
        for line in lines:
            yield _ndjson_line(line)


def _ndjson_line(line: NdjsonLine) -> bytes:
    if isinstance(line, bytes | bytearray):
        return bytes(line) if line.endswith(b"\n") else bytes(line) + b"\n"
    return orjson.dumps(to_wire(line), option=orjson.OPT_APPEND_NEWLINE)


def _params(*, segments: Segments | None = None, **values: object) -> dict[str, str]:
    params = {key: str(value) for key, value in values.items() if value is not None}
    if segments is not None:
        params["segments"] = segments_param(segments)
    return params


def _queue_path(queue: str, *rest: str) -> str:
    return "/".join(("/v1/queues", quote(queue, safe=""), *rest))


def _subscription_path(queue: str, name: str, *rest: str) -> str:
    return _queue_path(queue, "subscriptions", quote(name, safe=""), *rest)


def _handler_path(name: str, *rest: str) -> str:
    return "/".join(("/v1/handlers", quote(name, safe=""), *rest))


def _cluster_path(name: str, *rest: str) -> str:
    return "/".join(("/v1/clusters", quote(name, safe=""), *rest))


def _user_path(name: str, *rest: str) -> str:
    return "/".join(("/v1/users", quote(name, safe=""), *rest))
