"""Produce: each Kafka record batch becomes one Capella record batch, appended as the HTTP
API's binary produce appends it (the same checks, dedup and save modes).

``acks`` picks the save mode (docs/kafka.md, "Durability"):

| acks | save mode | answered |
|---|---|---|
| 0 | ``mark`` | never (Kafka sends no answer); the next periodic flush saves it |
| 1 | ``mark`` (``wait`` on a shared queue, whose ids come with the commit) | at once |
| all (-1) | ``wait``, or ``immediate`` when that is the queue's default | after the fsync |

An acks=0 produce that fails for a partition closes the connection instead of answering.

An idempotent producer's batches carry its producer id, epoch and sequence: its messages are
stored with the source ``<cluster>/kafka/<producer id>`` (``<cluster>/kafka/<user>/<producer
id>`` for a signed-in user) and external ids ``epoch << 32 | sequence``, so a batch sent again
after a lost answer or a crash is found by the queue's dedup and answered with the offsets it
was first given.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from capella.core.base_queue import BaseQueue
from capella.core.limits import check_count
from capella.core.message import SaveMode
from capella.errors import CapellaError
from capella.kafka import errors
from capella.kafka.records import decode_records, read_batches, to_capella
from capella.kafka.session import Session
from capella.kafka.topics import authorized_queue
from capella.records.record_batch import framed

log = logging.getLogger(__name__)


def save_mode(acks: int, queue: BaseQueue) -> SaveMode | None:
    """The save mode of a produce with ``acks``; None for a value Kafka does not know."""
    default = queue.definition.save
    if acks == -1:
        return SaveMode.IMMEDIATE if default is SaveMode.IMMEDIATE else SaveMode.WAIT
    if acks == 1:
        return SaveMode.WAIT if queue.shared else SaveMode.MARK
    if acks == 0:
        return SaveMode.MARK
    return None


async def produce(session: Session, request: Any, version: int) -> dict[str, Any] | None:
    acks = request.acks
    # Partitions are appended side by side: each waits for its own queue's flush, so a request
    # for three partitions takes one flush, not three. Within a partition, batches go in order.
    answers = await asyncio.gather(
        *(
            _partition(session, topic.name, part, acks, request.transactional_id)
            for topic in request.topic_data
            for part in topic.partition_data
        )
    )
    found = iter(answers)
    responses = [
        {"name": topic.name, "partition_responses": [next(found) for _ in topic.partition_data]}
        for topic in request.topic_data
    ]
    if acks == 0:
        # No answer; but a partition that failed closes the connection, as Kafka does, so the
        # producer notices (it reconnects and refreshes its metadata) instead of losing every
        # later message in silence.
        failed = [a for r in responses for a in r["partition_responses"] if a["error_code"] != errors.NONE]
        if failed:
            log.info(
                "kafka connection closed after a failed acks=0 produce address=%s error=%d",
                session.address,
                failed[0]["error_code"],
            )
            session.closing = True
        return None
    return {"responses": responses, "throttle_time_ms": 0}


async def _partition(
    session: Session, topic: str, part: Any, acks: int, transactional_id: str | None
) -> dict[str, Any]:
    index = part.index
    broker = session.broker
    if transactional_id is not None:
        return _answer(index, errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "transactions are not supported")
    try:
        queue = authorized_queue(session.identity, broker.cluster, topic, index, "write")
    except CapellaError as exc:
        return _answer(index, errors.code_for(exc), exc.message)
    save = save_mode(acks, queue)
    if save is None:
        return _answer(index, errors.INVALID_REQUIRED_ACKS, f"acks {acks}: use 0, 1 or -1 (all)")
    base = -1
    try:
        batches = read_batches(bytes(part.records or b""), max_size=broker.max_frame)
        for batch in batches:
            # Refused from its head (server.max_batch, as over HTTP): decoding a batch of a
            # million records first holds the event loop for seconds, only to refuse it then.
            check_count(batch.records_count, queue.limits)
            found = decode_records(batch, max_size=broker.max_frame)
            source = producer_source(queue, session, batch.producer_id)
            converted = to_capella(batch, found, now=queue.now(), source=source)
            # Whole: a Kafka batch is answered with its base offset alone (its records are base
            # + i), so a batch split over two blocks and cut by a kill -9 between their saves
            # could not be answered right when the producer sends it again.
            appended = await queue.append_batch(framed(converted.record_batch), save, whole=True)
            if base < 0 and appended and appended[0].id:
                base = appended[0].id
    except CapellaError as exc:
        code = errors.code_for(exc)
        if code == errors.UNKNOWN_SERVER_ERROR:
            log.error("kafka produce failed queue=%s", queue.name, exc_info=exc)
        return _answer(index, code, exc.message)
    return {
        "index": index,
        "error_code": errors.NONE,
        "base_offset": base,
        "log_append_time_ms": -1,
        "log_start_offset": queue.first_id,
        "record_errors": [],
        "error_message": None,
    }


def producer_source(queue: BaseQueue, session: Session, producer_id: int) -> str | None:
    """The source of an idempotent producer's messages; None for a producer without an id.

    A signed-in user's producer ids are their own: a batch naming another user's producer id
    is stored under a source of its own, so it can never be taken for (and drop) that
    producer's messages.
    """
    if producer_id < 0:
        return None
    user = session.identity.name
    return f"{queue.own}/kafka/{producer_id}" if user is None else f"{queue.own}/kafka/{user}/{producer_id}"


def _answer(index: int, code: int, message: str) -> dict[str, Any]:
    return {
        "index": index,
        "error_code": code,
        "base_offset": -1,
        "log_append_time_ms": -1,
        "log_start_offset": -1,
        "record_errors": [],
        "error_message": message,
    }
