"""``POST /cluster``: read the envelope, sign the sender in, run the action (or pass it on), answer.

Served only with ``[compat] original = true``. The route is public in the route table's sense
(its credentials are inside the body, not in HTTP headers), so this module signs the sender in
itself, through the same ``Authenticator`` as ``/v1`` (rules, rate limits, one answer for
every failed login). Every answer is HTTP 200 with the original's error object, as its clients
expect; nothing here answers 5xx.
"""

from __future__ import annotations

import base64
import binascii
import logging
import time
from typing import Any

import msgspec
import orjson
from aiohttp import web

from capella.api.access import AUTHENTICATOR, NEEDS
from capella.api.openapi import answer as doc_answer
from capella.api.original import clusters, codes, handlers, security
from capella.api.original.actions import ACTIONS, QUEUE_ACTIONS, Action, Context, IdClock
from capella.api.original.envelope import (
    CONTENT_TYPE,
    Envelope,
    Failure,
    Request,
    answer,
    check_clock,
    decompress,
    parse,
)
from capella.api.request import CLUSTER, SETTINGS, SUPERVISOR, read_body
from capella.api.route import Route
from capella.auth.rule import UNRESTRICTED, Identity
from capella.config import CompatSettings
from capella.errors import CallLoop, CapellaError, Forbidden, TooManyHops, Unauthorized, UnknownAction

log = logging.getLogger(__name__)

COMPAT = web.AppKey("compat", CompatSettings)
# Every action this endpoint answers, by its name on the wire.
ALL_ACTIONS: dict[str, Action] = {**ACTIONS, **handlers.ACTIONS, **clusters.ACTIONS, **security.ACTIONS}
IDS = web.AppKey("ids", IdClock)


async def cluster_call(request: web.Request) -> web.Response:
    start = time.time_ns()
    prefer = ""
    try:
        envelope = await _envelope(request, start)
        assert envelope.request is not None  # _envelope refuses a null request
        ctx = await _context(request, envelope)
        prefer = envelope.prefer_content_type
        try:
            body = await run(ctx, envelope.request, envelope)
        except CapellaError as exc:
            raise codes.failure(envelope.request.action, exc, ctx.identity.name) from None
        error = None
    except Failure as failure:
        body, error = failure.body, failure
    except CapellaError as exc:
        body, error = None, codes.failure("ClusterService.Call", exc, None)
    except Exception:
        log.error("original call failed", exc_info=True)
        body, error = None, Failure(codes.INTERNAL, "ClusterService.Call: internal error")
    data, compress_type = answer(start, body, error, prefer)
    return web.Response(body=data, headers={"Content-Type": CONTENT_TYPE, "Compress-Type": compress_type})


async def ping(request: web.Request) -> web.Response:
    """The original's liveness probe: 200 and an empty body."""
    return web.Response(body=b"")


async def _envelope(request: web.Request, now: int) -> Envelope:
    settings = request.app[SETTINGS]
    try:
        raw = await read_body(request)
    except CapellaError as exc:
        raise Failure(10120102, f"ClusterServiceJsonCreate.Unmarshal: {exc.message}") from None
    text = decompress(raw, request.headers.get("Compress-Type", "").strip(), settings.max_body_size)
    envelope = parse(text, settings.max_json_depth)
    check_clock(envelope, now)
    if envelope.request is None:
        raise Failure(codes.REQUEST_NULL, "Security.CheckAuthFunc: Request is NIL")
    return envelope


async def _context(request: web.Request, envelope: Envelope) -> Context:
    app = request.app
    authenticator = app.get(AUTHENTICATOR)
    users = authenticator.store if authenticator is not None else None
    identity = UNRESTRICTED
    if authenticator is not None:
        secret = _secret(envelope.auth_info)
        if envelope.auth_type == "bearer":
            identity = authenticator.token(secret)
        else:
            identity = await authenticator.basic(envelope.user_name, secret, request.remote or "")
        identity = _acting(identity, envelope, users)
    return Context(
        cluster=app[CLUSTER],
        supervisor=app[SUPERVISOR],
        settings=app[SETTINGS],
        needs=app[NEEDS],
        ids=app[IDS],
        identity=identity,
        users=users,
        authenticated=authenticator is not None,
        extra={"compat": app[COMPAT]},
    )


def _secret(auth_info: str | None) -> str:
    """The password (or token) in ``auth_info``: base64 of a JSON string, as the Go client writes it."""
    try:
        value = orjson.loads(base64.b64decode(auth_info or "", validate=True))
    except (binascii.Error, orjson.JSONDecodeError, ValueError) as exc:
        raise Failure(
            codes.BAD_AUTH_INFO, "Security.CheckAuthFunc: Auth user fail Unmarshal", iet=str(exc)
        ) from None
    if not isinstance(value, str):
        raise Failure(codes.BAD_AUTH_INFO, "Security.CheckAuthFunc: Auth user fail Unmarshal")
    return value


def _acting(identity: Identity, envelope: Envelope, users: Any) -> Identity:
    """The identity the request runs as: the sender, or (for an admin) the user it names."""
    assert envelope.request is not None
    name = "" if envelope.replace_name_force else envelope.request.user
    if not name or name == identity.name:
        return identity
    if not identity.admin:
        raise Forbidden(f"user {identity.name!r} may not act as {name!r}")
    user = users.find_user(name) if users is not None else None
    if user is None or not user.enabled:
        raise Unauthorized("invalid user name or password")
    return user.identity("impersonated")  # type: ignore[no-any-return]


async def run(ctx: Context, request: Request, envelope: Envelope) -> object:
    """The action's answer body: run here, or passed on through an external cluster."""
    if ctx.cluster.name in envelope.hops:
        raise CallLoop(f"the call has already passed through cluster {ctx.cluster.name!r}: {envelope.hops}")
    if request.action == "nested_call":
        first, _, rest = request.object_name.partition("/")
        inner = msgspec.json.decode(request.body, type=Request) if rest == "" else None
        if inner is None:
            inner = Request(action="nested_call", body=request.body, object_name=rest)
        return await forward(ctx, first, inner, envelope)
    if request.action in QUEUE_ACTIONS and "/" in request.object_name:
        first, _, rest = request.object_name.partition("/")
        inner = Request(action=request.action, body=request.body, object_name=rest)
        return await forward(ctx, first, inner, envelope)
    action = ALL_ACTIONS.get(request.action)
    if action is None:
        raise UnknownAction(f"Unknown operation {request.action}")
    return await action(ctx, request)


async def forward(ctx: Context, cluster: str, request: Request, envelope: Envelope) -> object:
    """Send ``request`` to external cluster ``cluster`` as the cluster's user; its answer, or its error."""
    ctx.same_as("POST", "/v1/clusters/{name}/ping", name=cluster)
    compat: CompatSettings = ctx.extra["compat"]
    if len(envelope.hops) >= compat.max_hops:
        raise TooManyHops(f"the call has passed through {len(envelope.hops)} clusters ([compat] max_hops)")
    clusters = ctx.clusters
    kind, username, secret = clusters.credentials(cluster)
    now = time.time_ns()
    sent = {
        "auth_type": "bearer" if kind == "token" else "basic" if kind == "password" else "",
        "user_name": username or "",
        "auth_info": None if secret is None else base64.b64encode(orjson.dumps(secret)).decode("ascii"),
        "wait": max(envelope.current_time + envelope.wait - now, 1_000_000_000),
        "current_time": now,
        "prefer_content_type": "",
        "replace_name_force": False,
        "request": {
            "name": "",
            "user": "",
            "action": request.action,
            "body": request.body,
            "object_name": request.object_name,
        },
        "hops": [*envelope.hops, ctx.cluster.name],
    }
    raw = await (await clusters.client(cluster)).original_call(msgspec.json.encode(sent))
    try:
        got = orjson.loads(raw)["responce"]
        error = got["error"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        raise Failure(
            codes.UNREACHABLE, f"CallFuncInCluster: cluster {cluster} did not answer an envelope"
        ) from None
    if error:
        raise Failure.of(error, got.get("body"))
    return got.get("body")


def _route(method: str, path: str, handler: Any, summary: str) -> Route:
    return Route(
        method,
        path,
        handler,
        need=None,  # the envelope carries the credentials: endpoint.py signs the sender in
        op=f"original{method.capitalize()}{path.strip('/').capitalize()}",
        summary=summary,
        tag="compat",
        answers={200: doc_answer("The original's answer envelope")},
        fails=None,
    )


# Served with [compat] original = true; the original does not check the method.
ROUTES = [
    _route("POST", "/cluster", cluster_call, "The original Capella's RPC endpoint (docs/compat.md)"),
    _route("GET", "/cluster", cluster_call, "The original Capella's RPC endpoint (docs/compat.md)"),
    _route("POST", "/ping", ping, "The original Capella's liveness probe"),
    _route("GET", "/ping", ping, "The original Capella's liveness probe"),
]


def serve(app: web.Application, compat: CompatSettings) -> list[Route]:
    """Add the original's routes to ``app``; the routes added."""
    app[COMPAT] = compat
    app[IDS] = IdClock()
    for route in ROUTES:
        app.router.add_route(route.method, route.path, route.handler)
    return ROUTES
