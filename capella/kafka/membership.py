"""FindCoordinator, JoinGroup, SyncGroup, Heartbeat and LeaveGroup: the classic group protocol.

This node coordinates every group it is asked about (``groups.Coordinator`` keeps the members
in memory, as Kafka does: they rejoin after a restart). Each call needs the ``group`` right
on the group id (``allow:group:read:orders-*``), which Kafka calls the group's READ ACL.
"""

from __future__ import annotations

from typing import Any

from capella.kafka import errors
from capella.kafka.session import Session

GROUP = 0
TRANSACTION = 1


async def find_coordinator(session: Session, request: Any, version: int) -> dict[str, Any]:
    broker = session.broker
    key_type = request.key_type if version >= 1 else GROUP
    code = errors.NONE
    message = None
    if key_type != GROUP:
        # Not COORDINATOR_NOT_AVAILABLE: clients retry that until their own timeout (aiokafka's
        # start() for ever); this one ends a transactional producer's start at once, with a reason.
        code, message = errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "transactions are not supported"
    elif not session.identity.can("group", "read", request.key):
        code, message = errors.GROUP_AUTHORIZATION_FAILED, f"may not use group {request.key!r}"
    ok = code == errors.NONE
    return {
        "throttle_time_ms": 0,
        "error_code": code,
        "error_message": message,
        "node_id": broker.node_id if ok else -1,
        "host": broker.host if ok else "",
        "port": broker.port if ok else -1,
    }


def _allowed(session: Session, group: str) -> bool:
    return session.identity.can("group", "read", group)


async def join_group(session: Session, request: Any, version: int) -> dict[str, Any]:
    group = request.group_id
    if not _allowed(session, group):
        return _join_refused(errors.GROUP_AUTHORIZATION_FAILED, request.member_id)
    session_timeout = request.session_timeout_ms / 1000
    # v0 has no rebalance timeout: its only timeout is the session's (KAFKA-8653).
    rebalance_timeout = request.rebalance_timeout_ms / 1000 if version >= 1 else session_timeout
    result = await session.broker.coordinator.join(
        group,
        request.member_id,
        instance_id=request.group_instance_id if version >= 5 else None,
        client_id=session.client_id or "",
        client_host=session.address,
        protocol_type=request.protocol_type,
        protocols=[(p.name, bytes(p.metadata)) for p in request.protocols],
        session_timeout=session_timeout,
        rebalance_timeout=rebalance_timeout,
        # As Kafka does from v4 on: a new member is first handed its id, then joins with it.
        require_member_id=version >= 4,
    )
    return {
        "throttle_time_ms": 0,
        "error_code": result.error,
        "generation_id": result.generation,
        "protocol_type": result.protocol_type,
        "protocol_name": result.protocol_name,
        "leader": result.leader,
        "skip_assignment": False,
        "member_id": result.member_id,
        "members": [
            {"member_id": member, "group_instance_id": instance, "metadata": metadata}
            for member, instance, metadata in result.members
        ],
    }


def _join_refused(code: int, member_id: str) -> dict[str, Any]:
    return {
        "throttle_time_ms": 0,
        "error_code": code,
        "generation_id": -1,
        "protocol_type": None,
        "protocol_name": None,
        "leader": "",
        "skip_assignment": False,
        "member_id": member_id,
        "members": [],
    }


async def sync_group(session: Session, request: Any, version: int) -> dict[str, Any]:
    group = request.group_id
    if not _allowed(session, group):
        return {"throttle_time_ms": 0, "error_code": errors.GROUP_AUTHORIZATION_FAILED, "assignment": b""}
    result = await session.broker.coordinator.sync(
        group,
        request.member_id,
        request.generation_id,
        instance_id=request.group_instance_id if version >= 3 else None,
        protocol_type=request.protocol_type if version >= 5 else None,
        protocol_name=request.protocol_name if version >= 5 else None,
        assignments={a.member_id: bytes(a.assignment) for a in request.assignments},
    )
    return {
        "throttle_time_ms": 0,
        "error_code": result.error,
        "protocol_type": result.protocol_type,
        "protocol_name": result.protocol_name,
        "assignment": result.assignment,
    }


async def heartbeat(session: Session, request: Any, version: int) -> dict[str, Any]:
    group = request.group_id
    if not _allowed(session, group):
        return {"throttle_time_ms": 0, "error_code": errors.GROUP_AUTHORIZATION_FAILED}
    code = session.broker.coordinator.heartbeat(
        group,
        request.member_id,
        request.generation_id,
        instance_id=request.group_instance_id if version >= 3 else None,
    )
    return {"throttle_time_ms": 0, "error_code": code}


async def leave_group(session: Session, request: Any, version: int) -> dict[str, Any]:
    group = request.group_id
    if version >= 3:
        leaving = [(m.member_id, m.group_instance_id) for m in request.members]
    else:
        leaving = [(request.member_id, None)]
    if not _allowed(session, group):
        return {
            "throttle_time_ms": 0,
            "error_code": errors.GROUP_AUTHORIZATION_FAILED,
            "members": [],
        }
    codes = session.broker.coordinator.leave(group, leaving)
    members = [
        {"member_id": member, "group_instance_id": instance, "error_code": code}
        for (member, instance), code in zip(leaving, codes, strict=True)
    ]
    top = errors.NONE if version >= 3 else codes[0]
    return {"throttle_time_ms": 0, "error_code": top, "members": members}
