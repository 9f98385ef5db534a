"""The classic group coordinator (``capella.kafka.groups``): Kafka's rebalance rules, driven by hand.

Time is a hand-moved clock and ``expire()`` is called by the test, as the listener calls it; the
only waiting is for the event loop to run the parked calls (``turn``). Each test plays what real
clients do: kafka-python's follower that rejoins after every SyncGroup (design note §3 item 9),
two consumers starting together, a leader leaving, a member timing out, a static member restarting.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator, Sequence
from typing import TypeVar

import pytest
from support.clock import Clock

from capella.kafka.groups import (
    COORDINATOR_NOT_AVAILABLE,
    FENCED_INSTANCE_ID,
    GROUP_MAX_SIZE_REACHED,
    ILLEGAL_GENERATION,
    INCONSISTENT_GROUP_PROTOCOL,
    INVALID_GROUP_ID,
    INVALID_SESSION_TIMEOUT,
    MEMBER_ID_REQUIRED,
    NONE,
    NOT_COORDINATOR,
    REBALANCE_IN_PROGRESS,
    UNKNOWN_MEMBER_ID,
    Coordinator,
    GroupState,
    JoinResult,
    SyncResult,
)

RANGE = (("range", b"range-metadata"),)
BOTH = (("range", b"range-metadata"), ("roundrobin", b"rr-metadata"))
DELAY = 0.3  # the initial rebalance delay these coordinators use
START = 1_700_000_000.0  # where the hand clock starts (support/clock.py)
T = TypeVar("T")


@pytest.fixture
def coordinator(clock: Clock) -> Iterator[Coordinator]:
    coordinator = Coordinator(clock=clock, initial_delay=DELAY)
    yield coordinator
    coordinator.close()  # answers whatever a test left waiting


def joining(
    coordinator: Coordinator,
    member: str = "",
    *,
    group: str = "g",
    instance: str | None = None,
    protocols: Sequence[tuple[str, bytes]] = RANGE,
    protocol_type: str = "consumer",
    session: float = 10.0,
    rebalance: float = 30.0,
    require_member_id: bool = False,
) -> asyncio.Task[JoinResult]:
    return asyncio.create_task(
        coordinator.join(
            group,
            member,
            instance_id=instance,
            client_id="client",
            client_host="/127.0.0.1",
            protocol_type=protocol_type,
            protocols=list(protocols),
            session_timeout=session,
            rebalance_timeout=rebalance,
            require_member_id=require_member_id,
        )
    )


def syncing(
    coordinator: Coordinator,
    joined: JoinResult,
    assignments: dict[str, bytes] | None = None,
    *,
    group: str = "g",
    instance: str | None = None,
    generation: int | None = None,
) -> asyncio.Task[SyncResult]:
    return asyncio.create_task(
        coordinator.sync(
            group,
            joined.member_id,
            joined.generation if generation is None else generation,
            instance_id=instance,
            protocol_type=None,
            protocol_name=None,
            assignments=assignments or {},
        )
    )


async def turn() -> None:
    """Let the parked calls run (no time passes)."""
    for _ in range(3):
        await asyncio.sleep(0)


async def answer(task: asyncio.Task[T]) -> T:
    await turn()
    assert task.done(), "the call should have been answered by now"
    return task.result()


async def settle(
    coordinator: Coordinator, clock: Clock, *tasks: asyncio.Task[JoinResult]
) -> list[JoinResult]:
    """Move the clock past the initial delay, a step at a time, until every join is answered."""
    for _ in range(20):
        await turn()
        if all(t.done() for t in tasks):
            return [t.result() for t in tasks]
        clock.now += DELAY
        coordinator.expire()
    raise AssertionError("a JoinGroup was never answered")


async def stable(
    coordinator: Coordinator, clock: Clock, count: int, *, group: str = "g", protocols=RANGE
) -> list[JoinResult]:
    """``count`` members start together; the leader assigns each its own id; all sync. Leader first."""
    joins = await settle(
        coordinator, clock, *(joining(coordinator, group=group, protocols=protocols) for _ in range(count))
    )
    leader = next(j for j in joins if j.member_id == j.leader)
    followers = [j for j in joins if j is not leader]
    waiting = [syncing(coordinator, f, group=group) for f in followers]
    await turn()
    assert not any(w.done() for w in waiting), "followers wait for the leader's SyncGroup"
    mine = await answer(
        syncing(coordinator, leader, {j.member_id: j.member_id.encode() for j in joins}, group=group)
    )
    assert mine.assignment == leader.member_id.encode()
    for f, w in zip(followers, waiting, strict=True):
        assert (await answer(w)).assignment == f.member_id.encode()
    return [leader, *followers]


def state(coordinator: Coordinator, group: str = "g") -> GroupState:
    return next(g.state for g in coordinator.groups() if g.group_id == group)


# --- joining ------------------------------------------------------------------------------


async def test_a_first_member_waits_the_initial_delay_then_leads_generation_one(
    coordinator: Coordinator, clock: Clock
) -> None:
    task = joining(coordinator)
    await turn()
    assert not task.done()
    assert state(coordinator) is GroupState.PREPARING_REBALANCE
    clock.now += DELAY - 0.01
    coordinator.expire()
    await turn()
    assert not task.done(), "answered before the initial delay passed"
    clock.now += 0.02
    coordinator.expire()
    joined = await answer(task)
    assert (joined.error, joined.generation, joined.leader) == (NONE, 1, joined.member_id)
    assert (joined.protocol_type, joined.protocol_name) == ("consumer", "range")
    assert joined.members == ((joined.member_id, None, b"range-metadata"),)
    client, _, rest = joined.member_id.partition("-")
    assert client == "client" and uuid.UUID(rest)
    assert state(coordinator) is GroupState.COMPLETING_REBALANCE


async def test_two_members_starting_together_land_in_one_generation(
    coordinator: Coordinator, clock: Clock
) -> None:
    first = joining(coordinator)
    await turn()
    clock.now += DELAY / 2
    second = joining(coordinator)  # a new member during the delay extends it, as in Kafka
    a, b = await settle(coordinator, clock, first, second)
    assert a.generation == b.generation == 1
    assert a.leader == b.leader == a.member_id, "the first member leads"
    assert {m[0] for m in a.members} == {a.member_id, b.member_id} and b.members == ()


async def test_the_initial_delay_ends_at_the_rebalance_timeout_however_many_keep_coming(
    coordinator: Coordinator, clock: Clock
) -> None:
    tasks = [joining(coordinator, rebalance=1.0)]
    for _ in range(10):  # a new member every delay: Kafka stops waiting at the rebalance timeout
        await turn()
        if tasks[0].done():
            break
        tasks.append(joining(coordinator, rebalance=1.0))
        await turn()
        clock.now += DELAY
        coordinator.expire()
    assert tasks[0].done() and 1.0 <= clock.now - START <= 1.0 + DELAY
    assert all(t.done() for t in tasks), "everyone who came during the delay is in"
    assert {t.result().generation for t in tasks} == {1}
    assert len(tasks[0].result().members) == len(tasks) > 3


async def test_three_members_on_three_partitions_get_disjoint_assignments(
    coordinator: Coordinator, clock: Clock
) -> None:
    joins = await settle(coordinator, clock, *(joining(coordinator) for _ in range(3)))
    leader = next(j for j in joins if j.member_id == j.leader)
    assert len(leader.members) == 3 and all(meta == b"range-metadata" for _, _, meta in leader.members)
    # The leader (a client) computes the assignment; the coordinator relays the bytes.
    plan = {member_id: bytes([p]) for p, (member_id, _, _) in enumerate(sorted(leader.members))}
    syncs = [syncing(coordinator, j, plan if j is leader else None) for j in joins]
    got = [(await answer(s)).assignment for s in syncs]
    assert sorted(got) == [b"\x00", b"\x01", b"\x02"]
    assert all(plan[j.member_id] == a for j, a in zip(joins, got, strict=True))
    assert state(coordinator) is GroupState.STABLE


async def test_the_protocol_is_the_one_most_members_prefer_among_those_all_support(
    coordinator: Coordinator, clock: Clock
) -> None:
    tasks = [
        joining(coordinator, protocols=BOTH),
        joining(coordinator, protocols=(BOTH[1], BOTH[0])),
        joining(coordinator, protocols=(BOTH[1], BOTH[0], ("sticky", b"s"))),
    ]
    joins = await settle(coordinator, clock, *tasks)
    assert {j.protocol_name for j in joins} == {"roundrobin"}
    leader = next(j for j in joins if j.members)
    assert {meta for _, _, meta in leader.members} == {b"rr-metadata"}, "the chosen protocol's metadata"


async def test_a_member_that_shares_no_protocol_or_type_with_the_group_is_refused(
    coordinator: Coordinator, clock: Clock
) -> None:
    await stable(coordinator, clock, 1)
    assert (
        await answer(joining(coordinator, protocols=(("sticky", b""),)))
    ).error == INCONSISTENT_GROUP_PROTOCOL
    assert (await answer(joining(coordinator, protocol_type="connect"))).error == INCONSISTENT_GROUP_PROTOCOL
    assert (await answer(joining(coordinator, protocols=()))).error == INCONSISTENT_GROUP_PROTOCOL
    assert state(coordinator) is GroupState.STABLE, "a refused join starts no rebalance"
    # A refused first join leaves no group behind.
    assert (
        await answer(joining(coordinator, group="other", protocol_type=""))
    ).error == INCONSISTENT_GROUP_PROTOCOL
    assert [g.group_id for g in coordinator.groups()] == ["g"]


async def test_a_new_member_asked_for_its_id_first_joins_when_it_comes_back(
    coordinator: Coordinator, clock: Clock
) -> None:
    first = await answer(joining(coordinator, require_member_id=True))
    assert first.error == MEMBER_ID_REQUIRED and first.member_id.startswith("client-")
    (joined,) = await settle(
        coordinator, clock, joining(coordinator, first.member_id, require_member_id=True)
    )
    assert (joined.error, joined.member_id, joined.generation) == (NONE, first.member_id, 1)


async def test_an_id_handed_out_with_member_id_required_expires_when_nobody_comes_back(
    coordinator: Coordinator, clock: Clock
) -> None:
    leader, follower = await stable(coordinator, clock, 2)
    handed = await answer(joining(coordinator, require_member_id=True, session=5.0))
    assert handed.error == MEMBER_ID_REQUIRED
    rejoin = joining(coordinator, leader.member_id)  # the leader rejoins: a rebalance waits for everyone
    follower_rejoin = joining(coordinator, follower.member_id)
    await turn()
    assert not rejoin.done(), "the id handed out counts as a member on its way"
    clock.now += 5.0
    coordinator.expire()
    a, b = await settle(coordinator, clock, rejoin, follower_rejoin)
    assert a.generation == b.generation == 2 and len(a.members) == 2
    assert (await answer(joining(coordinator, handed.member_id))).error == UNKNOWN_MEMBER_ID


# --- §3 items 9 and 10: rejoining -----------------------------------------------------------


async def test_a_follower_rejoining_with_unchanged_metadata_keeps_the_generation(
    coordinator: Coordinator, clock: Clock
) -> None:
    leader, follower = await stable(coordinator, clock, 2)
    # kafka-python 3.0.12's follower rejoins after each SyncGroup: that must not reset the group.
    for _ in range(20):
        again = await answer(joining(coordinator, follower.member_id))
        assert (again.error, again.generation, again.leader, again.members) == (NONE, 1, leader.member_id, ())
        synced = await answer(syncing(coordinator, again))
        assert (synced.error, synced.assignment) == (NONE, follower.member_id.encode())
        assert coordinator.heartbeat("g", leader.member_id, 1, instance_id=None) == NONE
    assert state(coordinator) is GroupState.STABLE
    assert coordinator.groups()[0].generation == 1


async def test_the_leader_rejoining_starts_a_rebalance_and_stays_leader(
    coordinator: Coordinator, clock: Clock
) -> None:
    leader, follower = await stable(coordinator, clock, 2)
    again = joining(coordinator, leader.member_id)
    await turn()
    assert not again.done() and state(coordinator) is GroupState.PREPARING_REBALANCE
    assert coordinator.heartbeat("g", follower.member_id, 1, instance_id=None) == REBALANCE_IN_PROGRESS
    a, b = await settle(coordinator, clock, again, joining(coordinator, follower.member_id))
    assert a.generation == b.generation == 2
    assert a.leader == b.leader == leader.member_id, "Kafka keeps the old leader when it rejoined"


async def test_a_follower_with_new_metadata_starts_a_rebalance(
    coordinator: Coordinator, clock: Clock
) -> None:
    leader, follower = await stable(coordinator, clock, 2)
    changed = joining(coordinator, follower.member_id, protocols=(("range", b"new topics"),))
    await turn()
    assert not changed.done() and state(coordinator) is GroupState.PREPARING_REBALANCE
    a, b = await settle(coordinator, clock, joining(coordinator, leader.member_id), changed)
    assert a.generation == b.generation == 2
    assert (follower.member_id, None, b"new topics") in a.members


async def test_rejoining_unchanged_while_completing_gets_the_generation_and_the_leader_its_members(
    coordinator: Coordinator, clock: Clock
) -> None:
    leader, follower = await settle(coordinator, clock, joining(coordinator), joining(coordinator))
    assert state(coordinator) is GroupState.COMPLETING_REBALANCE
    # A client that missed its JoinGroup answer asks again: same generation, no rebalance.
    again = await answer(joining(coordinator, follower.member_id))
    assert (again.generation, again.members) == (1, ())
    again = await answer(joining(coordinator, leader.member_id))
    assert again.generation == 1 and len(again.members) == 2
    assert state(coordinator) is GroupState.COMPLETING_REBALANCE


async def test_a_rebalance_completed_inside_the_join_that_triggered_it_answers_that_join(
    coordinator: Coordinator, clock: Clock
) -> None:
    (only,) = await stable(coordinator, clock, 1)
    # The only member (the leader) rejoins: everyone has rejoined at once, inside its own call.
    again = await answer(joining(coordinator, only.member_id))
    assert (again.error, again.generation, again.leader) == (NONE, 2, only.member_id)


async def test_a_second_join_while_the_first_waits_answers_both(
    coordinator: Coordinator, clock: Clock
) -> None:
    leader, follower = await stable(coordinator, clock, 2)
    first = joining(coordinator, leader.member_id)
    await turn()
    second = joining(coordinator, leader.member_id)  # the client retried on another connection
    await turn()
    assert not first.done() and not second.done()
    again = await answer(joining(coordinator, follower.member_id))
    a, b = await answer(first), await answer(second)
    assert a == b and a.generation == again.generation == 2


async def test_a_join_whose_caller_went_away_does_not_stall_the_rebalance(
    coordinator: Coordinator, clock: Clock
) -> None:
    leader, follower = await stable(coordinator, clock, 2)
    gone = joining(coordinator, leader.member_id)
    await turn()
    gone.cancel()  # the listener's connection closed while the call waited
    again = await answer(joining(coordinator, follower.member_id))
    assert again.generation == 2
    with pytest.raises(asyncio.CancelledError):
        await gone


# --- SyncGroup ------------------------------------------------------------------------------


async def test_sync_refuses_stale_generations_unknown_members_and_syncs_during_a_rebalance(
    coordinator: Coordinator, clock: Clock
) -> None:
    leader, follower = await stable(coordinator, clock, 2)
    assert (await answer(syncing(coordinator, follower, generation=0))).error == ILLEGAL_GENERATION
    assert (
        await answer(syncing(coordinator, JoinResult(NONE, 1, member_id="nobody")))
    ).error == UNKNOWN_MEMBER_ID
    assert (await answer(syncing(coordinator, follower, group="nope"))).error == UNKNOWN_MEMBER_ID
    wrong = coordinator.sync(
        "g",
        follower.member_id,
        1,
        instance_id=None,
        protocol_type="consumer",
        protocol_name="sticky",
        assignments={},
    )
    assert (await wrong).error == INCONSISTENT_GROUP_PROTOCOL
    rejoin = joining(coordinator, leader.member_id)
    await turn()
    assert (await answer(syncing(coordinator, follower))).error == REBALANCE_IN_PROGRESS
    rejoin.cancel()


async def test_a_follower_waiting_in_sync_when_a_rebalance_starts_is_answered_rebalance_in_progress(
    coordinator: Coordinator, clock: Clock
) -> None:
    leader, follower = await settle(coordinator, clock, joining(coordinator), joining(coordinator))
    waiting = syncing(coordinator, follower)
    await turn()
    assert not waiting.done()
    newcomer = joining(coordinator)  # a third consumer starts before the leader synced
    assert (await answer(waiting)).error == REBALANCE_IN_PROGRESS
    joins = await settle(
        coordinator,
        clock,
        newcomer,
        joining(coordinator, leader.member_id),
        joining(coordinator, follower.member_id),
    )
    assert {j.generation for j in joins} == {2}


async def test_members_the_leader_leaves_out_get_an_empty_assignment(
    coordinator: Coordinator, clock: Clock
) -> None:
    leader, follower = await settle(coordinator, clock, joining(coordinator), joining(coordinator))
    waiting = syncing(coordinator, follower)
    mine = await answer(syncing(coordinator, leader, {leader.member_id: b"all", "made-up": b"x"}))
    assert (mine.assignment, (await answer(waiting)).assignment) == (b"all", b"")


async def test_a_member_that_never_syncs_is_removed_after_the_rebalance_timeout(
    coordinator: Coordinator, clock: Clock
) -> None:
    leader, follower = await settle(
        coordinator, clock, joining(coordinator, rebalance=5.0), joining(coordinator, rebalance=5.0)
    )
    await answer(syncing(coordinator, leader, {leader.member_id: b"a", follower.member_id: b"b"}))
    answered = clock.now
    for _ in range(10):  # the leader keeps its session; the follower never syncs
        clock.now += 0.5
        assert coordinator.heartbeat("g", leader.member_id, 1, instance_id=None) == NONE
        coordinator.expire()
        if state(coordinator) is not GroupState.STABLE:
            break
    assert state(coordinator) is GroupState.PREPARING_REBALANCE
    assert 5.0 <= clock.now - answered <= 5.5
    (again,) = await settle(coordinator, clock, joining(coordinator, leader.member_id))
    assert again.generation == 2 and [m[0] for m in again.members] == [leader.member_id]


# --- Heartbeat and sessions -----------------------------------------------------------------


async def test_heartbeat_answers_rebalance_in_progress_only_while_preparing(
    coordinator: Coordinator, clock: Clock
) -> None:
    leader, follower = await settle(coordinator, clock, joining(coordinator), joining(coordinator))
    assert coordinator.heartbeat("g", follower.member_id, 1, instance_id=None) == NONE  # CompletingRebalance
    await answer(syncing(coordinator, leader))
    assert coordinator.heartbeat("g", follower.member_id, 1, instance_id=None) == NONE  # Stable
    assert coordinator.heartbeat("g", follower.member_id, 0, instance_id=None) == ILLEGAL_GENERATION
    assert coordinator.heartbeat("g", "nobody", 1, instance_id=None) == UNKNOWN_MEMBER_ID
    assert coordinator.heartbeat("nope", follower.member_id, 1, instance_id=None) == UNKNOWN_MEMBER_ID
    rejoin = joining(coordinator, leader.member_id)
    await turn()
    assert coordinator.heartbeat("g", follower.member_id, 1, instance_id=None) == REBALANCE_IN_PROGRESS
    rejoin.cancel()


async def test_heartbeats_keep_a_member_and_a_silent_one_times_out_into_a_rebalance(
    coordinator: Coordinator, clock: Clock
) -> None:
    leader, follower = await stable(coordinator, clock, 2)
    for _ in range(10):  # 60 s of heartbeats, each within the 10 s session
        clock.now += 6.0
        assert coordinator.heartbeat("g", leader.member_id, 1, instance_id=None) == NONE
        assert coordinator.expire() is not None
        if state(coordinator) is not GroupState.STABLE:
            break
    # The follower stopped after the first 10 s; the leader is still there.
    assert state(coordinator) is GroupState.PREPARING_REBALANCE
    assert coordinator.groups()[0].members == 1
    assert coordinator.heartbeat("g", follower.member_id, 1, instance_id=None) == UNKNOWN_MEMBER_ID
    assert coordinator.heartbeat("g", leader.member_id, 1, instance_id=None) == REBALANCE_IN_PROGRESS
    (again,) = await settle(coordinator, clock, joining(coordinator, leader.member_id))
    assert again.generation == 2 and [m[0] for m in again.members] == [leader.member_id]


async def test_a_member_that_does_not_rejoin_is_dropped_at_the_rebalance_timeout(
    coordinator: Coordinator, clock: Clock
) -> None:
    leader, follower = await stable(coordinator, clock, 2)
    rejoin = joining(coordinator, leader.member_id)
    await turn()
    for _ in range(29):  # the follower heartbeats (so its session lives) but never rejoins
        clock.now += 1.0
        assert coordinator.heartbeat("g", follower.member_id, 1, instance_id=None) == REBALANCE_IN_PROGRESS
        coordinator.expire()
        await turn()
        assert not rejoin.done()
    clock.now += 1.5
    coordinator.expire()
    again = await answer(rejoin)
    assert again.generation == 2 and [m[0] for m in again.members] == [leader.member_id]
    assert coordinator.heartbeat("g", follower.member_id, 2, instance_id=None) == UNKNOWN_MEMBER_ID


async def test_expire_answers_the_next_deadline(coordinator: Coordinator, clock: Clock) -> None:
    assert coordinator.expire() is None
    joining(coordinator)
    await turn()
    assert coordinator.expire() == clock.now + DELAY


# --- LeaveGroup -----------------------------------------------------------------------------


async def test_the_leader_leaving_hands_the_group_to_the_follower(
    coordinator: Coordinator, clock: Clock
) -> None:
    leader, follower = await stable(coordinator, clock, 2)
    assert coordinator.leave("g", [(leader.member_id, None)]) == [NONE]
    assert state(coordinator) is GroupState.PREPARING_REBALANCE
    assert coordinator.heartbeat("g", follower.member_id, 1, instance_id=None) == REBALANCE_IN_PROGRESS
    again = await answer(joining(coordinator, follower.member_id))  # everyone left has rejoined: at once
    assert (again.generation, again.leader) == (2, follower.member_id)
    await answer(syncing(coordinator, again, {follower.member_id: b"all three"}))
    assert coordinator.leave("g", [(follower.member_id, None)]) == [NONE]
    assert coordinator.groups() == [], "an empty group is forgotten"


async def test_leave_answers_per_member(coordinator: Coordinator, clock: Clock) -> None:
    (static,) = await settle(coordinator, clock, joining(coordinator, instance="i-1"))
    await answer(syncing(coordinator, static, instance="i-1"))
    other, _ = await settle(
        coordinator, clock, joining(coordinator), joining(coordinator, static.member_id, instance="i-1")
    )
    errors = coordinator.leave("g", [("nobody", None), ("", "i-9"), ("", "i-1"), (other.member_id, None)])
    assert errors == [UNKNOWN_MEMBER_ID, UNKNOWN_MEMBER_ID, NONE, NONE]
    assert coordinator.leave("gone", [("x", None)]) == [UNKNOWN_MEMBER_ID]
    assert coordinator.leave("", [("x", None)]) == [INVALID_GROUP_ID]


async def test_a_member_leaving_answers_its_own_waiting_join(coordinator: Coordinator, clock: Clock) -> None:
    _, follower = await stable(coordinator, clock, 2)
    waiting = joining(coordinator, follower.member_id, protocols=(("range", b"changed"),))
    await turn()
    assert coordinator.leave("g", [(follower.member_id, None)]) == [NONE]
    assert (await answer(waiting)).error == UNKNOWN_MEMBER_ID


# --- static membership ----------------------------------------------------------------------


async def test_a_static_member_restarting_takes_over_its_id_without_a_rebalance(
    coordinator: Coordinator, clock: Clock
) -> None:
    a, b = await settle(
        coordinator, clock, joining(coordinator, instance="i-a"), joining(coordinator, instance="i-b")
    )
    assert a.member_id.startswith("i-a-") and a.leader == a.member_id
    await answer(syncing(coordinator, a, {a.member_id: b"p0", b.member_id: b"p1"}, instance="i-a"))
    assert (await answer(syncing(coordinator, b, instance="i-b"))).assignment == b"p1"
    # b restarts: no member id, same instance id and protocols.
    back = await answer(joining(coordinator, instance="i-b"))
    assert back.error == NONE and back.member_id != b.member_id and back.generation == 1
    assert state(coordinator) is GroupState.STABLE
    assert (await answer(syncing(coordinator, back, instance="i-b"))).assignment == b"p1"
    assert coordinator.heartbeat("g", b.member_id, 1, instance_id="i-b") == FENCED_INSTANCE_ID
    assert coordinator.heartbeat("g", back.member_id, 1, instance_id="i-b") == NONE
    # The leader restarting is told the old leader id, so it does not assign; it gets p0 back.
    leader_back = await answer(joining(coordinator, instance="i-a"))
    assert leader_back.leader == a.member_id != leader_back.member_id and leader_back.members == ()
    assert (await answer(syncing(coordinator, leader_back, instance="i-a"))).assignment == b"p0"
    assert coordinator.groups()[0].generation == 1


async def test_a_static_member_back_with_another_favourite_protocol_rebalances(
    coordinator: Coordinator, clock: Clock
) -> None:
    (a,) = await settle(coordinator, clock, joining(coordinator, instance="i-a", protocols=BOTH))
    await answer(syncing(coordinator, a, {a.member_id: b"p"}, instance="i-a"))
    # Alone in the group, it has rejoined: the rebalance completes inside its own call.
    back = await answer(joining(coordinator, instance="i-a", protocols=(BOTH[1], BOTH[0])))
    assert (back.generation, back.protocol_name, back.leader) == (2, "roundrobin", back.member_id)
    assert (await answer(joining(coordinator, a.member_id, instance="i-a"))).error == FENCED_INSTANCE_ID
    assert (await answer(syncing(coordinator, a, generation=2, instance="i-a"))).error == FENCED_INSTANCE_ID


async def test_a_static_member_back_during_the_sync_fences_its_old_call_and_rebalances(
    coordinator: Coordinator, clock: Clock
) -> None:
    a, b = await settle(
        coordinator, clock, joining(coordinator, instance="i-a"), joining(coordinator, instance="i-b")
    )
    old_sync = syncing(coordinator, b, instance="i-b")
    await turn()
    back = joining(coordinator, instance="i-b")
    assert (await answer(old_sync)).error == FENCED_INSTANCE_ID
    assert state(coordinator) is GroupState.PREPARING_REBALANCE
    a2, b2 = await settle(coordinator, clock, joining(coordinator, a.member_id, instance="i-a"), back)
    assert a2.generation == b2.generation == 2 and b2.member_id not in (a.member_id, b.member_id)


# --- bounds ---------------------------------------------------------------------------------


async def test_group_ids_must_be_present_and_short(coordinator: Coordinator) -> None:
    assert (await answer(joining(coordinator, group=""))).error == INVALID_GROUP_ID
    assert (await answer(joining(coordinator, group="g" * 256))).error == INVALID_GROUP_ID
    assert coordinator.heartbeat("", "m", 1, instance_id=None) == INVALID_GROUP_ID
    assert (
        await answer(syncing(coordinator, JoinResult(NONE, 1, member_id="m"), group="g" * 256))
    ).error == (INVALID_GROUP_ID)


async def test_session_timeouts_outside_the_bounds_are_refused(coordinator: Coordinator) -> None:
    assert (await answer(joining(coordinator, session=0.5))).error == INVALID_SESSION_TIMEOUT
    assert (await answer(joining(coordinator, session=3600.0))).error == INVALID_SESSION_TIMEOUT
    assert coordinator.groups() == []


async def test_a_stranger_cannot_fill_memory_with_groups_or_members(clock: Clock) -> None:
    coordinator = Coordinator(clock=clock, initial_delay=DELAY, max_groups=2, max_members=2)
    first = [joining(coordinator, group=name) for name in ("a", "b")]
    assert (await answer(joining(coordinator, group="c"))).error == COORDINATOR_NOT_AVAILABLE
    more = [joining(coordinator, group="a") for _ in range(2)]
    await turn()
    assert more[1].done() and more[1].result().error == GROUP_MAX_SIZE_REACHED
    asked = await answer(joining(coordinator, group="b", require_member_id=True))
    assert asked.error == MEMBER_ID_REQUIRED  # an id handed out counts against the bound
    assert (
        await answer(joining(coordinator, group="b", require_member_id=True))
    ).error == GROUP_MAX_SIZE_REACHED
    joins = await settle(coordinator, clock, *first, more[0])
    assert all(j.error == NONE for j in joins)
    assert sorted((g.group_id, g.members) for g in coordinator.groups()) == [("a", 2), ("b", 1)]


# --- OffsetCommit's check -------------------------------------------------------------------


async def test_commits_follow_kafkas_rules(coordinator: Coordinator, clock: Clock) -> None:
    assert coordinator.check_commit("solo", "", -1) == NONE, "a consumer without a group"
    assert coordinator.check_commit("solo", "", 3) == ILLEGAL_GENERATION
    assert coordinator.check_commit("solo", "m", 3) == UNKNOWN_MEMBER_ID
    leader, follower = await settle(coordinator, clock, joining(coordinator), joining(coordinator))
    assert coordinator.check_commit("g", leader.member_id, 1) == REBALANCE_IN_PROGRESS  # CompletingRebalance
    await answer(syncing(coordinator, leader))
    assert coordinator.check_commit("g", leader.member_id, 1) == NONE
    assert coordinator.check_commit("g", leader.member_id, 0) == ILLEGAL_GENERATION
    assert coordinator.check_commit("g", "nobody", 1) == UNKNOWN_MEMBER_ID
    assert coordinator.check_commit("g", "", -1) == UNKNOWN_MEMBER_ID, "the group has members"
    rejoin = joining(coordinator, leader.member_id)
    await turn()
    assert coordinator.check_commit("g", follower.member_id, 1) == NONE, "allowed while preparing"
    rejoin.cancel()
    assert coordinator.check_commit("g" * 256, "", -1) == INVALID_GROUP_ID


# --- closing --------------------------------------------------------------------------------


async def test_close_answers_every_waiting_call(coordinator: Coordinator, clock: Clock) -> None:
    leader, follower = await settle(coordinator, clock, joining(coordinator), joining(coordinator))
    waiting_sync = syncing(coordinator, follower)
    waiting_join = joining(coordinator, group="other")
    await turn()
    assert not waiting_sync.done() and not waiting_join.done()
    coordinator.close()
    assert (await answer(waiting_sync)).error == COORDINATOR_NOT_AVAILABLE
    assert (await answer(waiting_join)).error == COORDINATOR_NOT_AVAILABLE
    assert (await answer(joining(coordinator))).error == COORDINATOR_NOT_AVAILABLE
    assert coordinator.heartbeat("g", leader.member_id, 1, instance_id=None) == COORDINATOR_NOT_AVAILABLE
    assert coordinator.groups() == []


async def test_a_group_unloaded_answers_its_waiting_calls_not_coordinator_and_others_stay(
    coordinator: Coordinator, clock: Clock
) -> None:
    # A shared cluster's node that is no longer the group's coordinator: its members must look
    # for the new one at once, not wait out a rebalance here.
    kept = await settle(coordinator, clock, joining(coordinator, group="kept"))
    leader, follower = await settle(coordinator, clock, joining(coordinator), joining(coordinator))
    waiting_sync = syncing(coordinator, follower)
    waiting_join = joining(coordinator, group="moving")
    await turn()
    assert not waiting_sync.done() and not waiting_join.done()
    coordinator.unload("g")
    coordinator.unload("moving")
    coordinator.unload("never-here")
    assert (await answer(waiting_sync)).error == NOT_COORDINATOR
    assert (await answer(waiting_join)).error == NOT_COORDINATOR
    assert [g.group_id for g in coordinator.groups()] == ["kept"]
    # Should the group come back here, its old members are strangers.
    assert coordinator.heartbeat("g", leader.member_id, 1, instance_id=None) == UNKNOWN_MEMBER_ID
    assert coordinator.heartbeat("kept", kept[0].member_id, 1, instance_id=None) == NONE


async def test_without_an_initial_delay_the_first_join_completes_inside_its_own_call(clock: Clock) -> None:
    # The design note's §3 item 10: the first single-member group crashed a coordinator that kept
    # the pending answer in the member record.
    coordinator = Coordinator(clock=clock, initial_delay=0.0)
    joined = await answer(joining(coordinator))
    assert (joined.error, joined.generation, joined.leader) == (NONE, 1, joined.member_id)
    coordinator.close()


async def test_a_leader_that_rejoined_stays_leader_wherever_it_stands_among_the_members(
    coordinator: Coordinator, clock: Clock
) -> None:
    a, b = await settle(coordinator, clock, joining(coordinator, instance="i-a"), joining(coordinator))
    await answer(syncing(coordinator, a, instance="i-a"))
    await answer(syncing(coordinator, b))
    restarted = await answer(joining(coordinator, instance="i-a"))  # now after b among the members
    assert restarted.leader == a.member_id and restarted.generation == 1
    await answer(syncing(coordinator, restarted, instance="i-a"))
    first = joining(coordinator, restarted.member_id, instance="i-a")  # the leader rejoins: a rebalance
    await turn()
    a2, b2 = await settle(coordinator, clock, first, joining(coordinator, b.member_id))
    assert a2.generation == 2 and a2.leader == b2.leader == restarted.member_id


async def test_a_static_member_that_does_not_rejoin_stays_and_the_leader_moves_to_one_that_did(
    coordinator: Coordinator, clock: Clock
) -> None:
    a, b = await stable_pair(coordinator, clock)
    changed = joining(coordinator, b.member_id, instance="i-b", protocols=(("range", b"more topics"),))
    for _ in range(40):  # a heartbeats (its session lives) but does not rejoin
        await turn()
        if changed.done():
            break
        clock.now += 1.0
        coordinator.heartbeat("g", a.member_id, 1, instance_id="i-a")
        coordinator.expire()
    b2 = changed.result()
    assert b2.generation == 2 and b2.leader == b.member_id
    assert {m[0] for m in b2.members} == {a.member_id, b.member_id}, "Kafka keeps a static member"
    assert coordinator.heartbeat("g", a.member_id, 1, instance_id="i-a") == ILLEGAL_GENERATION


async def stable_pair(coordinator: Coordinator, clock: Clock) -> list[JoinResult]:
    a, b = await settle(
        coordinator, clock, joining(coordinator, instance="i-a"), joining(coordinator, instance="i-b")
    )
    await answer(syncing(coordinator, a, {a.member_id: b"p0", b.member_id: b"p1"}, instance="i-a"))
    await answer(syncing(coordinator, b, instance="i-b"))
    return [a, b]
