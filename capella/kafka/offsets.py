"""ListOffsets, OffsetCommit and OffsetFetch: offsets are ids, and a group's committed offsets
are subscriptions.

A group ``g``'s committed offset *o* on a partition is the subscription ``kafka.g`` on that
partition's queue with ``last_id = o - 1``: ``GET /v1/queues/q/subscriptions`` shows the group's
progress, and a subscription moved over HTTP moves the group. A group id that does not fit a
subscription name is named by its hash (``subscription_name``).
"""

from __future__ import annotations

import hashlib
import logging
import re
from typing import Any

from capella.core.base_queue import BaseQueue
from capella.errors import CapellaError, SubscriptionNotFound
from capella.kafka import errors
from capella.kafka.session import Session
from capella.kafka.topics import authorized_queue, listed
from capella.wire.fields import NAME

log = logging.getLogger(__name__)

LATEST = -1
EARLIEST = -2
MAX_TIMESTAMP = -3
PREFIX = "kafka."
_NAME = re.compile(NAME)


def subscription_name(group_id: str) -> str:
    """The subscription that holds ``group_id``'s offsets: ``kafka.<group>``, or
    ``kafka.<sha256[:16]>`` when that is no valid subscription name."""
    name = PREFIX + group_id
    if _NAME.fullmatch(name):
        return name
    return PREFIX + hashlib.sha256(group_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]


# --- ListOffsets ---------------------------------------------------------------------------


async def list_offsets(session: Session, request: Any, version: int) -> dict[str, Any]:
    topics = []
    for topic in request.topics:
        answers = []
        for part in topic.partitions:
            answers.append(await _list_one(session, topic.name, part.partition_index, part.timestamp))
        topics.append({"name": topic.name, "partitions": answers})
    return {"throttle_time_ms": 0, "topics": topics}


async def _list_one(session: Session, topic: str, index: int, timestamp: int) -> dict[str, Any]:
    def answer(code: int, offset: int = -1, ts: int = -1) -> dict[str, Any]:
        return {
            "partition_index": index,
            "error_code": code,
            "timestamp": ts,
            "offset": offset,
            "leader_epoch": 0 if code == errors.NONE else -1,
        }

    try:
        queue = authorized_queue(session.identity, session.broker.cluster, topic, index, "read")
    except CapellaError as exc:
        return answer(errors.code_for(exc))
    try:
        if timestamp == LATEST:
            return answer(errors.NONE, queue.last_id + 1)
        if timestamp == EARLIEST:
            return answer(errors.NONE, queue.first_id)
        if timestamp == MAX_TIMESTAMP:
            if queue.last_id < queue.first_id:
                return answer(errors.NONE, -1)
            last = await _message_at(queue, queue.last_id)
            return answer(errors.NONE, last[0], last[1]) if last else answer(errors.NONE, -1)
        if timestamp < 0:
            return answer(errors.INVALID_REQUEST)
        found = await offset_for_time(queue, timestamp / 1000)
        return answer(errors.NONE, found[0], found[1]) if found else answer(errors.NONE, -1)
    except CapellaError as exc:
        return answer(errors.code_for(exc))


async def _message_at(queue: BaseQueue, message_id: int) -> tuple[int, int] | None:
    """The id and time (ms) of the first message at or after ``message_id``."""
    page = await queue.read_page(message_id - 1, 1)
    messages = page.messages()
    if not messages:
        return None
    return messages[0].id, int(messages[0].time * 1000)


async def offset_for_time(queue: BaseQueue, when: float) -> tuple[int, int] | None:
    """The first message stored at or after ``when`` (its receive time), by bisecting the ids:
    a few reads, each of one message. None when every message is older."""
    low, high = queue.first_id, queue.last_id
    found: tuple[int, int] | None = None
    while low <= high:
        mid = (low + high) // 2
        at = await _message_at(queue, mid)
        if at is None:
            break
        if at[1] >= when * 1000:
            found = at
            high = mid - 1
        else:
            low = at[0] + 1
    return found


# --- OffsetCommit / OffsetFetch ------------------------------------------------------------


async def offset_commit(session: Session, request: Any, version: int) -> dict[str, Any]:
    group = request.group_id
    identity = session.identity
    if not group:
        return _commit_answer(request, lambda _topic, _part: errors.INVALID_GROUP_ID)
    if not identity.can("group", "read", group):
        code = errors.GROUP_AUTHORIZATION_FAILED
        return _commit_answer(request, lambda _topic, _part: code)
    if not session.broker.coordinates(group):
        # A shared cluster's other node holds the group's members (kafka/nodes.py).
        return _commit_answer(request, lambda _topic, _part: errors.NOT_COORDINATOR)
    generation = request.generation_id_or_member_epoch
    check = session.broker.coordinator.check_commit(group, request.member_id, generation)
    if check != errors.NONE:
        return _commit_answer(request, lambda _topic, _part: check)
    name = subscription_name(group)
    topics = []
    for topic in request.topics:
        answers = []
        for part in topic.partitions:
            code = await _commit_one(session, topic.name, part, name, group)
            answers.append({"partition_index": part.partition_index, "error_code": code})
        topics.append({"name": topic.name, "partitions": answers})
    return {"throttle_time_ms": 0, "topics": topics}


async def _commit_one(session: Session, topic: str, part: Any, name: str, group: str) -> int:
    cluster = session.broker.cluster
    try:
        queue = authorized_queue(session.identity, cluster, topic, part.partition_index, "read")
    except CapellaError as exc:
        return errors.code_for(exc)
    offset = part.committed_offset
    if offset < 0:
        return errors.NONE  # Kafka ignores a commit of -1 (nothing consumed)
    try:
        if not await _ours(queue, name, group):
            return errors.INVALID_GROUP_ID
        # Kafka lets a group commit an offset below its last one (a reset): so may this. The
        # group id is kept when the name is its hash, so the cursor says whose it is. Offset 0
        # (Kafka's first, and what a reset to it commits) is where the first id is: ids start
        # at 1, so nothing is before it, as after offset 1.
        await queue.commit(
            name,
            max(offset - 1, 0),
            reset=True,
            group=None if name == PREFIX + group else group,
            metadata=commit_metadata(part.committed_metadata),
        )
    except CapellaError as exc:
        code = errors.code_for(exc)
        if code == errors.UNKNOWN_SERVER_ERROR:
            log.error("kafka offset commit failed queue=%s group=%s", queue.name, group, exc_info=exc)
        return code
    return errors.NONE


def commit_metadata(metadata: str | None) -> str:
    """What a commit's metadata is stored as: its text without the NULs that end it.

    confluent-kafka sends a C string's terminating NUL as part of the metadata, and a cursor's
    metadata holds no NUL (a shared queue keeps it in PostgreSQL text): kept as sent, every
    commit with metadata from that client would be refused.
    """
    return (metadata or "").rstrip("\x00")


def _commit_answer(request: Any, code_of: Any) -> dict[str, Any]:
    return {
        "throttle_time_ms": 0,
        "topics": [
            {
                "name": topic.name,
                "partitions": [
                    {"partition_index": p.partition_index, "error_code": code_of(topic, p)}
                    for p in topic.partitions
                ],
            }
            for topic in request.topics
        ],
    }


async def offset_fetch(session: Session, request: Any, version: int) -> dict[str, Any]:
    group = request.group_id
    if not session.identity.can("group", "read", group):
        return {"throttle_time_ms": 0, "topics": [], "error_code": errors.GROUP_AUTHORIZATION_FAILED}
    name = subscription_name(group)
    asked = request.topics
    if asked is None:
        # Every partition the group has committed on (v2+) that the caller may read: as Kafka
        # does, the others are left out, not answered 29, which would name them.
        found: list[tuple[str, list[int]]] = []
        cluster = session.broker.cluster
        identity = session.identity
        for topic, queues in listed(cluster).items():
            committed = [
                index
                for index, queue in enumerate(queues)
                if identity.can("queue", "read", queue)
                and any(s.name == name for s in cluster.queue(queue).subscriptions())
            ]
            if committed:
                found.append((topic, committed))
        pairs = found
    else:
        pairs = [(t.name, list(t.partition_indexes)) for t in asked]
    topics = []
    for topic, indexes in pairs:
        parts = [await _fetch_one(session, topic, index, name, group) for index in indexes]
        topics.append({"name": topic, "partitions": parts})
    return {"throttle_time_ms": 0, "topics": topics, "error_code": errors.NONE}


async def _fetch_one(session: Session, topic: str, index: int, name: str, group: str) -> dict[str, Any]:
    def answer(code: int, offset: int = -1, metadata: str | None = "") -> dict[str, Any]:
        return {
            "partition_index": index,
            "committed_offset": offset,
            "committed_leader_epoch": -1,
            "metadata": metadata,
            "error_code": code,
        }

    try:
        queue = authorized_queue(session.identity, session.broker.cluster, topic, index, "read")
    except CapellaError as exc:
        return answer(errors.code_for(exc))
    try:
        sub = await queue.current_subscription(name)
    except SubscriptionNotFound:
        return answer(errors.NONE)
    except CapellaError as exc:
        return answer(errors.code_for(exc))
    if sub.group is not None and sub.group != group:
        return answer(errors.NONE)  # another group's cursor under the same hash: not this one's
    return answer(errors.NONE, sub.last_id + 1, sub.metadata or "")


async def _ours(queue: BaseQueue, name: str, group: str) -> bool:
    """Whether cursor ``name`` is free or this group's (not another group's under the same hash)."""
    try:
        sub = await queue.current_subscription(name)
    except SubscriptionNotFound:
        return True
    return sub.group is None or sub.group == group
