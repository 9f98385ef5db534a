"""The classic consumer group coordinator: JoinGroup, SyncGroup, Heartbeat, LeaveGroup.

Kafka's own state machine (apache/kafka ``core/src/main/scala/kafka/coordinator/group/``
``GroupCoordinator.scala`` and ``GroupMetadata.scala``, the same rules as the Java
``GroupMetadataManager`` classic handlers), in memory as Kafka keeps it: members rejoin after a
restart, and committed offsets live in subscriptions, not here.

A group is Empty, PreparingRebalance (joins are parked until every known member has rejoined or
the rebalance timeout passed), CompletingRebalance (the leader, a client, computes the assignment;
followers' syncs are parked until the leader's arrives) or Stable. A group with neither members
nor members waiting to rejoin is forgotten (Dead): its offsets are subscriptions, so nothing is
lost, and a stranger cannot fill memory with empty groups. The coordinator chooses a protocol
every member supports and relays bytes; it never reads them.

Each waiting call owns its future (design note §3 item 10): a rebalance completed inside the call
that triggered it still answers that caller, and a member's second JoinGroup or SyncGroup while
the first waits is answered with the same result as the first. Time comes only from the clock
passed in; deadlines (session timeouts, rebalance and sync timeouts, the initial delay) are acted
on by ``expire()``, which the listener calls about twice a second. No I/O, no kafka-python: the
listener decodes requests and encodes these answers.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from capella.kafka.errors import (
    COORDINATOR_NOT_AVAILABLE,
    FENCED_INSTANCE_ID,
    GROUP_MAX_SIZE_REACHED,
    ILLEGAL_GENERATION,
    INCONSISTENT_GROUP_PROTOCOL,
    INVALID_GROUP_ID,
    INVALID_REQUEST,
    INVALID_SESSION_TIMEOUT,
    MEMBER_ID_REQUIRED,
    NONE,
    NOT_COORDINATOR,
    REBALANCE_IN_PROGRESS,
    UNKNOWN_MEMBER_ID,
)

log = logging.getLogger(__name__)
# Group ids, member ids (which hold client ids) and protocol names are whatever clients send:
# they are logged as repr, so a newline in one cannot forge a line of the log.

MAX_GROUP_ID = 255
# A group.instance.id is a Kafka topic-like name (JoinGroupRequest.validateGroupInstanceId).
MAX_INSTANCE_ID = 249
# Kafka's NewMemberJoinTimeoutMs: a new member's first JoinGroup may wait this long, no longer
# (its client may have given up and retried with another member id).
NEW_MEMBER_JOIN_TIMEOUT = 300.0

Protocols = tuple[tuple[str, bytes], ...]


class GroupState(enum.StrEnum):
    """A group's state, named as Kafka's DescribeGroups names it."""

    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(frozen=True, slots=True)
class JoinResult:
    """A JoinGroup answer; ``members`` (id, instance id, metadata) only for the leader."""

    error: int
    generation: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    member_id: str = ""
    members: tuple[tuple[str, str | None, bytes], ...] = ()


@dataclass(frozen=True, slots=True)
class SyncResult:
    """A SyncGroup answer: the member's assignment, as the leader gave it."""

    error: int
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """One group, for metrics and status."""

    group_id: str
    state: GroupState
    generation: int
    protocol_type: str | None
    protocol_name: str | None
    leader: str | None
    members: int


@dataclass(slots=True, eq=False)
class _Member:
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    protocol_type: str
    protocols: Protocols
    session_timeout: float
    rebalance_timeout: float
    deadline: float  # the session ends here unless a heartbeat, join, sync or commit pushes it
    is_new: bool = True  # its first JoinGroup is not answered yet
    assignment: bytes = b""
    joins: list[asyncio.Future[JoinResult]] = field(default_factory=list)
    syncs: list[asyncio.Future[SyncResult]] = field(default_factory=list)

    def metadata(self, protocol: str) -> bytes:
        return next(meta for name, meta in self.protocols if name == protocol)

    def vote(self, candidates: set[str]) -> str:
        """The member's most preferred protocol among those every member supports."""
        return next(name for name, _ in self.protocols if name in candidates)

    def awaiting(self) -> bool:
        return bool(self.joins or self.syncs)


@dataclass(slots=True, eq=False)
class _Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str | None = None
    members: dict[str, _Member] = field(default_factory=dict)  # in the order they were added
    static: dict[str, str] = field(default_factory=dict)  # group.instance.id -> member id
    pending: dict[str, float] = field(default_factory=dict)  # id handed out with 79 -> its deadline
    pending_sync: set[str] = field(default_factory=set)  # answered JoinGroup, not synced yet
    supported: Counter[str] = field(default_factory=Counter)  # protocol -> members supporting it
    join_deadline: float | None = None  # PreparingRebalance ends here at the latest
    sync_deadline: float | None = None  # members not synced by then are removed
    initial: bool = False  # the first rebalance out of Empty: wait for others starting too
    initial_delay: float = 0.0
    initial_remaining: float = 0.0
    new_member_added: bool = False

    def supports(self, protocol_type: str, protocols: Protocols) -> bool:
        if not self.members:
            return bool(protocol_type) and bool(protocols)
        everyone = len(self.members)
        return self.protocol_type == protocol_type and any(
            self.supported[name] == everyone for name, _ in protocols
        )

    def select_protocol(self) -> str:
        """Kafka's vote: each member names its favourite among the protocols all support."""
        everyone = len(self.members)
        candidates = {name for name, count in self.supported.items() if count == everyone}
        votes = Counter(m.vote(candidates) for m in self.members.values())
        return votes.most_common(1)[0][0]  # ties go to the vote counted first

    def validate(self, member_id: str, instance_id: str | None) -> int:
        """Kafka's validateCurrentMember: the instance id, if any, maps to this member id."""
        if instance_id is not None:
            current = self.static.get(instance_id)
            if current is None:
                return UNKNOWN_MEMBER_ID
            return FENCED_INSTANCE_ID if current != member_id else NONE
        return NONE if member_id in self.members else UNKNOWN_MEMBER_ID

    def add(self, member: _Member) -> None:
        if member.instance_id is not None:
            self.static[member.instance_id] = member.member_id
        if not self.members:
            self.protocol_type = member.protocol_type
        if self.leader is None:
            self.leader = member.member_id
        self.members[member.member_id] = member
        self.supported.update(name for name, _ in member.protocols)
        self.pending.pop(member.member_id, None)

    def remove(self, member_id: str) -> None:
        member = self.members.pop(member_id, None)
        if member is not None:
            self.supported.subtract(name for name, _ in member.protocols)
            if member.instance_id is not None:
                self.static.pop(member.instance_id, None)
        if self.leader == member_id:
            self.leader = next(iter(self.members), None)
        self.pending.pop(member_id, None)
        self.pending_sync.discard(member_id)

    def set_protocols(self, member: _Member, protocols: Protocols) -> None:
        self.supported.subtract(name for name, _ in member.protocols)
        member.protocols = protocols
        self.supported.update(name for name, _ in protocols)

    def all_joined(self) -> bool:
        return not self.pending and all(m.joins for m in self.members.values())

    def rebalance_timeout(self) -> float:
        return max((m.rebalance_timeout for m in self.members.values()), default=0.0)

    def elect_joined_leader(self) -> bool:
        """Keep the leader if it rejoined, else take a member that did; ``False`` if none did."""
        if self.leader is None:
            return False
        if self.members[self.leader].joins:
            return True
        joined = next((m.member_id for m in self.members.values() if m.joins), None)
        if joined is None:
            return False
        self.leader = joined
        return True

    def result(self, member_id: str, members: bool) -> JoinResult:
        """The current generation, as a JoinGroup answer for this member."""
        everyone: tuple[tuple[str, str | None, bytes], ...] = ()
        if members and self.protocol_name is not None:
            everyone = tuple(
                (m.member_id, m.instance_id, m.metadata(self.protocol_name)) for m in self.members.values()
            )
        return JoinResult(
            NONE,
            generation=self.generation,
            protocol_type=self.protocol_type,
            protocol_name=self.protocol_name,
            leader=self.leader or "",
            member_id=member_id,
            members=everyone,
        )


def _answer_joins(member: _Member, result: JoinResult) -> None:
    for waiter in member.joins:
        if not waiter.done():  # its caller may have gone (cancelled)
            waiter.set_result(result)
    member.joins.clear()


def _answer_syncs(member: _Member, result: SyncResult) -> None:
    for waiter in member.syncs:
        if not waiter.done():
            waiter.set_result(result)
    member.syncs.clear()


def _unique(protocols: Iterable[tuple[str, bytes]]) -> Protocols:
    """The member's protocols in its order of preference, each name once (the first wins)."""
    seen: dict[str, bytes] = {}
    for name, meta in protocols:
        seen.setdefault(name, bytes(meta))
    return tuple(seen.items())


class Coordinator:
    """Every classic group this node coordinates.

    ``initial_delay`` is Kafka's group.initial.rebalance.delay.ms (3 s there): the first rebalance
    out of Empty waits that long, and as long again while new members keep arriving (up to the
    rebalance timeout), so consumers started together land in one generation. Session timeouts
    outside ``[min_session_timeout, max_session_timeout]`` are refused (26), as Kafka's
    group.min/max.session.timeout.ms (6 s and 30 min there; the lower bound is lower here so tests
    and small deployments may use short ones). Times are seconds.
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_groups: int = 1000,
        max_members: int = 1000,
        initial_delay: float = 0.3,
        min_session_timeout: float = 1.0,
        max_session_timeout: float = 1800.0,
    ) -> None:
        self._clock = clock
        self._max_groups = max_groups
        self._max_members = max_members
        self._initial_delay = initial_delay
        self._min_session = min_session_timeout
        self._max_session = max_session_timeout
        self._groups: dict[str, _Group] = {}
        self._closed = False

    # --- JoinGroup -------------------------------------------------------------------------

    async def join(
        self,
        group_id: str,
        member_id: str,
        *,
        instance_id: str | None,
        client_id: str,
        client_host: str,
        protocol_type: str,
        protocols: Iterable[tuple[str, bytes]],
        session_timeout: float,
        rebalance_timeout: float,
        require_member_id: bool = False,
    ) -> JoinResult:
        """Answer a JoinGroup once this member's rebalance completes (or at once, for errors).

        ``require_member_id`` is Kafka's rule for JoinGroup v4+: a new dynamic member is first
        answered MEMBER_ID_REQUIRED (79) with its id, and joins when it comes back with it.
        JoinGroup v0 has no rebalance timeout: pass the session timeout as both.
        """
        waiter: asyncio.Future[JoinResult] = asyncio.get_running_loop().create_future()
        self._join(
            waiter,
            group_id,
            member_id,
            instance_id or None,  # clients send null; an empty id is no instance id either
            client_id,
            client_host,
            protocol_type,
            _unique(protocols),
            session_timeout,
            # A rebalance timeout of -1 or 0 would end every rebalance at once (kafka4beam/brod#465).
            rebalance_timeout if rebalance_timeout > 0 else session_timeout,
            require_member_id,
        )
        return await waiter

    def _join(
        self,
        waiter: asyncio.Future[JoinResult],
        group_id: str,
        member_id: str,
        instance_id: str | None,
        client_id: str,
        client_host: str,
        protocol_type: str,
        protocols: Protocols,
        session_timeout: float,
        rebalance_timeout: float,
        require_member_id: bool,
    ) -> None:
        error = self._check_group_id(group_id)
        if error == NONE and instance_id is not None and len(instance_id) > MAX_INSTANCE_ID:
            error = INVALID_REQUEST
        if error == NONE and not self._min_session <= session_timeout <= self._max_session:
            error = INVALID_SESSION_TIMEOUT
        group = self._groups.get(group_id)
        if error == NONE and group is None:
            if member_id:
                error = UNKNOWN_MEMBER_ID  # the group is gone (emptied, or the server restarted)
            elif len(self._groups) >= self._max_groups:
                error = COORDINATOR_NOT_AVAILABLE
            else:
                group = self._groups[group_id] = _Group(group_id)
        if error != NONE or group is None:
            waiter.set_result(JoinResult(error, member_id=member_id))
            return
        if not self._accept(group, member_id):
            if member_id in group.members:
                self._remove(group, group.members[member_id], "group full")
            waiter.set_result(JoinResult(GROUP_MAX_SIZE_REACHED))
        elif not group.supports(protocol_type, protocols):
            waiter.set_result(JoinResult(INCONSISTENT_GROUP_PROTOCOL, member_id=member_id))
        elif not member_id or (member_id in group.pending and instance_id is None):
            # A new member, or one that comes back with the id it was handed (79).
            member = _Member(
                member_id or f"{instance_id or client_id}-{uuid.uuid4()}",
                instance_id,
                client_id,
                client_host,
                protocol_type,
                protocols,
                session_timeout,
                rebalance_timeout,
                deadline=self._clock() + NEW_MEMBER_JOIN_TIMEOUT,
            )
            if member_id:
                self._add(group, member, waiter)
            elif instance_id is not None and instance_id in group.static:
                self._replace_static(group, instance_id, member, waiter)
            elif instance_id is None and require_member_id:
                group.pending[member.member_id] = self._clock() + session_timeout
                waiter.set_result(JoinResult(MEMBER_ID_REQUIRED, member_id=member.member_id))
            else:
                self._add(group, member, waiter)
        else:
            self._rejoin(group, member_id, instance_id, protocols, session_timeout, rebalance_timeout, waiter)
        self._try_complete_join(group)
        self._forget_if_unused(group)

    def _accept(self, group: _Group, member_id: str) -> bool:
        """Kafka's acceptJoiningMember, with members waiting for their id (79) counted too."""
        if member_id in group.pending:
            return True
        known = group.members.get(member_id)
        if group.state is not GroupState.PREPARING_REBALANCE:
            return known is not None or len(group.members) + len(group.pending) < self._max_members
        if known is not None and known.joins:
            return True
        if len(group.members) + len(group.pending) < self._max_members:
            return True  # no need to count who has rejoined (a scan per join of a large group)
        awaiting = sum(1 for m in group.members.values() if m.joins)
        return awaiting + (0 if known is not None else len(group.pending)) < self._max_members

    def _add(self, group: _Group, member: _Member, waiter: asyncio.Future[JoinResult]) -> None:
        if group.state is GroupState.PREPARING_REBALANCE and group.initial:
            group.new_member_added = True
        group.add(member)
        member.joins.append(waiter)
        self._maybe_prepare(group, f"member {member.member_id!r} joined")

    def _rejoin(
        self,
        group: _Group,
        member_id: str,
        instance_id: str | None,
        protocols: Protocols,
        session_timeout: float,
        rebalance_timeout: float,
        waiter: asyncio.Future[JoinResult],
    ) -> None:
        error = group.validate(member_id, instance_id)
        if error != NONE:
            waiter.set_result(JoinResult(error, member_id=member_id))
            return
        member = group.members[member_id]
        self._touch(member)
        unchanged = member.protocols == protocols
        # §3 item 9: a follower that rejoins with the same metadata gets the current generation
        # back (kafka-python's follower rejoins after each SyncGroup); the leader rejoining, or
        # new metadata, rebalances. In CompletingRebalance the leader gets the members again.
        if group.state is GroupState.COMPLETING_REBALANCE and unchanged:
            waiter.set_result(group.result(member_id, members=member_id == group.leader))
        elif group.state is GroupState.STABLE and unchanged and member_id != group.leader:
            waiter.set_result(group.result(member_id, members=False))
        elif group.state is GroupState.EMPTY:
            waiter.set_result(JoinResult(UNKNOWN_MEMBER_ID, member_id=member_id))
        else:
            group.set_protocols(member, protocols)
            member.session_timeout = session_timeout
            member.rebalance_timeout = rebalance_timeout
            member.joins.append(waiter)
            self._maybe_prepare(group, f"member {member_id!r} rejoined")

    def _replace_static(
        self, group: _Group, instance_id: str, member: _Member, waiter: asyncio.Future[JoinResult]
    ) -> None:
        """A known group.instance.id joins with no member id: it takes over the old member id.

        The old id's waiting calls are fenced (82). In Stable, when the protocol the group would
        choose is unchanged, there is no rebalance: the member gets the current generation, and
        the leader id from before (so a restarted leader does not compute an assignment nobody
        would receive; it syncs and gets its old one).
        """
        previous_leader = group.leader
        old_id = group.static[instance_id]
        old = group.members.pop(old_id)
        _answer_joins(old, JoinResult(FENCED_INSTANCE_ID, member_id=old_id))
        _answer_syncs(old, SyncResult(FENCED_INSTANCE_ID))
        old.member_id = member.member_id
        group.members[old.member_id] = old
        group.static[instance_id] = old.member_id
        if group.leader == old_id:
            group.leader = old.member_id
        if old_id in group.pending_sync:
            group.pending_sync.discard(old_id)
            group.pending_sync.add(old.member_id)
        group.set_protocols(old, member.protocols)
        old.client_id, old.client_host = member.client_id, member.client_host
        old.session_timeout, old.rebalance_timeout = member.session_timeout, member.rebalance_timeout
        self._touch(old)
        old.joins.append(waiter)
        if group.state is GroupState.STABLE:
            if group.select_protocol() == group.protocol_name:
                _answer_joins(old, replace(group.result(old.member_id, False), leader=previous_leader or ""))
            else:
                self._prepare(group, f"static member {instance_id} changed protocols")
        elif group.state is GroupState.COMPLETING_REBALANCE:
            # The leader may already be assigning to the old id: start over.
            self._prepare(group, f"static member {instance_id} rejoined during the sync")

    # --- rebalancing -----------------------------------------------------------------------

    def _maybe_prepare(self, group: _Group, reason: str) -> None:
        if group.state in (GroupState.EMPTY, GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare(group, reason)

    def _prepare(self, group: _Group, reason: str) -> None:
        """Start a rebalance: park joins until every member rejoined or the timeout passed."""
        if group.state is GroupState.COMPLETING_REBALANCE:
            for member in group.members.values():
                member.assignment = b""
                _answer_syncs(member, SyncResult(REBALANCE_IN_PROGRESS))
        group.pending_sync.clear()
        group.sync_deadline = None
        now = self._clock()
        if group.state is GroupState.EMPTY and self._initial_delay > 0:
            group.initial = True
            group.initial_delay = self._initial_delay
            group.initial_remaining = max(group.rebalance_timeout() - self._initial_delay, 0.0)
            group.new_member_added = False
            group.join_deadline = now + self._initial_delay
        else:
            group.initial = False
            group.join_deadline = now + group.rebalance_timeout()
        log.info(
            "group rebalancing group=%r generation=%d members=%d reason=%s",
            group.group_id,
            group.generation,
            len(group.members),
            reason,
        )
        group.state = GroupState.PREPARING_REBALANCE
        self._try_complete_join(group)

    def _try_complete_join(self, group: _Group) -> None:
        if group.state is GroupState.PREPARING_REBALANCE and not group.initial and group.all_joined():
            self._complete_join(group)

    def _complete_join(self, group: _Group) -> None:
        """End PreparingRebalance: drop who did not rejoin, bump the generation, answer the joins."""
        for member in [m for m in group.members.values() if not m.joins and m.instance_id is None]:
            log.info("member did not rejoin group=%r member=%r", group.group_id, member.member_id)
            group.remove(member.member_id)
        now = self._clock()
        group.initial = False
        if not group.elect_joined_leader() and group.members:
            # Only static members that did not rejoin are left: wait for them (or their sessions).
            group.join_deadline = now + group.rebalance_timeout()
            return
        group.generation += 1
        group.join_deadline = None
        if not group.members:
            group.protocol_name = None
            group.state = GroupState.EMPTY
            self._forget_if_unused(group)
            return
        group.protocol_name = group.select_protocol()
        group.state = GroupState.COMPLETING_REBALANCE
        log.info(
            "group rebalanced group=%r generation=%d members=%d protocol=%r",
            group.group_id,
            group.generation,
            len(group.members),
            group.protocol_name,
        )
        for member in group.members.values():
            _answer_joins(member, group.result(member.member_id, members=member.member_id == group.leader))
            self._touch(member)
            member.is_new = False
            group.pending_sync.add(member.member_id)
        group.sync_deadline = now + group.rebalance_timeout()

    # --- SyncGroup -------------------------------------------------------------------------

    async def sync(
        self,
        group_id: str,
        member_id: str,
        generation: int,
        *,
        instance_id: str | None,
        protocol_type: str | None,
        protocol_name: str | None,
        assignments: dict[str, bytes],
    ) -> SyncResult:
        """Answer a SyncGroup: a follower waits for the leader's; the leader's hands out everyone's.

        ``protocol_type`` and ``protocol_name`` are checked when given (SyncGroup v5+); pass
        ``None`` for older versions.
        """
        waiter: asyncio.Future[SyncResult] = asyncio.get_running_loop().create_future()
        self._sync(
            waiter,
            group_id,
            member_id,
            generation,
            instance_id or None,
            protocol_type,
            protocol_name,
            assignments,
        )
        return await waiter

    def _sync(
        self,
        waiter: asyncio.Future[SyncResult],
        group_id: str,
        member_id: str,
        generation: int,
        instance_id: str | None,
        protocol_type: str | None,
        protocol_name: str | None,
        assignments: dict[str, bytes],
    ) -> None:
        error = self._check_group_id(group_id)
        group = self._groups.get(group_id)
        if error == NONE:
            error = UNKNOWN_MEMBER_ID if group is None else group.validate(member_id, instance_id)
        if error != NONE or group is None:
            waiter.set_result(SyncResult(error))
            return
        if generation != group.generation:
            error = ILLEGAL_GENERATION
        elif (protocol_type is not None and protocol_type != group.protocol_type) or (
            protocol_name is not None and protocol_name != group.protocol_name
        ):
            error = INCONSISTENT_GROUP_PROTOCOL
        elif group.state is GroupState.PREPARING_REBALANCE:
            error = REBALANCE_IN_PROGRESS
        elif group.state is GroupState.EMPTY:
            error = UNKNOWN_MEMBER_ID
        if error != NONE:
            waiter.set_result(SyncResult(error))
            return
        member = group.members[member_id]
        group.pending_sync.discard(member_id)
        if not group.pending_sync:
            group.sync_deadline = None
        if group.state is GroupState.STABLE:
            waiter.set_result(SyncResult(NONE, group.protocol_type, group.protocol_name, member.assignment))
            self._touch(member)
            return
        member.syncs.append(waiter)
        if member_id == group.leader:
            # Members the leader left out get an empty assignment; ids it made up are ignored.
            for m in group.members.values():
                m.assignment = bytes(assignments.get(m.member_id, b""))
            group.state = GroupState.STABLE
            for m in group.members.values():
                if m.syncs:
                    _answer_syncs(m, SyncResult(NONE, group.protocol_type, group.protocol_name, m.assignment))
                    self._touch(m)

    # --- Heartbeat, LeaveGroup, OffsetCommit's check ---------------------------------------

    def heartbeat(self, group_id: str, member_id: str, generation: int, *, instance_id: str | None) -> int:
        """Heartbeat's error: 27 only in PreparingRebalance (the member must rejoin), else 0."""
        error = self._check_group_id(group_id)
        group = self._groups.get(group_id)
        if error == NONE:
            error = UNKNOWN_MEMBER_ID if group is None else group.validate(member_id, instance_id or None)
        if error != NONE or group is None:
            return error
        if generation != group.generation:
            return ILLEGAL_GENERATION
        if group.state is GroupState.EMPTY:
            return UNKNOWN_MEMBER_ID
        self._touch(group.members[member_id])
        return REBALANCE_IN_PROGRESS if group.state is GroupState.PREPARING_REBALANCE else NONE

    def leave(self, group_id: str, members: list[tuple[str, str | None]]) -> list[int]:
        """LeaveGroup, one error per (member id, instance id); an empty member id names the
        member by its instance id (LeaveGroup v3+, administrative removal)."""
        error = self._check_group_id(group_id)
        group = self._groups.get(group_id)
        if error != NONE or group is None:
            return [error or UNKNOWN_MEMBER_ID for _ in members]
        errors: list[int] = []
        for member_id, instance_id in members:
            instance_id = instance_id or None
            if not member_id:
                current = group.static.get(instance_id) if instance_id is not None else None
                if current is None:
                    errors.append(UNKNOWN_MEMBER_ID)
                    continue
                member_id = current
            elif member_id in group.pending:
                del group.pending[member_id]
                self._try_complete_join(group)
                errors.append(NONE)
                continue
            error = group.validate(member_id, instance_id)
            if error == NONE:
                self._remove(group, group.members[member_id], "left")
            errors.append(error)
        self._forget_if_unused(group)
        return errors

    def check_commit(
        self, group_id: str, member_id: str, generation: int, *, instance_id: str | None = None
    ) -> int:
        """OffsetCommit's check (Kafka's validateOffsetCommit): 0 when the commit may be stored.

        Generation -1 with no member id is a client without group management: accepted while the
        group has no members (or does not exist), 25 while it has. Otherwise the member must be
        known (25, 82) and of the current generation (22); 27 in CompletingRebalance. Commits in
        PreparingRebalance are accepted (the member learns of the rebalance from its heartbeat).
        An empty group id is allowed, as Kafka allows it for OffsetCommit.
        """
        instance_id = instance_id or None
        if self._closed:
            return COORDINATOR_NOT_AVAILABLE
        if len(group_id) > MAX_GROUP_ID:
            return INVALID_GROUP_ID
        group = self._groups.get(group_id)
        if group is None:
            if generation < 0 and not member_id and instance_id is None:
                return NONE
            # Members are in memory only: an emptied group, or a restart, forgot this member.
            return UNKNOWN_MEMBER_ID if member_id else ILLEGAL_GENERATION
        if generation < 0 and not group.members:
            return NONE
        if generation >= 0 or member_id or instance_id is not None:
            error = group.validate(member_id, instance_id)
            if error != NONE:
                return error
            if generation != group.generation:
                return ILLEGAL_GENERATION
        elif group.members:
            return UNKNOWN_MEMBER_ID
        if group.state is GroupState.COMPLETING_REBALANCE:
            return REBALANCE_IN_PROGRESS
        if member_id in group.members:
            self._touch(group.members[member_id])
        return NONE

    # --- time, status, closing -------------------------------------------------------------

    def expire(self) -> float | None:
        """Act on every deadline passed; answer the next deadline (clock time), if any.

        Members past their session are removed (a rebalance follows), members handed an id
        with 79 that did not come back are forgotten, a rebalance past its timeout completes
        without the members that did not rejoin, and members that did not sync in time are
        removed. A member waiting in JoinGroup or SyncGroup does not time out while it waits.
        """
        now = self._clock()
        upcoming: list[float] = []
        for group in list(self._groups.values()):
            for pending_id, deadline in list(group.pending.items()):
                if now >= deadline:
                    del group.pending[pending_id]
                    self._try_complete_join(group)
            for member in list(group.members.values()):
                if group.members.get(member.member_id) is not member:
                    continue
                if now >= member.deadline and (member.is_new or not member.awaiting()):
                    log.info("member session expired group=%r member=%r", group.group_id, member.member_id)
                    self._remove(group, member, f"session of {member.member_id} expired")
            if (
                group.state is GroupState.PREPARING_REBALANCE
                and group.join_deadline is not None
                and now >= group.join_deadline
            ):
                self._join_deadline_passed(group, now)
            elif group.sync_deadline is not None and now >= group.sync_deadline:
                self._sync_deadline_passed(group)
            self._forget_if_unused(group)
            if self._groups.get(group.group_id) is group:
                upcoming.extend(group.pending.values())
                upcoming.extend(m.deadline for m in group.members.values())
                upcoming.extend(d for d in (group.join_deadline, group.sync_deadline) if d is not None)
        return min(upcoming, default=None)

    def _join_deadline_passed(self, group: _Group, now: float) -> None:
        if group.initial and group.new_member_added and group.initial_remaining > 0:
            # Kafka's InitialDelayedJoin: someone new came during the delay; wait once more.
            delay = min(self._initial_delay, group.initial_remaining)
            group.initial_remaining = max(group.initial_remaining - group.initial_delay, 0.0)
            group.initial_delay = delay
            group.new_member_added = False
            group.join_deadline = now + delay
        else:
            self._complete_join(group)

    def _sync_deadline_passed(self, group: _Group) -> None:
        group.sync_deadline = None
        if group.state not in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE) or not group.pending_sync:
            return
        for member_id in list(group.pending_sync):
            log.info("member did not sync group=%r member=%r", group.group_id, member_id)
            member = group.members[member_id]
            _answer_joins(member, JoinResult(UNKNOWN_MEMBER_ID))
            group.remove(member_id)
        self._prepare(group, "members did not sync in time")

    def groups(self) -> list[GroupInfo]:
        """A snapshot of every group, for metrics and status."""
        return [
            GroupInfo(
                g.group_id, g.state, g.generation, g.protocol_type, g.protocol_name, g.leader, len(g.members)
            )
            for g in self._groups.values()
        ]

    def unload(self, group_id: str) -> None:
        """Forget a group another node coordinates now (the nodes of a shared cluster changed):
        its waiting JoinGroup and SyncGroup calls are answered NOT_COORDINATOR (16), so its
        members look for the new coordinator at once, as Kafka's coordinator answers them when
        it resigns a group."""
        group = self._groups.pop(group_id, None)
        if group is None:
            return
        for member in group.members.values():
            _answer_joins(member, JoinResult(NOT_COORDINATOR, member_id=member.member_id))
            _answer_syncs(member, SyncResult(NOT_COORDINATOR))
        group.state = GroupState.DEAD

    def close(self) -> None:
        """Answer every waiting JoinGroup and SyncGroup with COORDINATOR_NOT_AVAILABLE (15), so
        clients look for the coordinator again; later calls get 15 too."""
        self._closed = True
        for group in self._groups.values():
            for member in group.members.values():
                _answer_joins(member, JoinResult(COORDINATOR_NOT_AVAILABLE, member_id=member.member_id))
                _answer_syncs(member, SyncResult(COORDINATOR_NOT_AVAILABLE))
            group.state = GroupState.DEAD
        self._groups.clear()

    # --- helpers ---------------------------------------------------------------------------

    def _check_group_id(self, group_id: str) -> int:
        if self._closed:
            return COORDINATOR_NOT_AVAILABLE
        if not group_id or len(group_id) > MAX_GROUP_ID:
            return INVALID_GROUP_ID
        return NONE

    def _touch(self, member: _Member) -> None:
        member.deadline = self._clock() + member.session_timeout

    def _remove(self, group: _Group, member: _Member, reason: str) -> None:
        """Kafka's removeMemberAndUpdateGroup: its waiting calls are answered 25 (so a client
        still there joins again as new), and the group rebalances or completes its rebalance."""
        _answer_joins(member, JoinResult(UNKNOWN_MEMBER_ID))
        _answer_syncs(member, SyncResult(UNKNOWN_MEMBER_ID))
        group.remove(member.member_id)
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare(group, reason)
        elif group.state is GroupState.PREPARING_REBALANCE:
            self._try_complete_join(group)

    def _forget_if_unused(self, group: _Group) -> None:
        # With no member and no id handed out, nobody can wait on the group: it may go.
        if not group.members and not group.pending and self._groups.get(group.group_id) is group:
            del self._groups[group.group_id]
            group.state = GroupState.DEAD
