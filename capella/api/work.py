"""Work queues over HTTP: claim, ack, nack and extend on an ack-mode subscription, and the
operator's view (``/work``): each message's status, attempts and last error, filtered, and
retried or deleted in bulk.

Ack, nack and extend take ``{"receipts": [...]}`` and answer 200 with one result per receipt
(a receipt may fail while the others work), or ``{"receipt": "..."}`` and answer with the
error's own status when that one receipt fails.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, TypeVar

from aiohttp import web
from msgspec import UNSET

from capella import wire
from capella.api.drafts import MAX_DELAY
from capella.api.openapi import (
    AFTER,
    LIMIT,
    MESSAGE_FILTERS,
    SAVE,
    WAIT,
    answer,
    json_content,
    param,
    ref,
    schema_of,
)
from capella.api.request import (
    CLUSTER,
    SETTINGS,
    STOPPING,
    int_param,
    json_response,
    limit_param,
    message_filter_param,
    parse_range,
    present,
    read_struct,
    save_param,
    wait_param,
)
from capella.api.route import Route, on_queue, on_subscription
from capella.core.base_queue import BaseQueue
from capella.core.filter import MessageFilter, matches, parse_path
from capella.core.message import LogMessage, SaveMode, stored_message
from capella.core.work.state import Entry
from capella.core.work.work_queue import STATUSES, Outcome, WorkQueue, parse_receipt
from capella.errors import InvalidRequest, MessageNotFound
from capella.units import parse_duration
from capella.wire.answers import ErrorDetail
from capella.wire.fields import MAX_LEASE, Lease
from capella.wire.work import (
    DeletedWork,
    ExtendReceipts,
    NackReceipts,
    ReceiptResult,
    ReceiptResults,
    Receipts,
    RetriedWork,
    RetrySelection,
    WorkSelection,
)

# At most this many messages are retried or deleted by one request (the answer says where to
# go on from).
MAX_BULK = 10_000

_STATUS = r"\s*(pending|in_flight|failed|dead)\s*"
STATUS_LIST = f"^{_STATUS}(,{_STATUS})*$"

R = TypeVar("R", bound=Receipts)
W = TypeVar("W", bound=WorkSelection)


def _work(request: web.Request) -> tuple[BaseQueue, WorkQueue]:
    queue = request.app[CLUSTER].queue(request.match_info["queue"])
    return queue, queue.work(request.match_info["name"])


def claimed_message(message: LogMessage, entry: Entry) -> dict[str, Any]:
    """A StoredMessage with the claim: ``receipt``, ``attempt``, ``lease_until``, ``last_error``."""
    return {
        **stored_message(message),
        "receipt": entry.receipt,
        "attempt": entry.attempts,
        "lease_until": entry.until,
        "last_error": entry.error,
    }


def _lease(value: object, name: str) -> float | None:
    if value is None:
        return None
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise InvalidRequest(f"{name}: {exc}", field=name, parameter=name) from None
    if not 0 < seconds <= MAX_LEASE:
        raise InvalidRequest(f"{name}: must be more than 0 and at most 12h", field=name, parameter=name)
    return seconds


async def claim(request: web.Request) -> web.Response:
    """Lease up to ``limit`` messages for ``lease`` (default: the policy's), long-polling ``wait``."""
    queue, work = _work(request)
    limit = limit_param(request, default=1)
    text = request.query.get("lease")
    lease = _lease(text if text else None, "lease")
    wait = wait_param(request)
    save = save_param(request)
    claimed = await work.claim(limit, lease, save)
    if not claimed and wait > 0:
        claimed = await _claim_waiting(request.app, queue, work, limit, lease, save, wait)
    return json_response({"messages": [claimed_message(m, e) for m, e in claimed]})


async def _claim_waiting(
    app: web.Application,
    queue: BaseQueue,
    work: WorkQueue,
    limit: int,
    lease: float | None,
    save: SaveMode,
    wait: float,
) -> list[tuple[LogMessage, Entry]]:
    """Claim again whenever a message arrives, a retry falls due, or a message is given back."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    stopping = app[STOPPING]
    while not stopping.is_set():
        remaining = deadline - loop.time()
        if remaining <= 0:
            return []
        timer = work.state.next_timer()
        if timer is not None:
            remaining = min(remaining, max(0.001, timer - queue.now()))
        waiters = [
            asyncio.ensure_future(queue.wait_for(work.state.high, remaining)),
            asyncio.ensure_future(work.changed.wait()),
            asyncio.ensure_future(stopping.wait()),
        ]
        try:
            await asyncio.wait(waiters, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
        claimed = await work.claim(limit, lease, save)
        if claimed:
            return claimed
    return []


async def _receipts(request: web.Request, kind: type[R]) -> tuple[list[tuple[int, int]], bool, R]:
    """The receipts of the body (a ``kind``), whether it named a single one, and the body."""
    body = await read_struct(request, kind)
    if body.receipt is not UNSET:
        if body.receipts is not UNSET:
            raise InvalidRequest("give receipts (a list) or receipt (one)", field="receipts")
        return [parse_receipt(body.receipt)], True, body
    if body.receipts is UNSET:
        raise InvalidRequest("give receipts (a list) or receipt (one)", field="receipts")
    items = body.receipts
    limit = request.app[SETTINGS].max_batch
    if not items:
        raise InvalidRequest("receipts: expected a non-empty list of receipts", field="receipts")
    if len(items) > limit:
        raise InvalidRequest(f"receipts: at most {limit} in one request", field="receipts")
    return [parse_receipt(r) for r in items], False, body


def _answer(outcomes: Sequence[Outcome], single: bool, field: str | None = None) -> web.Response:
    """One ``ReceiptResult`` per outcome; ``field`` (``lease_until``, ``retry_at``) holds the
    time an outcome's entry runs to, and ``retry_at`` without one means the message is dead."""
    if single and outcomes[0].error is not None:
        raise outcomes[0].error
    results = []
    for o in outcomes:
        result = ReceiptResult(o.receipt, o.id, o.error is None)
        if o.error is not None:
            result.error = ErrorDetail(o.error.code, o.error.message)
        elif field is not None and o.entry is not None:
            setattr(result, field, o.entry.until)
        elif field == "retry_at":
            result.dead = True  # its attempts were used up
        results.append(result)
    return json_response(results[0] if single else ReceiptResults(results))


async def ack(request: web.Request) -> web.Response:
    _, work = _work(request)
    save = save_param(request)
    receipts, single, _ = await _receipts(request, Receipts)
    return _answer(await work.ack(receipts, save), single)


async def nack(request: web.Request) -> web.Response:
    """Give messages back: retried after ``delay`` (default: the policy's backoff), with ``error``."""
    _, work = _work(request)
    save = save_param(request)
    receipts, single, body = await _receipts(request, NackReceipts)
    delay = None
    if body.delay is not UNSET and body.delay is not None:
        try:
            delay = parse_duration(body.delay)
        except ValueError as exc:
            raise InvalidRequest(f"delay: {exc}", field="delay") from None
        if delay > MAX_DELAY:
            raise InvalidRequest("delay: more than ten years", field="delay")
    error = None if body.error is UNSET else body.error
    return _answer(await work.nack(receipts, delay, error, save), single, "retry_at")


async def extend(request: web.Request) -> web.Response:
    _, work = _work(request)
    save = save_param(request)
    receipts, single, body = await _receipts(request, ExtendReceipts)
    lease = _lease(None if body.lease is UNSET else body.lease, "lease")
    return _answer(await work.extend(receipts, lease, save), single, "lease_until")


# --- operators ------------------------------------------------------------------------------


def work_message(work: WorkQueue, message: LogMessage, status: str) -> dict[str, Any]:
    """A StoredMessage with its ``status``, ``attempts``, ``last_error`` and times."""
    info: dict[str, Any] = {**stored_message(message), "status": status, "attempts": 0, "last_error": None}
    entry = work.state.entries.get(message.id)
    dead = work.state.dead.get(message.id)
    if entry is not None:
        info.update(attempts=entry.attempts, last_error=entry.error)
        info["lease_until" if entry.state == "in_flight" else "retry_at"] = entry.until
    elif dead is not None:
        info.update(attempts=dead.attempts, last_error=dead.error, died=dead.died)
    return info


def _statuses(
    value: object, where: str, default: tuple[str, ...] = STATUSES, *, text: bool = False
) -> set[str]:
    """``status``: a comma-separated text in a query, a list in a body."""
    if value is None:
        return set(default)
    items = value.split(",") if text and isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(i, str) and i.strip() in STATUSES for i in items):
        raise InvalidRequest(f"status: expected some of {', '.join(STATUSES)}", field=where, parameter=where)
    return {i.strip() for i in items}


def _body_filter(body: WorkSelection) -> MessageFilter:
    segments = None
    if body.segments is not UNSET:
        segments = tuple(parse_range(part.strip()) for part in body.segments.split(","))
    headers = {} if body.headers is UNSET else body.headers
    fields = {} if body.json is UNSET else body.json
    return MessageFilter(
        None if body.source is UNSET else body.source,
        segments,
        tuple(headers.items()),
        tuple((parse_path(path), value) for path, value in fields.items()),
    )


async def list_work(request: web.Request) -> web.Response:
    """Messages of the subscription by status, filtered, in id order, a page at a time."""
    _, work = _work(request)
    statuses = _statuses(request.query.get("status"), "status", text=True)
    match = message_filter_param(request, {"status", "after", "limit"})
    after = int_param(request, "after", 0, low=0)
    limit = limit_param(request)
    found, next_after = await work.select(statuses, None if match.empty else _matcher(match), after, limit)
    return json_response(
        {"messages": [work_message(work, m, status) for m, status in found], "next_after": next_after}
    )


def _matcher(f: MessageFilter) -> Any:
    return lambda m: matches(f, m)


async def get_work(request: web.Request) -> web.Response:
    queue, work = _work(request)
    text = request.match_info["id"]
    if not text.isdigit() or not 0 < int(text) <= wire.INT64_MAX:
        raise InvalidRequest(f"id: expected a message id, got {text!r}", parameter="id")
    mid = int(text)
    messages, _ = await queue.read_after(mid - 1, 1)
    if not messages or messages[0].id != mid:
        raise MessageNotFound(f"queue {queue.name} holds no message {mid}")
    return json_response(work_message(work, messages[0], work.status(mid, queue.now())))


async def _bulk(
    request: web.Request, kind: type[W], default: tuple[str, ...] | None
) -> tuple[W, list[tuple[LogMessage, str]], int | None]:
    """The messages a retry or delete body (a ``kind``) selects, and where the next call should
    go on from."""
    queue, work = _work(request)
    body = await read_struct(request, kind)
    given = present(body)
    if default is None and not given & {"status", "ids"}:
        raise InvalidRequest("status or ids: say which messages", field="status")
    statuses = _statuses(None if body.status is UNSET else body.status, "status", default or STATUSES)
    match = _body_filter(body)
    after = 0 if body.after is UNSET else body.after
    limit = 1000 if body.limit is UNSET else body.limit
    if not 1 <= limit <= MAX_BULK:
        raise InvalidRequest(f"limit: expected 1 to {MAX_BULK}", field="limit")
    if body.ids is not UNSET:
        if not all(i > 0 for i in body.ids):
            raise InvalidRequest("ids: expected a list of message ids", field="ids")
        if len(body.ids) > MAX_BULK:
            raise InvalidRequest(f"ids: at most {MAX_BULK}", field="ids")
        return body, *await _pick(queue, work, sorted(set(body.ids)), statuses, match, after, limit)
    found, next_after = await work.select(statuses, None if match.empty else _matcher(match), after, limit)
    return body, found, next_after


async def _pick(
    queue: BaseQueue,
    work: WorkQueue,
    ids: list[int],
    statuses: set[str],
    match: MessageFilter,
    after: int,
    limit: int,
) -> tuple[list[tuple[LogMessage, str]], int | None]:
    """The messages among ``ids`` with one of ``statuses`` that match."""
    found: list[tuple[LogMessage, str]] = []
    now = queue.now()
    for mid in ids:
        if mid <= after or (status := work.status(mid, now)) not in statuses:
            continue
        messages, _ = await queue.read_after(mid - 1, 1)
        if messages and messages[0].id == mid and (match.empty or matches(match, messages[0])):
            found.append((messages[0], status))
            if len(found) >= limit:
                return found, mid
    return found, None


def _when(body: RetrySelection, now: float) -> float | None:
    if body.at is not UNSET and body.delay is not UNSET:
        raise InvalidRequest("give at or delay, not both", field="delay")
    if body.delay is not UNSET:
        try:
            return now + parse_duration(body.delay)
        except ValueError as exc:
            raise InvalidRequest(f"delay: {exc}", field="delay") from None
    if body.at is not UNSET:
        try:
            return wire.parse_time(body.at)
        except ValueError as exc:
            raise InvalidRequest(f"at: {exc}", field="at") from None
    return None


async def retry(request: web.Request) -> web.Response:
    """Waiting messages become claimable now (or ``at``); dead ones are moved back."""
    queue, work = _work(request)
    save = save_param(request)
    body, found, next_after = await _bulk(request, RetrySelection, ("failed", "dead"))
    statuses = _statuses(None if body.status is UNSET else body.status, "status", ("failed", "dead"))
    if statuses - {"failed", "dead", "pending"}:
        raise InvalidRequest("status: only failed and dead messages can be retried", field="status")
    at = _when(body, queue.now())
    retried = await work.retry([m.id for m, _ in found], at, save)
    return json_response(RetriedWork(retried=retried, next_after=next_after))


async def delete(request: web.Request) -> web.Response:
    """Finish messages without processing them (``status`` or ``ids`` is required)."""
    _, work = _work(request)
    save = save_param(request)
    _, found, next_after = await _bulk(request, WorkSelection, None)
    deleted = await work.delete([m.id for m, _ in found], save)
    return json_response(DeletedWork(deleted=sorted(deleted), next_after=next_after))


# With ``receipts`` one result each; with a single ``receipt``, its result on its own.
RECEIPT_RESULTS = {"oneOf": [ref("ReceiptResults"), ref("ReceiptResult")]}

ROUTES = [
    Route(
        "POST",
        "/v1/queues/{queue}/subscriptions/{name}/claim",
        claim,
        need=(on_queue("read"), on_subscription("write")),
        op="claim",
        summary="Lease messages of an ack-mode subscription: due retries first, then new ones in id order",
        tag="work",
        answers={200: answer("Claimed messages (maybe none)", ref("Claimed"))},
        fails=(400, 404, 409),
        params=(
            param(
                "limit",
                "query",
                {"type": "integer", "minimum": 1, "default": 1},
                "At most this many messages (capped at the server's max_limit)",
            ),
            param("lease", "query", schema_of(Lease), "How long the claim is held (default: the policy's)"),
            WAIT,
            SAVE,
        ),
    ),
    Route(
        "POST",
        "/v1/queues/{queue}/subscriptions/{name}/ack",
        ack,
        need=(on_subscription("write"),),
        op="ack",
        summary="Finish claimed messages",
        tag="work",
        answers={200: answer("One result per receipt", RECEIPT_RESULTS)},
        fails=(400, 404, 408, 409, 413),
        params=(SAVE,),
        body={"required": True, "content": json_content(ref("Receipts"))},
    ),
    Route(
        "POST",
        "/v1/queues/{queue}/subscriptions/{name}/nack",
        nack,
        need=(on_subscription("write"),),
        op="nack",
        summary="Give claimed messages back with an error: retried after a delay, or dead",
        tag="work",
        answers={200: answer("One result per receipt", RECEIPT_RESULTS)},
        fails=(400, 404, 408, 409, 413),
        params=(SAVE,),
        body={"required": True, "content": json_content(ref("NackReceipts"))},
    ),
    Route(
        "POST",
        "/v1/queues/{queue}/subscriptions/{name}/extend",
        extend,
        need=(on_subscription("write"),),
        op="extend",
        summary="Lengthen the lease of claimed messages",
        tag="work",
        answers={200: answer("One result per receipt", RECEIPT_RESULTS)},
        fails=(400, 404, 408, 409, 413),
        params=(SAVE,),
        body={"required": True, "content": json_content(ref("ExtendReceipts"))},
    ),
    Route(
        "GET",
        "/v1/queues/{queue}/subscriptions/{name}/work",
        list_work,
        need=(on_queue("read"), on_subscription("read")),
        op="listWork",
        summary="Messages of an ack-mode subscription by status, filtered, in id order",
        tag="work",
        answers={200: answer("A page", ref("WorkList"))},
        fails=(400, 404, 409),
        params=(
            param(
                "status",
                "query",
                {"type": "string", "pattern": STATUS_LIST},
                "comma-separated: pending, in_flight, failed, dead (default all)",
                empty=False,
            ),
            *MESSAGE_FILTERS,
            AFTER,
            LIMIT,
        ),
    ),
    Route(
        "POST",
        "/v1/queues/{queue}/subscriptions/{name}/work/retry",
        retry,
        need=(on_subscription("admin"),),
        op="retryWork",
        summary="Make waiting messages claimable now (or at), and move dead ones back",
        tag="work",
        answers={200: answer("What was retried", ref("RetriedWork"))},
        fails=(400, 404, 408, 409, 413),
        params=(SAVE,),
        body={"required": False, "content": json_content(ref("RetrySelection"))},
    ),
    Route(
        "POST",
        "/v1/queues/{queue}/subscriptions/{name}/work/delete",
        delete,
        need=(on_subscription("admin"),),
        op="deleteWork",
        summary="Finish messages without processing them (skip)",
        tag="work",
        answers={200: answer("What was deleted", ref("DeletedWork"))},
        fails=(400, 404, 408, 409, 413),
        params=(SAVE,),
        body={"required": True, "content": json_content(ref("WorkSelection"))},
    ),
    Route(
        "GET",
        "/v1/queues/{queue}/subscriptions/{name}/work/{id}",
        get_work,
        need=(on_queue("read"), on_subscription("read")),
        op="getWork",
        summary="One message's status, attempts and last error",
        tag="work",
        answers={200: answer("The message", ref("WorkMessage"))},
        fails=(400, 404, 409),
    ),
]
