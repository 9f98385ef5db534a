"""InitProducerId: producer ids for idempotent producers, from a lease that never hands one out twice.

A producer id is the identity of an idempotent producer's messages (``<cluster>/kafka/<id>``
as their source): handing one out twice would make the second producer's first messages look
like the first's, and the queue's dedup would drop them. So ids come from the cluster's
persisted lease (``Cluster.producer_ids``), never from a counter in memory. A producer that
asks again with its id and epoch (v3+, KIP-360, to bump its epoch) is given a new id instead:
taking the id it names would let anyone continue another producer's id space, and a client
takes whichever id it is answered with.
Transactions are not supported: a transactional id is refused.
"""

from __future__ import annotations

from typing import Any

from capella.errors import CapellaError
from capella.kafka import errors
from capella.kafka.session import Session


async def init_producer_id(session: Session, request: Any, version: int) -> dict[str, Any]:
    def answer(code: int, pid: int = -1, epoch: int = -1) -> dict[str, Any]:
        return {"throttle_time_ms": 0, "error_code": code, "producer_id": pid, "producer_epoch": epoch}

    if request.transactional_id is not None:
        return answer(errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    lease = session.broker.producer_ids
    if lease is None:
        return answer(errors.COORDINATOR_NOT_AVAILABLE)
    try:
        pid = await lease.take()
    except CapellaError as exc:
        return answer(errors.code_for(exc))
    return answer(errors.NONE, pid, 0)
