"""Each action of the original protocol, mapped onto Capella's cluster, supervisor, clusters and users.

An action is checked with the need of the ``/v1`` route that does the same thing, read from the
route table (``same_as``), so this endpoint can never allow what ``/v1`` forbids. ``ACTIONS``
maps each name to its function; docs/compat.md lists them with their ``/v1`` equivalent.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import msgspec

from capella.api.drafts import count_before_decoding
from capella.api.original import shapes
from capella.api.original.envelope import Request
from capella.api.route import MESSAGES_PATH, QUEUE_PATH, REPLICAS_PATH, SUBSCRIPTION_PATH, Need
from capella.auth.rule import Identity
from capella.auth.store import AuthStore
from capella.config import CompatSettings, ServerSettings
from capella.core.cluster import Cluster
from capella.core.message import SaveMode
from capella.errors import AlreadyExists, Conflict, InvalidMessage, InvalidRequest, SubscriptionNotFound
from capella.handlers.supervisor import Supervisor
from capella.links.registry import Links


class IdClock:
    """``get_next_id``: int64 ids that only grow, from the clock as the original's were.

    UNIX nanoseconds floored to 10 µs, or the last id + 1 when the clock has not moved on, so a
    restart (which starts from the clock again) keeps them increasing unless the clock went back.
    Message ids are not from here: they are each queue's own counter (docs/compat.md).
    """

    def __init__(self) -> None:
        self._last = 0

    def next(self, count: int = 1) -> list[int]:
        start = max(time.time_ns() // 10_000 * 10_000, self._last + 1)
        self._last = start + count - 1
        return list(range(start, start + count))


@dataclass(slots=True)
class Context:
    """What an action works on, and who asks."""

    cluster: Cluster
    supervisor: Supervisor
    settings: ServerSettings
    needs: dict[tuple[str, str], tuple[Need, ...] | None]
    ids: IdClock
    identity: Identity
    users: AuthStore | None
    authenticated: bool
    compat: CompatSettings

    @property
    def clusters(self) -> Links:
        return self.supervisor.links

    def same_as(self, method: str, path: str, **names: str) -> None:
        """Check what the ``/v1`` route ``method path`` needs, for the names given."""
        for need in self.needs[(method, path)] or ():
            self.identity.check(
                need.type, need.action, need.name.format_map({**names, "cluster": self.cluster.name})
            )


Action = Callable[[Context, Request], Awaitable[object]]


def body_name(request: Request) -> str:
    """A body that is one JSON string (``drop_q``, ``gd_q``, ``q_subs_get_last``...)."""
    return shapes.decode(request.body, str, request.action)


# --- cluster -------------------------------------------------------------------------------


async def ping(ctx: Context, request: Request) -> object:
    # The original's PING right, on the cluster's name: signed in with no rules is no rights.
    ctx.identity.check(*PERMISSIONS["PING"], ctx.cluster.name)
    return None


async def get_name(ctx: Context, request: Request) -> object:
    return ctx.cluster.name


async def set_name(ctx: Context, request: Request) -> object:
    name = body_name(request)
    if name != ctx.cluster.name:
        # A cluster's name is the source of the identities it mints: it is configured, not renamed.
        raise Conflict(
            f"the cluster is named {ctx.cluster.name!r} by its configuration ([cluster] name); "
            "Capella does not rename a running cluster"
        )
    return None


async def get_next_id(ctx: Context, request: Request) -> object:
    return ctx.ids.next()[0]


async def get_next_ids(ctx: Context, request: Request) -> object:
    count = shapes.decode(request.body, int, request.action)
    if not 0 <= count <= ctx.settings.max_limit:
        raise InvalidRequest(f"get_next_ids: between 0 and {ctx.settings.max_limit} ids at a time")
    return ctx.ids.next(count) if count else []


# --- queues --------------------------------------------------------------------------------


async def add_q(ctx: Context, request: Request) -> object:
    body = shapes.decode(request.body, shapes.QueueDescription, request.action)
    ctx.same_as("PUT", QUEUE_PATH, queue=body.name)
    if body.type != "simple_queue":
        raise InvalidRequest(f"not exists queue type: {body.type}")
    if any(q.name == body.name for q in ctx.cluster.queues()):
        raise AlreadyExists(f"queue with name `{body.name}` already exists")
    mounts = ctx.cluster.mounts
    default = next(iter(mounts)) if "default" not in mounts else "default"
    definition = shapes.queue_definition(body.params, set(mounts), default)
    # Put as /v1 puts a body, which the cluster decodes and checks as it checks any other.
    await ctx.cluster.put_queue(body.name, msgspec.to_builtins(definition))
    return None


async def drop_q(ctx: Context, request: Request) -> object:
    name = body_name(request)
    ctx.same_as("DELETE", QUEUE_PATH, queue=name)
    await ctx.cluster.drop_queue(name)
    return None


async def gd_q(ctx: Context, request: Request) -> object:
    name = body_name(request)
    ctx.same_as("GET", QUEUE_PATH, queue=name)
    return shapes.queue_description(name, ctx.cluster.queue(name).definition)


async def list_q(ctx: Context, request: Request) -> object:
    return [q.name for q in ctx.cluster.queues() if ctx.identity.can("queue", "read", q.name)]


# --- messages ------------------------------------------------------------------------------


async def q_add(ctx: Context, request: Request) -> object:
    ctx.same_as("POST", MESSAGES_PATH, queue=request.object_name)
    queue = ctx.cluster.queue(request.object_name)
    try:
        body = shapes.decode(request.body, shapes.AddOne, request.action)
        save = shapes.save_mode(body.sm)
        done = await queue.append([body.msg.draft()], save)
    except InvalidRequest as exc:
        exc.details["answer"] = 0
        raise
    return done[0].id


async def q_add_list(ctx: Context, request: Request, unique: bool = False) -> object:
    ctx.same_as("POST", MESSAGES_PATH, queue=request.object_name)
    queue = ctx.cluster.queue(request.object_name)
    try:
        # The queue's batch bound, before a body that could blow it is decoded into messages.
        count_before_decoding(request.body, shapes.LISTED, shapes.listed, queue.limits)
        body = shapes.decode(request.body, shapes.AddList, request.action)
        save = shapes.save_mode(body.sm)
        if unique and any(m.eid == 0 for m in body.msgs):
            raise InvalidMessage("externalID should be != 0", field="eid")
        done = await queue.append([m.draft() for m in body.msgs], save) if body.msgs else []
    except InvalidRequest as exc:
        exc.details["answer"] = []
        raise
    return [a.id for a in done]


async def q_add_unique(ctx: Context, request: Request) -> object:
    body = shapes.decode(request.body, shapes.AddOne, request.action)
    if body.msg.eid == 0:
        raise InvalidMessage("externalID should be != 0", field="eid", answer=0)
    return await q_add(ctx, request)


async def q_add_unique_list(ctx: Context, request: Request) -> object:
    return await q_add_list(ctx, request, unique=True)


def _limit(ctx: Context, count: int) -> int:
    return max(1, min(count or ctx.settings.max_limit, ctx.settings.max_limit))


async def q_get(ctx: Context, request: Request) -> object:
    ctx.same_as("GET", MESSAGES_PATH, queue=request.object_name)
    queue = ctx.cluster.queue(request.object_name)
    body = shapes.decode(request.body, shapes.GetAfter, request.action)
    found = await queue.read_after(max(0, body.id_start), _limit(ctx, body.cnt_limit))
    return [shapes.message(m) for m in found.messages] or None


async def q_get_segment(ctx: Context, request: Request) -> object:
    ctx.same_as("GET", MESSAGES_PATH, queue=request.object_name)
    queue = ctx.cluster.queue(request.object_name)
    body = shapes.decode(request.body, shapes.GetSegment, request.action)
    ranges = None if body.segments is None or body.segments.s is None else body.segments.s
    if ranges is not None and not ranges:
        # No segment can match: the original answers where the queue ends.
        return shapes.SegmentPage(None, queue.last_id)
    segments = None if ranges is None else [(r.from_, r.to) for r in ranges]
    found = await queue.read_after(max(0, body.id_start), _limit(ctx, body.cnt_limit), segments)
    return shapes.SegmentPage([shapes.message(m) for m in found.messages] or None, found.last_id)


async def q_save_all(ctx: Context, request: Request) -> object:
    ctx.same_as("POST", MESSAGES_PATH, queue=request.object_name)
    await ctx.cluster.queue(request.object_name).flush()
    return None


# --- subscriptions -------------------------------------------------------------------------


def _sub_path(ctx: Context, method: str, queue: str, name: str) -> None:
    ctx.same_as(method, SUBSCRIPTION_PATH, queue=queue, name=name)


async def q_subs_get_last(ctx: Context, request: Request) -> object:
    name = body_name(request)
    _sub_path(ctx, "GET", request.object_name, name)
    try:
        return ctx.cluster.queue(request.object_name).subscription(name).last_id
    except SubscriptionNotFound:
        return 0  # the original's answer for a cursor never set


async def q_subs_set_last(ctx: Context, request: Request) -> object:
    body = shapes.decode(request.body, shapes.SetLast, request.action)
    _sub_path(ctx, "PUT", request.object_name, body.sbscr)
    queue = ctx.cluster.queue(request.object_name)
    await queue.commit(body.sbscr, body.id, save=shapes.save_mode(body.sm))
    return None


async def _replica(ctx: Context, request: Request, replica: bool) -> object:
    name = body_name(request)
    _sub_path(ctx, "PUT", request.object_name, name)
    await ctx.cluster.queue(request.object_name).commit(name, None, replica=replica, save=SaveMode.DEFAULT)
    return None


async def q_subs_add_r_m(ctx: Context, request: Request) -> object:
    return await _replica(ctx, request, True)


async def q_subs_rm_r_m(ctx: Context, request: Request) -> object:
    return await _replica(ctx, request, False)


async def q_subs_get_r_m_cnt(ctx: Context, request: Request) -> object:
    ctx.same_as("GET", REPLICAS_PATH, queue=request.object_name)
    message_id = shapes.decode(request.body, int, request.action)
    return len(ctx.cluster.queue(request.object_name).replicas(message_id))


# --- permissions ---------------------------------------------------------------------------


class PermCheck(msgspec.Struct):
    object_type: str = ""
    action: str = ""
    object_name: str = ""


# The original's permission actions, as the /v1 need of the same thing (type, action).
# ADD_MESSAGE and GET_MESSAGE are Capella's own: the original's GET_QUEUE let its holder read
# and write messages alike, which Capella splits into queue read and queue write.
PERMISSIONS: dict[str, tuple[str, str]] = {
    "PING": ("cluster", "read"),
    "GET_NAME": ("cluster", "read"),
    "SET_NAME": ("cluster", "admin"),
    "GET_NEXT_ID": ("cluster", "read"),
    "ADD_QUEUE": ("queue", "admin"),
    "DROP_QUEUE": ("queue", "admin"),
    "GET_QUEUE": ("queue", "read"),
    "GET_QUEUE_DESCR": ("queue", "read"),
    "ADD_MESSAGE": ("queue", "write"),
    "GET_MESSAGE": ("queue", "read"),
    "ADD_HANDLER": ("handler", "admin"),
    "DROP_HANDLER": ("handler", "admin"),
    "GET_HANDLER": ("handler", "read"),
    "GET_HANDLER_DESCR": ("handler", "read"),
    "START_HANDLER": ("handler", "write"),
    "ADD_EXT_CLUSTER": ("external_cluster", "admin"),
    "DROP_EXT_CLUSTER": ("external_cluster", "admin"),
    "GET_EXT_CLUSTER": ("external_cluster", "read"),
    "GET_EXT_CLUSTER_DESCR": ("external_cluster", "read"),
    "ADD_USER": ("user", "admin"),
    "DROP_USER": ("user", "admin"),
    "ENABLE_USER": ("user", "admin"),
    "DISABLE_USER": ("user", "admin"),
    "UPDATE_USER": ("user", "admin"),
    "GET_USER": ("user", "read"),
}


async def check_perms(ctx: Context, request: Request) -> object:
    body = shapes.decode(request.body, PermCheck, request.action)
    kind, action = PERMISSIONS.get(body.action, ("", ""))
    if not kind:
        return ctx.identity.admin
    return ctx.identity.can(kind, action, body.object_name)


ACTIONS: dict[str, Action] = {
    "ping": ping,
    "get_name": get_name,
    "set_name": set_name,
    "get_next_id": get_next_id,
    "get_next_ids": get_next_ids,
    "add_q": add_q,
    "drop_q": drop_q,
    "gd_q": gd_q,
    "list_q": list_q,
    "q_add": q_add,
    "q_add_list": q_add_list,
    "q_add_unique": q_add_unique,
    "q_add_unique_list": q_add_unique_list,
    "q_get": q_get,
    "q_get_segment": q_get_segment,
    "q_save_all": q_save_all,
    "q_subs_get_last": q_subs_get_last,
    "q_subs_set_last": q_subs_set_last,
    "q_subs_add_r_m": q_subs_add_r_m,
    "q_subs_rm_r_m": q_subs_rm_r_m,
    "q_subs_get_r_m_cnt": q_subs_get_r_m_cnt,
    "check_perms": check_perms,
}

# Actions whose ``object_name`` is a queue, which may be a path through external clusters.
QUEUE_ACTIONS = frozenset(a for a in ACTIONS if a.startswith("q_"))
