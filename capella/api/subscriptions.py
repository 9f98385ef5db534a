"""Subscriptions: named cursors on a queue, reading after them, replica counts, and the
definition of ack-mode subscriptions (their claims and acks are in ``api/work.py``)."""

from __future__ import annotations

from aiohttp import web
from msgspec import UNSET

from capella.api.access import identity
from capella.api.messages import answer_form, messages_response, read_waiting
from capella.api.openapi import (
    ACCEPT,
    LIMIT,
    MESSAGE_ID,
    MESSAGES_ANSWER,
    SAVE,
    SEGMENTS,
    WAIT,
    answer,
    json_content,
    param,
    ref,
)
from capella.api.request import (
    CLUSTER,
    int_param,
    json_response,
    limit_param,
    present,
    read_struct,
    save_param,
    segments_param,
    wait_param,
)
from capella.api.route import REPLICAS_PATH, SUBSCRIPTION_PATH, Route, on_queue, on_subscription
from capella.core.base_queue import BaseQueue
from capella.core.filter import MessageFilter
from capella.core.message import SaveMode
from capella.core.subscription import ACK, CURSOR, SubscriptionState
from capella.core.work.retry import RetrySettings, apply_policy
from capella.errors import InvalidRequest, SubscriptionNotFound, WrongSubscriptionMode
from capella.wire import work as wire_work


def subscription_info(queue: BaseQueue, sub: SubscriptionState) -> wire_work.Subscription:
    info = wire_work.Subscription(
        name=sub.name,
        mode="ack" if sub.mode == ACK else "cursor",
        last_id=sub.last_id,
        replica=sub.replica,
        lag=max(0, queue.last_id - sub.last_id),
        created=sub.created,
        updated=sub.updated,
    )
    if sub.group is not None:
        info.group = sub.group
    if sub.metadata is not None:
        info.metadata = sub.metadata
    if sub.mode == ACK and sub.policy is not None:
        state = queue.work(sub.name).state
        info.policy = sub.policy.to_wire()
        info.work = wire_work.WorkCounts(
            claimed_through=state.high,
            backlog=max(0, queue.last_id - state.high),
            in_flight=state.count("in_flight"),
            failed=state.count("failed"),
            dead=len(state.dead),
        )
    return info


def _queue(request: web.Request) -> BaseQueue:
    return request.app[CLUSTER].queue(request.match_info["queue"])


async def list_subscriptions(request: web.Request) -> web.Response:
    queue = _queue(request)
    who = identity(request)
    readable = [s for s in queue.subscriptions() if who.can("subscription", "read", f"{queue.name}/{s.name}")]
    return json_response(wire_work.SubscriptionList([subscription_info(queue, s) for s in readable]))


async def commit(request: web.Request) -> web.Response:
    queue = _queue(request)
    save = save_param(request)
    body = await read_struct(request, wire_work.SubscriptionCommit)
    given = present(body)
    name = request.match_info["name"]
    if body.mode == ACK or "policy" in given:
        # Defining a work queue sets its retry policy: more than moving a cursor (the table
        # asks for write); its dead-letter queue receives writes on the definer's behalf.
        who = identity(request)
        who.check("subscription", "admin", f"{queue.name}/{name}")
        if body.policy is not UNSET and isinstance(body.policy.dead_letter, str):
            who.check("queue", "write", body.policy.dead_letter)
        return await _define_work(queue, name, body, given, save)
    if body.mode == CURSOR:
        try:
            if queue.subscription(name).mode != CURSOR:
                raise WrongSubscriptionMode(f"subscription {name!r} is in ack mode; its mode cannot change")
        except SubscriptionNotFound:
            pass
    sub, created = await queue.commit(
        name,
        None if body.last_id is UNSET else body.last_id,
        replica=None if body.replica is UNSET else body.replica,
        reset=False if body.reset is UNSET else body.reset,
        save=save,
    )
    return json_response(subscription_info(queue, sub), 201 if created else 200)


async def _define_work(
    queue: BaseQueue, name: str, body: wire_work.SubscriptionCommit, given: set[str], save: SaveMode
) -> web.Response:
    # null counts as not given, as for a cursor.
    if extra := sorted(f for f in given & {"last_id", "replica", "reset"} if getattr(body, f) is not None):
        raise InvalidRequest(f"{extra[0]}: not for an ack-mode subscription", field=extra[0])
    if body.mode not in (UNSET, ACK):
        raise InvalidRequest("policy: only an ack-mode subscription has one", field="policy")
    try:
        current = queue.subscription(name)
    except SubscriptionNotFound:
        base = RetrySettings()
    else:
        if current.mode != ACK:
            raise WrongSubscriptionMode(f"subscription {name!r} is a cursor; its mode cannot change")
        base = current.policy or RetrySettings()
    policy = base if body.policy is UNSET else apply_policy(body.policy, base)
    sub, created = await queue.define_work(name, policy, save)
    return json_response(subscription_info(queue, sub), 201 if created else 200)


async def get_subscription(request: web.Request) -> web.Response:
    queue = _queue(request)
    return json_response(subscription_info(queue, queue.subscription(request.match_info["name"])))


async def delete_subscription(request: web.Request) -> web.Response:
    await _queue(request).delete_subscription(request.match_info["name"], save_param(request))
    return web.Response(status=204)


async def read(request: web.Request) -> web.StreamResponse:
    """Read after the cursor; ``commit=auto`` (default) moves it to the answer's ``last_id``.

    With ``commit=auto`` a missing subscription is created; with ``commit=none`` a missing
    subscription reads from the start and is not created.
    """
    queue = _queue(request)
    name = request.match_info["name"]
    form = answer_form(request)
    mode = commit_mode(request)
    if mode not in ("auto", "none"):
        raise InvalidRequest(f"commit: expected auto or none, got {mode!r}", parameter="commit")
    if mode == "auto":
        # Reading with commit=auto moves the cursor: that is a write (the table asks for read).
        identity(request).check("subscription", "write", f"{queue.name}/{name}")
    limit = limit_param(request)
    segments = segments_param(request)
    wait = wait_param(request)
    save = save_param(request)
    try:
        sub: SubscriptionState | None = await queue.current_subscription(name)
    except SubscriptionNotFound:
        sub = None
    if sub is not None and sub.mode == ACK:
        raise WrongSubscriptionMode(f"subscription {name!r} is in ack mode: claim its messages instead")
    after = sub.last_id if sub is not None else 0
    match = MessageFilter(segments=None if segments is None else tuple(segments))
    page = await read_waiting(request.app, queue, after, limit, match, wait, form)
    if mode == "auto" and (sub is None or page.last_id > after):
        await queue.commit(name, page.last_id, save=save)
    return await messages_response(request, page, form)


def commit_mode(request: web.Request) -> str:
    """The read's ``commit`` parameter, ``auto`` when not given (not checked)."""
    return request.query.get("commit", "auto").strip().lower() or "auto"


def commits(request: web.Request) -> bool:
    """Whether a read moves its cursor (a write, refused from another site's page); a
    ``commit`` that is not ``none`` counts, even one the read refuses."""
    return commit_mode(request) != "none"


async def replicas(request: web.Request) -> web.Response:
    queue = _queue(request)
    if "id" not in request.query:
        raise InvalidRequest("id: a message id is required", parameter="id")
    message_id = int_param(request, "id", 0, low=0)
    names = queue.replicas(message_id)
    return json_response({"id": message_id, "count": len(names), "subscriptions": names})


ROUTES = [
    Route(
        "GET",
        "/v1/queues/{queue}/subscriptions",
        list_subscriptions,
        need=(on_queue("read"),),
        op="listSubscriptions",
        summary="List a queue's subscriptions",
        tag="subscriptions",
        answers={200: answer("Subscriptions", ref("SubscriptionList"))},
        fails=(404,),
    ),
    Route(
        "PUT",
        SUBSCRIPTION_PATH,
        commit,
        need=(on_subscription("write"),),
        op="commitSubscription",
        summary="Create (201) or commit (200); never moves backwards unless reset",
        tag="subscriptions",
        answers={200: answer("Committed", ref("Subscription")), 201: answer("Created", ref("Subscription"))},
        fails=(400, 404, 408, 409, 413),
        params=(SAVE,),
        body={"required": False, "content": json_content(ref("SubscriptionCommit"))},
    ),
    Route(
        "GET",
        SUBSCRIPTION_PATH,
        get_subscription,
        need=(on_subscription("read"),),
        op="getSubscription",
        summary="Describe a subscription",
        tag="subscriptions",
        answers={200: answer("The subscription", ref("Subscription"))},
        fails=(404,),
    ),
    Route(
        "DELETE",
        SUBSCRIPTION_PATH,
        delete_subscription,
        need=(on_subscription("admin"),),
        op="deleteSubscription",
        summary="Delete a subscription",
        tag="subscriptions",
        answers={204: answer("Deleted")},
        fails=(404,),
    ),
    Route(
        "GET",
        "/v1/queues/{queue}/subscriptions/{name}/messages",
        read,
        need=(on_queue("read"), on_subscription("read")),
        op="readSubscription",
        summary="Read after the subscription's cursor; commit=auto moves it",
        tag="subscriptions",
        answers={200: MESSAGES_ANSWER},
        fails=(400, 404, 406, 409),
        writes=commits,  # a GET that moves a cursor: refused from another site's page
        params=(
            LIMIT,
            SEGMENTS,
            WAIT,
            SAVE,
            param(
                "commit",
                "query",
                {"type": "string", "enum": ["auto", "none"], "default": "auto"},
                "auto: move the cursor to last_id (creating the subscription); none: only read",
            ),
            ACCEPT,
        ),
    ),
    Route(
        "GET",
        REPLICAS_PATH,
        replicas,
        need=(on_queue("read"),),
        op="replicas",
        summary="Replica subscriptions whose cursor is at or past id",
        tag="subscriptions",
        answers={200: answer("Replicas", ref("Replicas"))},
        fails=(400, 404),
        params=(param("id", "query", MESSAGE_ID, "Message id", required=True),),
    ),
]
