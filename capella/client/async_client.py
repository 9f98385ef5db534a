"""The asynchronous client: one method per call of the HTTP API (docs/api.md).

Every answer is the typed msgspec struct of the HTTP contract in ``capella.wire``
(``QueueInfo``, ``Messages``, ``ClaimedMessage``...), decoded straight from the answer's
bytes; ``msgspec.to_builtins`` turns one into plain dicts and lists. A message read back
has ``payload``, its bytes, whichever of ``data`` and ``data_b64`` the server chose.
Messages travel as record batches by default (docs/format.md): ``produce`` sends one, and a
read asks for the binary page and decodes it to the same structs the JSON answer gives;
``binary=False`` asks for JSON, which stays the API's default for every other client.
Every non-2xx answer raises the ``capella.errors`` class whose ``code`` the server sent
(``QueueNotFound``, ``InvalidMessage``...), so callers catch the same classes the server
raises. A server that cannot be reached, or does not answer in time, raises ``Unreachable``.
The HTTP side is ``transport.py``; SSE parsing ``events.py``; paths ``paths.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl as ssl_module
from collections.abc import AsyncGenerator, AsyncIterable, Iterable, Mapping
from types import TracebackType
from typing import Any, Literal, TypeVar
from urllib.parse import quote

import aiohttp
import orjson

from capella.backoff import backoff
from capella.client import paths
from capella.client.answers import Saved, decode_answer
from capella.client.message import MessageLike, Segments, to_batch, to_wire
from capella.client.transport import Transport
from capella.egress import Egress
from capella.errors import CapellaError, EgressRefused, InvalidRequest, NotAcceptable, Unreachable
from capella.wire import batch_page
from capella.wire.answers import Status
from capella.wire.auth import Me, Token, TokenList, User, UserList
from capella.wire.clusters import ClusterInfo, ClusterList, ClusterPing
from capella.wire.handler_status import HandlerInfo, HandlerList
from capella.wire.messages import (
    CancelledScheduled,
    Messages,
    ProduceResult,
    ProduceResults,
    Replicas,
    ScheduledList,
    ScheduledMessage,
    StoredMessage,
)
from capella.wire.queues import QueueInfo, QueueList
from capella.wire.topics import TopicInfo, TopicList
from capella.wire.work import (
    Claimed,
    ClaimedMessage,
    DeletedWork,
    ReceiptResult,
    ReceiptResults,
    RetriedWork,
    Subscription,
    SubscriptionList,
    WorkList,
    WorkMessage,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_URL = "http://127.0.0.1:8676"

STREAM_MAX_BACKOFF = 5.0

Save = str | int | None
NdjsonLine = bytes | Mapping[str, Any]


class AsyncClient:
    """A Capella server at ``base_url``.

    ``timeout`` bounds every request in seconds (long-polling reads get their ``wait`` on
    top). Pass ``session`` to share an ``aiohttp.ClientSession``; the client then leaves
    closing it to you. Use as ``async with AsyncClient(url) as client:`` or call ``close()``.
    ``egress`` (the server's external clusters pass one) refuses connections to addresses it does not
    allow with ``EgressRefused``; without it every address is reached.
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
        egress: Egress | None = None,
    ) -> None:
        self._transport = Transport(
            base_url,
            timeout=timeout,
            session=session,
            connect_timeout=connect_timeout,
            username=username,
            password=password,
            token=token,
            ssl=ssl,
            compression=compression,
            egress=egress,
        )
        self.base_url = self._transport.base_url
        self._call = self._transport.call
        # False once the server has refused the record-batch forms (a Capella from before
        # them): the defaults then go as JSON, so a copy to a cluster not yet upgraded goes on.
        self._batch_forms = True

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
        await self._transport.close()

    @property
    def transport(self) -> Transport:
        """The HTTP layer itself, for a server that forwards requests as they came
        (``/v1/clusters/{name}/v1/...``: ``transport.relay``); not needed to use the API."""
        return self._transport

    # --- queues ----------------------------------------------------------------------

    async def put_queue(self, name: str, **definition: Any) -> QueueInfo:
        """Create or update a queue; ``definition`` holds the PUT fields (block, save...)."""
        return (await self.save_queue(name, **definition)).value

    async def save_queue(self, name: str, **definition: Any) -> Saved[QueueInfo]:
        """``put_queue``, and whether it created the queue: ``info, created = ...``."""
        return await self._put(QueueInfo, paths.queue_path(name), definition)

    async def queues(self) -> list[QueueInfo]:
        return decode_answer(QueueList, await self._call("GET", "/v1/queues")).queues

    async def queue(self, name: str) -> QueueInfo:
        return decode_answer(QueueInfo, await self._call("GET", paths.queue_path(name)))

    async def drop_queue(self, name: str) -> None:
        await self._call("DELETE", paths.queue_path(name))

    # --- topics of several partitions ------------------------------------------------

    async def define_topic(
        self, name: str, partitions: int, *, queue: dict[str, Any] | None = None
    ) -> Saved[TopicInfo]:
        """Create a topic of ``partitions`` partition queues (``<name>~<n>``), or add partitions
        and update their definition (``queue``: a queue's PUT fields); ``info, created = ...``."""
        body: dict[str, Any] = {"partitions": partitions}
        if queue is not None:
            body["queue"] = queue
        return await self._put(TopicInfo, paths.topic_path(name), body)

    async def topics(self) -> list[TopicInfo]:
        return decode_answer(TopicList, await self._call("GET", "/v1/topics")).topics

    async def topic(self, name: str) -> TopicInfo:
        return decode_answer(TopicInfo, await self._call("GET", paths.topic_path(name)))

    async def drop_topic(self, name: str) -> None:
        """Delete the topic, its partition queues and all their messages."""
        await self._call("DELETE", paths.topic_path(name))

    # --- messages --------------------------------------------------------------------

    async def produce(
        self, queue: str, messages: Iterable[MessageLike], *, save: Save = None, binary: bool = True
    ) -> list[ProduceResult]:
        """Append a batch; the answer holds an ``id`` and ``duplicate`` per message, in order.

        ``binary`` (the default) sends the batch as one record batch (docs/format.md);
        ``False`` sends JSON. Either way the answer is the same. A batch holding a delayed
        message (``deliver_at``/``delay``), or one the server would refuse, goes as JSON, so
        that the server schedules it or names what is wrong as it always has.
        """
        items = list(messages)
        batch = to_batch(items) if binary and self._batch_forms else None
        if batch is not None:
            try:
                return await self.produce_batch(queue, batch, save=save)
            except InvalidRequest as exc:
                if not _batch_body_refused(exc):
                    raise
                self._batch_forms = False
        body = {"messages": [to_wire(m) for m in items]}
        answer = await self._call(
            "POST", paths.queue_path(queue, "messages"), params=paths.params(save=save), json=body
        )
        return decode_answer(ProduceResults, answer).results

    async def produce_batch(
        self, queue: str, batches: bytes | Iterable[bytes], *, save: Save = None
    ) -> list[ProduceResult]:
        """Append record batches already encoded (``capella.records.record_batch.encode``), sent
        back to back as one request: stored whole or not at all, as ``produce``."""
        body = batches if isinstance(batches, bytes) else b"".join(batches)
        headers = {"Content-Type": batch_page.BATCH_MEDIA_TYPE}
        answer = await self._call(
            "POST",
            paths.queue_path(queue, "messages"),
            params=paths.params(save=save),
            data=self._transport.compressed(body, headers),
            headers=headers,
        )
        return decode_answer(ProduceResults, answer).results

    async def produce_ndjson(
        self,
        queue: str,
        lines: AsyncIterable[NdjsonLine] | Iterable[NdjsonLine],
        *,
        save: Save = None,
    ) -> list[ProduceResult]:
        """Append a batch sent as NDJSON, streamed as ``lines`` are produced.

        A line is a wire message dict, or ``bytes`` already holding one JSON object.
        """
        answer = await self._call(
            "POST",
            paths.queue_path(queue, "messages"),
            params=paths.params(save=save),
            data=_ndjson_body(lines),
            headers={"Content-Type": "application/x-ndjson"},
        )
        return decode_answer(ProduceResults, answer).results

    async def read(
        self,
        queue: str,
        *,
        after: int = 0,
        limit: int = 100,
        segments: Segments | None = None,
        wait: float | None = None,
        source: str | None = None,
        headers: Mapping[str, str] | None = None,
        json: Mapping[str, Any] | None = None,
        binary: bool = True,
    ) -> Messages:
        """Messages after ``after``: ``messages`` and ``last_id``.

        Pass ``last_id`` as the next ``after``. Each message has ``payload`` (bytes) next to the
        server's ``data``/``data_b64``. ``wait`` long-polls for up to that many seconds.
        ``segments``, ``source``, ``headers`` and ``json`` (a dotted path of the JSON payload
        to the value it must equal) keep only the messages that match; ``last_id`` then says
        how far the server looked. ``binary`` (the default) asks for the binary page of record
        batches (docs/format.md) rather than JSON: the same messages, less work on both sides.
        """
        params = paths.params(after=after, limit=limit, segments=segments, wait=wait, source=source)
        paths.with_filters(params, headers, json)
        return await self._messages(paths.queue_path(queue, "messages"), params, wait, binary)

    async def _messages(
        self, path: str, params: dict[str, str], wait: float | None, binary: bool
    ) -> Messages:
        """A read's answer, asked for and decoded as JSON or, with ``binary``, as a batch page."""
        if binary and self._batch_forms:
            accept = {"Accept": batch_page.PAGE_MEDIA_TYPE}
            try:
                answer = await self._call("GET", path, params=params, wait=wait, headers=accept)
            except NotAcceptable:
                self._batch_forms = False
            else:
                messages, last_id = batch_page.decode_page(answer)
                return Messages(messages, last_id)
        return decode_answer(Messages, await self._call("GET", path, params=params, wait=wait))

    async def stream(
        self,
        queue: str,
        *,
        after: int = 0,
        segments: Segments | None = None,
        retries: int | None = None,
    ) -> AsyncGenerator[StoredMessage, None]:
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
                async with contextlib.aclosing(
                    self._transport.events(
                        paths.queue_path(queue, "stream"),
                        paths.params(after=last_id, segments=segments),
                        last_id,
                    )
                ) as events:
                    async for event in events:
                        connected = True
                        failures = 0
                        if event is not None:
                            last_id, message = event
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
    ) -> list[ProduceResult]:
        """Produce messages held back until ``deliver_at`` or for ``delay`` (one of the two).

        ``deliver_at`` is UNIX seconds or an RFC 3339 string; ``delay`` is seconds or a
        duration such as ``"10m"``. Each answer holds ``scheduled_id`` and ``deliver_at``.
        """
        if (deliver_at is None) == (delay is None):
            raise ValueError("give exactly one of deliver_at and delay")
        due = {"deliver_at": deliver_at} if deliver_at is not None else {"delay": delay}
        return await self.produce(queue, [{**to_wire(m), **due} for m in messages], save=save)

    async def scheduled(self, queue: str, *, limit: int = 100, after: str | None = None) -> ScheduledList:
        """A page of delayed messages in delivery order: ``scheduled``, ``count`` and ``next``.

        Pass ``next`` as ``after`` for the following page; it is ``None`` on the last one.
        """
        params = paths.params(limit=limit, after=after)
        answer = await self._call("GET", paths.queue_path(queue, "scheduled"), params=params)
        return decode_answer(ScheduledList, answer)

    async def scheduled_message(self, queue: str, id: int) -> ScheduledMessage:
        answer = await self._call("GET", paths.queue_path(queue, "scheduled", str(id)))
        return decode_answer(ScheduledMessage, answer)

    async def reschedule(
        self,
        queue: str,
        id: int,
        *,
        deliver_at: float | str | None = None,
        delay: float | str | None = None,
        save: Save = None,
    ) -> ScheduledMessage:
        """Move a delayed message; a time in the past delivers it at once."""
        body = {"deliver_at": deliver_at} if deliver_at is not None else {"delay": delay}
        path = paths.queue_path(queue, "scheduled", str(id))
        answer = await self._call("PATCH", path, params=paths.params(save=save), json=body)
        return decode_answer(ScheduledMessage, answer)

    async def cancel_scheduled(self, queue: str, id: int, *, save: Save = None) -> None:
        """Cancel one delayed message (``ScheduledNotFound`` once it was delivered)."""
        await self._call(
            "DELETE", paths.queue_path(queue, "scheduled", str(id)), params=paths.params(save=save)
        )

    async def cancel_scheduled_many(
        self, queue: str, ids: Iterable[int], *, save: Save = None
    ) -> CancelledScheduled:
        """Cancel many: the ids ``cancelled`` and ``not_cancelled``."""
        path = paths.queue_path(queue, "scheduled", "cancel")
        answer = await self._call("POST", path, params=paths.params(save=save), json={"ids": list(ids)})
        return decode_answer(CancelledScheduled, answer)

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
        binary: bool = True,
    ) -> Messages:
        """Messages after the subscription's cursor, shaped as ``read`` (``binary`` as there).

        With ``commit="auto"`` the cursor moves to the answer's ``last_id`` (at-most-once);
        with ``"none"`` call ``commit`` once the messages are handled (at-least-once).
        """
        params = paths.params(limit=limit, wait=wait, segments=segments, commit=commit)
        return await self._messages(paths.subscription_path(queue, name, "messages"), params, wait, binary)

    async def commit(
        self,
        queue: str,
        name: str,
        last_id: int,
        *,
        replica: bool | None = None,
        reset: bool = False,
        save: Save = None,
    ) -> Subscription:
        """Move (or create) a subscription's cursor; it never moves back unless ``reset``."""
        body: dict[str, Any] = {"last_id": last_id}
        if replica is not None:
            body["replica"] = replica
        if reset:
            body["reset"] = True
        return (await self.save_subscription(queue, name, save=save, **body)).value

    async def save_subscription(
        self, queue: str, name: str, *, save: Save = None, **body: Any
    ) -> Saved[Subscription]:
        """Create or change a subscription, and whether it created it: ``sub, created = ...``.

        ``body`` holds the PUT fields: ``last_id``, ``replica`` and ``reset`` for a cursor;
        ``mode="ack"`` and ``policy`` (see ``put_work``) for an ack-mode one.
        """
        return await self._put(Subscription, paths.subscription_path(queue, name), body, save)

    async def subscription(self, queue: str, name: str) -> Subscription:
        return decode_answer(Subscription, await self._call("GET", paths.subscription_path(queue, name)))

    async def subscriptions(self, queue: str) -> list[Subscription]:
        answer = await self._call("GET", paths.queue_path(queue, "subscriptions"))
        return decode_answer(SubscriptionList, answer).subscriptions

    async def delete_subscription(self, queue: str, name: str) -> None:
        await self._call("DELETE", paths.subscription_path(queue, name))

    async def replicas(self, queue: str, id: int) -> Replicas:
        """The replica subscriptions at or past message ``id``: ``id``, ``count``, ``subscriptions``."""
        answer = await self._call("GET", paths.queue_path(queue, "replicas"), params={"id": str(id)})
        return decode_answer(Replicas, answer)

    # --- work queues (ack-mode subscriptions) ---------------------------------------

    async def put_work(self, queue: str, name: str, *, save: Save = None, **policy: Any) -> Subscription:
        """Create an ack-mode subscription, or change its retry policy.

        ``policy`` holds ``lease``, ``max_attempts``, ``backoff`` (``"fixed"`` or
        ``"exponential"``), ``delay``, ``max_delay``, ``jitter`` and ``dead_letter`` (a queue).
        """
        return (await self.save_subscription(queue, name, save=save, mode="ack", policy=policy)).value

    async def claim(
        self,
        queue: str,
        name: str,
        *,
        limit: int = 1,
        lease: float | str | None = None,
        wait: float | None = None,
        save: Save = None,
    ) -> list[ClaimedMessage]:
        """Lease up to ``limit`` messages; each has ``payload``, ``receipt``, ``attempt``,
        ``lease_until`` and ``last_error``. ``wait`` long-polls when there is none."""
        params = paths.params(limit=limit, lease=lease, wait=wait, save=save)
        path = paths.subscription_path(queue, name, "claim")
        answer = await self._call("POST", path, params=params, wait=wait)
        return decode_answer(Claimed, answer).messages

    async def ack(
        self, queue: str, name: str, receipts: str | Iterable[str], *, save: Save = None
    ) -> ReceiptResult | list[ReceiptResult]:
        """Finish claimed messages. One receipt (a ``str``) answers its ``ReceiptResult`` or raises
        its error (``LeaseLost``...); a list answers one ``ReceiptResult`` per receipt, in order
        (``ok``, and ``error`` when it failed)."""
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
    ) -> ReceiptResult | list[ReceiptResult]:
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
    ) -> ReceiptResult | list[ReceiptResult]:
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
    ) -> WorkList:
        """An operator's page of messages: ``messages``, and ``next_after`` (an id or ``None``).

        ``status`` is some of leased, waiting, ready, dead; ``json`` maps a dotted path of the
        JSON payload to the value it must equal (``{"customer.id": 42}``).
        """
        params = paths.params(
            status=status if status is None or isinstance(status, str) else ",".join(status),
            source=source,
            segments=segments,
            after=after,
            limit=limit,
        )
        paths.with_filters(params, headers, json)
        answer = await self._call("GET", paths.subscription_path(queue, name, "work"), params=params)
        return decode_answer(WorkList, answer)

    async def work_message(self, queue: str, name: str, id: int) -> WorkMessage:
        """One message's ``status``, ``attempts`` and ``last_error``."""
        answer = await self._call("GET", paths.subscription_path(queue, name, "work", str(id)))
        return decode_answer(WorkMessage, answer)

    async def retry_work(self, queue: str, name: str, *, save: Save = None, **selection: Any) -> RetriedWork:
        """Waiting messages become claimable now (or ``at``/after ``delay``); dead ones move back.

        ``selection`` holds ``status``, ``ids``, ``source``, ``segments``, ``headers``, ``json``,
        ``after`` and ``limit``; the answer has ``retried`` and ``next_after``.
        """
        path = paths.subscription_path(queue, name, "work", "retry")
        answer = await self._call("POST", path, params=paths.params(save=save), json=selection)
        return decode_answer(RetriedWork, answer)

    async def delete_work(self, queue: str, name: str, *, save: Save = None, **selection: Any) -> DeletedWork:
        """Finish messages without processing them; ``status`` or ``ids`` is required."""
        path = paths.subscription_path(queue, name, "work", "delete")
        answer = await self._call("POST", path, params=paths.params(save=save), json=selection)
        return decode_answer(DeletedWork, answer)

    async def _receipts(
        self,
        queue: str,
        name: str,
        verb: str,
        receipts: str | Iterable[str],
        fields: dict[str, Any],
        save: Save,
    ) -> ReceiptResult | list[ReceiptResult]:
        body = {k: v for k, v in fields.items() if v is not None}
        if isinstance(receipts, str):
            body["receipt"] = receipts
        else:
            body["receipts"] = list(receipts)
        path = paths.subscription_path(queue, name, verb)
        answer = await self._call("POST", path, params=paths.params(save=save), json=body)
        if isinstance(receipts, str):
            return decode_answer(ReceiptResult, answer)
        return decode_answer(ReceiptResults, answer).results

    # --- handlers --------------------------------------------------------------------

    async def put_handler(
        self,
        name: str,
        type: str,
        *,
        queues: str | Iterable[str] | None = None,
        params: Mapping[str, Any] | None = None,
        started: bool = True,
    ) -> HandlerInfo:
        """Create or replace a handler of ``type``, one of ``capella.wire.handlers.HANDLER_TYPES``.

        ``queues`` holds queue names or fnmatch patterns (``"logs-*"``); a single string is
        one of them (``pg_outbox`` takes none: its queue is ``params["to"]``). ``params`` are
        the type's parameters; durations may be ``"10m"``.
        """
        saved = await self.save_handler(name, type, queues=queues, params=params, started=started)
        return saved.value

    async def save_handler(
        self,
        name: str,
        type: str,
        *,
        queues: str | Iterable[str] | None = None,
        params: Mapping[str, Any] | None = None,
        started: bool = True,
    ) -> Saved[HandlerInfo]:
        """``put_handler``, and whether it created the handler: ``info, created = ...``."""
        body: dict[str, Any] = {"type": type, "params": dict(params or {}), "started": started}
        if queues is not None:
            body["queues"] = [queues] if isinstance(queues, str) else list(queues)
        return await self._put(HandlerInfo, paths.handler_path(name), body)

    async def handlers(self) -> list[HandlerInfo]:
        return decode_answer(HandlerList, await self._call("GET", "/v1/handlers")).handlers

    async def handler(self, name: str) -> HandlerInfo:
        return decode_answer(HandlerInfo, await self._call("GET", paths.handler_path(name)))

    async def drop_handler(self, name: str) -> None:
        await self._call("DELETE", paths.handler_path(name))

    async def start_handler(self, name: str) -> HandlerInfo:
        return decode_answer(HandlerInfo, await self._call("POST", paths.handler_path(name, "start")))

    async def stop_handler(self, name: str) -> HandlerInfo:
        return decode_answer(HandlerInfo, await self._call("POST", paths.handler_path(name, "stop")))

    async def run_handler(self, name: str) -> HandlerInfo:
        """One pass now (also for a stopped handler): the handler as it is after it, and in
        ``pass_`` that pass (``ok``, ``items``, ``bytes``, ``error``, ``started``, ``finished``);
        a failed pass is an answer, not an exception."""
        return decode_answer(HandlerInfo, await self._call("POST", paths.handler_path(name, "run")))

    # --- external clusters -------------------------------------------------------------

    async def put_cluster(self, name: str, **fields: Any) -> ClusterInfo:
        """Register or replace an external cluster; ``fields`` are the PUT fields (url, token_secret...).

        The answer never holds the password or token, only where it comes from.
        """
        return (await self.save_cluster(name, **fields)).value

    async def save_cluster(self, name: str, **fields: Any) -> Saved[ClusterInfo]:
        """``put_cluster``, and whether it registered a new cluster: ``info, created = ...``."""
        return await self._put(ClusterInfo, paths.cluster_path(name), fields)

    async def clusters(self) -> list[ClusterInfo]:
        return decode_answer(ClusterList, await self._call("GET", "/v1/clusters")).clusters

    async def cluster(self, name: str) -> ClusterInfo:
        return decode_answer(ClusterInfo, await self._call("GET", paths.cluster_path(name)))

    async def drop_cluster(self, name: str) -> None:
        await self._call("DELETE", paths.cluster_path(name))

    async def ping_cluster(self, name: str) -> ClusterPing:
        """``ok``, ``ready``, ``latency_ms`` and ``error``: a failed ping is an answer, not an error."""
        return decode_answer(ClusterPing, await self._call("POST", paths.cluster_path(name, "ping")))

    # --- users and tokens --------------------------------------------------------------

    async def users(self) -> list[User]:
        """The users the caller may read; never a password hash."""
        return decode_answer(UserList, await self._call("GET", "/v1/users")).users

    async def user(self, name: str) -> User:
        return decode_answer(User, await self._call("GET", paths.user_path(name)))

    async def put_user(self, name: str, **fields: Any) -> User:
        """Create (``password`` required) or change a user: ``password``, ``admin``, ``enabled``, ``rules``.

        Rules are ``{"effect", "type", "action", "name"}`` objects or ``"allow:queue:read:orders-*"``.
        """
        return (await self.save_user(name, **fields)).value

    async def save_user(self, name: str, **fields: Any) -> Saved[User]:
        """``put_user``, and whether it created the user: ``user, created = ...``."""
        return await self._put(User, paths.user_path(name), fields)

    async def drop_user(self, name: str) -> None:
        """Delete the user; its tokens are revoked with it."""
        await self._call("DELETE", paths.user_path(name))

    async def change_password(self, name: str, password: str, old_password: str | None = None) -> User:
        """Set a new password; ``old_password`` is needed unless the caller may administer ``name``."""
        body = {"password": password}
        if old_password is not None:
            body["old_password"] = old_password
        return decode_answer(User, await self._call("POST", paths.user_path(name, "password"), json=body))

    async def me(self) -> Me:
        """Who the server takes the caller for: ``user``, ``admin``, ``via`` and ``rules``."""
        return decode_answer(Me, await self._call("GET", "/v1/me"))

    async def create_token(
        self, ttl: float | str | None = None, description: str | None = None, user: str | None = None
    ) -> Token:
        """A new bearer token (``ttl`` in seconds or ``"24h"``); its text, ``token``, is only here.

        Needs Basic credentials: a token cannot create tokens.
        """
        body = {
            key: value
            for key, value in (("ttl", ttl), ("description", description), ("user", user))
            if value is not None
        }
        return decode_answer(Token, await self._call("POST", "/v1/tokens", json=body))

    async def tokens(self) -> list[Token]:
        """The caller's unexpired tokens (and those of users it may administer), without their text."""
        return decode_answer(TokenList, await self._call("GET", "/v1/tokens")).tokens

    async def revoke_token(self, id: str) -> None:
        await self._call("DELETE", "/v1/tokens/" + quote(id, safe=""))

    async def _put(self, kind: type[T], path: str, body: object, save: Save = None) -> Saved[T]:
        status, answer = await self._transport.send("PUT", path, params=paths.params(save=save), json=body)
        return Saved(decode_answer(kind, answer), created=status == 201)

    # --- operations ------------------------------------------------------------------

    async def health(self) -> Status:
        """``status`` ``"ok"`` while the server process serves."""
        return decode_answer(Status, await self._call("GET", "/healthz"))

    async def ready(self) -> bool:
        """Whether every queue is recovered and the server takes traffic."""
        try:
            await self._call("GET", "/readyz")
        except (Unreachable, EgressRefused):
            raise  # not an answer of the server's: there is none
        except CapellaError:
            return False
        return True


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


def _batch_body_refused(exc: InvalidRequest) -> bool:
    """Whether a produce was refused for its record-batch body's media type alone: what a
    Capella from before record batches answers (a plain ``invalid_request`` naming it)."""
    return exc.code == InvalidRequest.code and exc.message.startswith(
        f"Content-Type {batch_page.BATCH_MEDIA_TYPE!r} is not supported"
    )
