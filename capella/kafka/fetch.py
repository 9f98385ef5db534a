"""Fetch: stored messages rendered as Kafka record batches (v2, uncompressed), once per block.

A partition answers the whole batches that hold the fetch offset and what follows, up to the
partition's byte limit, and always at least one batch (KIP-74): clients skip the records
below the offset they asked for. An offset below the first retained id, or past the high
watermark (the last id + 1), answers OFFSET_OUT_OF_RANGE, and the client resets as its
``auto.offset.reset`` says; offset 0 reads from id 1 while nothing has been deleted. With less
than ``min_bytes`` to answer (1 at least), the request waits up to ``max_wait_ms`` for messages
on its partitions, reading on after what it has each time one comes, and answers when it has
``min_bytes`` or its time is up (``fetch.min.bytes`` / ``fetch.max.wait.ms``, as Kafka's broker
does), or as soon as its byte limits are full. No fetch sessions (KIP-227): the session id
answered is 0, so clients send whole requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any

from capella.core.base_queue import BaseQueue
from capella.errors import CapellaError
from capella.kafka import errors, records
from capella.kafka.session import Session
from capella.kafka.topics import authorized_queue

log = logging.getLogger(__name__)

# A read looks at most this many messages per partition per answer, a page at a time.
READ_LIMIT = 10_000
PAGE_LIMIT = 1_000
# The longest a fetch waits, whatever it asks for.
MAX_WAIT = 30.0


@dataclass
class _Partition:
    topic: str
    index: int
    offset: int
    max_bytes: int
    queue: BaseQueue | None = None
    error: int = errors.NONE
    chunks: list[bytes] = field(default_factory=list)
    size: int = 0
    full: bool = False


async def fetch(session: Session, request: Any, version: int) -> dict[str, Any]:
    wanted = [
        _Partition(topic.topic, part.partition, part.fetch_offset, part.partition_max_bytes)
        for topic in request.topics
        for part in topic.partitions
    ]
    for p in wanted:
        _open(session, p)
    max_bytes = request.max_bytes if version >= 3 else 2**31 - 1
    min_bytes = min(max(request.min_bytes, 1), max_bytes)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + min(max(request.max_wait_ms, 0) / 1000, MAX_WAIT)
    await _read_all(wanted, max_bytes)
    while (size := sum(p.size for p in wanted)) < min_bytes and (left := deadline - loop.time()) > 0:
        if not await _wait_any(_open_for_more(wanted, max_bytes), left):
            break
        await _read_all(wanted, max_bytes)
        if sum(p.size for p in wanted) == size:
            # Woken for messages a read does not see yet: answer what there is rather than spin.
            break
    return {
        "throttle_time_ms": 0,
        "error_code": errors.NONE,
        "session_id": 0,
        "responses": _grouped(wanted),
    }


def _open(session: Session, p: _Partition) -> None:
    try:
        queue = authorized_queue(session.identity, session.broker.cluster, p.topic, p.index, "read")
    except CapellaError as exc:
        p.error = errors.code_for(exc)
        return
    p.queue = queue


async def _read_all(wanted: list[_Partition], max_bytes: int) -> None:
    """Read each partition on from where it is, within its own and the request's byte limits."""
    budget = max_bytes - sum(p.size for p in wanted)
    for p in _open_for_more(wanted, max_bytes):
        size = p.size
        try:
            await _read(p, budget, first=budget == max_bytes)
        except CapellaError as exc:
            p.error = errors.code_for(exc)
            if p.error == errors.UNKNOWN_SERVER_ERROR:
                log.error("kafka fetch failed topic=%r partition=%d", p.topic, p.index, exc_info=exc)
        budget -= p.size - size
        if budget <= 0:
            break


def _open_for_more(wanted: list[_Partition], max_bytes: int) -> list[_Partition]:
    """The partitions a read can add to: readable, no error, and room left in their limits."""
    if sum(p.size for p in wanted) >= max_bytes:
        return []
    return [
        p
        for p in wanted
        if p.queue is not None and p.error == errors.NONE and not p.full and p.size < p.max_bytes
    ]


async def _read(p: _Partition, budget: int, *, first: bool) -> None:
    queue = p.queue
    assert queue is not None
    if p.offset == 0 and queue.first_id == 1:
        # A Kafka partition starts at offset 0, and clients seek there to read everything; ids
        # start at 1, so while nothing has been deleted 0 is where the first id is. Out of
        # range, a client's default reset (latest) would skip every message.
        p.offset = 1
    if p.offset < queue.first_id or p.offset > queue.last_id + 1:
        if not p.chunks:  # (reading on, retention may have passed what this answer holds)
            p.error = errors.OFFSET_OUT_OF_RANGE
        return
    if p.offset > queue.last_id:
        return
    limit = min(p.max_bytes, p.size + budget)
    await _read_pages(p, queue, p.offset - 1, limit, first=first)


async def _read_pages(p: _Partition, queue: BaseQueue, after: int, limit: int, *, first: bool) -> None:
    # Page by page, up to the byte limit: one page of READ_LIMIT messages loaded (and rendered)
    # the next block for every fetch that ended in the one before (~100 ms each in the
    # benchmark, for messages it did not answer), and its prefetch went a block too far.
    for _ in range(READ_LIMIT // PAGE_LIMIT):
        if after >= queue.last_id:
            return
        # A block loaded for this read is rendered in the loading thread, beside the other forms.
        page = await queue.read_page(after, PAGE_LIMIT, render=records.render)
        if not page.parts:
            return
        seen: set[int] = set()
        for batch, _start, _stop in page.parts:
            if id(batch) in seen:
                continue
            seen.add(id(batch))
            # A batch is rendered whole (a block's, once): what follows the page is taken too.
            for rendered in records.render(batch):
                if rendered.last_id <= after:
                    continue
                # At least one batch, even over the limits (KIP-74), so a large one is not stuck.
                if p.size + len(rendered.data) > limit and (p.chunks or not first):
                    p.full = True  # nothing after this batch can be answered either
                    return
                p.chunks.append(rendered.data)
                p.size += len(rendered.data)
                after = rendered.last_id
                p.offset = after + 1  # where reading on starts
        after = max(after, page.last_id)


async def _wait_any(wanted: list[_Partition], wait: float) -> bool:
    """Whether a message came after what any of ``wanted`` holds, waiting up to ``wait`` s."""
    waiting = [(p, p.queue) for p in wanted if p.queue is not None]
    waiters = [asyncio.ensure_future(queue.wait_for(p.offset - 1, wait)) for p, queue in waiting]
    if not waiters:
        return False
    try:
        await asyncio.wait(waiters, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
        for w in waiters:
            with contextlib.suppress(asyncio.CancelledError, CapellaError):
                await w
    return any(queue.last_id >= p.offset for p, queue in waiting)


def _grouped(wanted: list[_Partition]) -> list[dict[str, Any]]:
    topics: dict[str, list[dict[str, Any]]] = {}
    for p in wanted:
        queue = p.queue
        high = queue.last_id + 1 if queue is not None else -1
        start = queue.first_id if queue is not None else -1
        topics.setdefault(p.topic, []).append(
            {
                "partition_index": p.index,
                "error_code": p.error,
                "high_watermark": high,
                # No transactions: everything below the high watermark is stable.
                "last_stable_offset": high,
                "log_start_offset": start,
                "aborted_transactions": None,
                "preferred_read_replica": -1,
                "records": b"".join(p.chunks),
            }
        )
    return [{"topic": name, "partitions": parts} for name, parts in topics.items()]
