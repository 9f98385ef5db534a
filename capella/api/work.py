"""Work queues over HTTP: claim, ack, nack and extend on an ack-mode subscription.

Ack, nack and extend take ``{"receipts": [...]}`` and answer 200 with one result per receipt
(a receipt may fail while the others work), or ``{"receipt": "..."}`` and answer with the
error's own status when that one receipt fails.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from aiohttp import web

from capella.api.messages import MAX_DELAY, stored_message
from capella.api.request import (
    CLUSTER,
    SETTINGS,
    STOPPING,
    json_response,
    limit_param,
    read_object,
    save_param,
    wait_param,
)
from capella.config import parse_duration
from capella.core.message import Message, SaveMode
from capella.core.queue import Queue
from capella.core.retry import MAX_LEASE
from capella.core.work import Entry, Outcome, WorkQueue, parse_receipt
from capella.errors import InvalidConfig, InvalidRequest


def add_routes(router: web.UrlDispatcher) -> None:
    base = "/v1/queues/{queue}/subscriptions/{name}"
    router.add_post(f"{base}/claim", claim)
    router.add_post(f"{base}/ack", ack)
    router.add_post(f"{base}/nack", nack)
    router.add_post(f"{base}/extend", extend)


def _work(request: web.Request) -> tuple[Queue, WorkQueue]:
    queue = request.app[CLUSTER].queue(request.match_info["queue"])
    return queue, queue.work(request.match_info["name"])


def claimed_message(message: Message, entry: Entry) -> dict[str, Any]:
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
        seconds = parse_duration(value, name)
    except InvalidConfig as exc:
        raise InvalidRequest(exc.message, field=name, parameter=name) from None
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
    queue: Queue,
    work: WorkQueue,
    limit: int,
    lease: float | None,
    save: SaveMode,
    wait: float,
) -> list[tuple[Message, Entry]]:
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


async def _receipts(
    request: web.Request, allowed: set[str]
) -> tuple[list[tuple[int, int]], bool, dict[str, Any]]:
    """The receipts of the body, whether it named a single one, and the body."""
    body = await read_object(request)
    if unknown := sorted(set(body) - allowed - {"receipts", "receipt"}):
        raise InvalidRequest(f"unknown field(s): {', '.join(unknown)}", field=unknown[0])
    if ("receipt" in body) == ("receipts" in body):
        raise InvalidRequest("give receipts (a list) or receipt (one)", field="receipts")
    if "receipt" in body:
        return [parse_receipt(body["receipt"])], True, body
    items = body["receipts"]
    limit = request.app[SETTINGS].max_batch
    if type(items) is not list or not items:
        raise InvalidRequest("receipts: expected a non-empty list of receipts", field="receipts")
    if len(items) > limit:
        raise InvalidRequest(f"receipts: at most {limit} in one request", field="receipts")
    return [parse_receipt(r) for r in items], False, body


def _answer(outcomes: Sequence[Outcome], single: bool, field: str | None = None) -> web.Response:
    if single and outcomes[0].error is not None:
        raise outcomes[0].error
    results = []
    for o in outcomes:
        if o.error is None:
            result: dict[str, Any] = {"receipt": o.receipt, "id": o.id, "ok": True}
            if field is not None and o.entry is not None:
                result[field] = o.entry.until
            elif field == "retry_at":
                result["dead"] = True  # its attempts were used up
        else:
            error = {"code": o.error.code, "message": o.error.message}
            result = {"receipt": o.receipt, "id": o.id, "ok": False, "error": error}
        results.append(result)
    return json_response(results[0] if single else {"results": results})


async def ack(request: web.Request) -> web.Response:
    _, work = _work(request)
    save = save_param(request)
    receipts, single, _ = await _receipts(request, set())
    return _answer(await work.ack(receipts, save), single)


async def nack(request: web.Request) -> web.Response:
    """Give messages back: retried after ``delay`` (default: the policy's backoff), with ``error``."""
    _, work = _work(request)
    save = save_param(request)
    receipts, single, body = await _receipts(request, {"delay", "error"})
    delay = body.get("delay")
    if delay is not None:
        try:
            delay = parse_duration(delay, "delay")
        except InvalidConfig as exc:
            raise InvalidRequest(exc.message, field="delay") from None
        if delay > MAX_DELAY:
            raise InvalidRequest("delay: more than ten years", field="delay")
    error = body.get("error")
    if error is not None and type(error) is not str:
        raise InvalidRequest("error: expected a string", field="error")
    return _answer(await work.nack(receipts, delay, error, save), single, "retry_at")


async def extend(request: web.Request) -> web.Response:
    _, work = _work(request)
    save = save_param(request)
    receipts, single, body = await _receipts(request, {"lease"})
    lease = _lease(body.get("lease"), "lease")
    return _answer(await work.extend(receipts, lease, save), single, "lease_until")
