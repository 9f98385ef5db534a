"""``POST /cluster``: read the envelope, sign the sender in, run the action (or pass it on), answer.

Served only with ``[compat] original = true``. The route is public in the route table's sense
(its credentials are inside the body, not in HTTP headers), so this module signs the sender in
itself, through the same ``Authenticator`` as ``/v1`` (rules, rate limits, one answer for
every failed login). Every answer is HTTP 200 with the original's error object, as its clients
expect; nothing here answers 5xx.

A call passed on through an external cluster (``nested_call``, a ``cluster/queue`` name) needs
what the ``/v1`` relay needs (``external_cluster relay``) and, like it, never reaches the far
side's users and rights: the nested bodies are peeled to the final action before anything is
sent, and a call another cluster sent on (``hops``) may not run a security action here.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import gzip
import logging
import time

import msgspec
import orjson
from aiohttp import web

from capella.api.access import AUTHENTICATOR, NEEDS
from capella.api.openapi import answer as doc_answer
from capella.api.original import clusters, codes, handlers, security
from capella.api.original.actions import ACTIONS, QUEUE_ACTIONS, Action, Context, IdClock
from capella.api.original.envelope import (
    CONTENT_TYPE,
    Credentials,
    Envelope,
    Failure,
    Inflater,
    Request,
    answer,
    check_clock,
    credentials,
    parse,
)
from capella.api.request import CLUSTER, SETTINGS, SUPERVISOR
from capella.api.route import RELAY_PATH, Handler, Route
from capella.auth.authenticator import Authenticator
from capella.auth.rule import UNRESTRICTED, Identity
from capella.auth.store import AuthStore
from capella.client.async_client import AsyncClient
from capella.config import CompatSettings
from capella.errors import (
    CallLoop,
    CapellaError,
    ClusterNotFound,
    Forbidden,
    InvalidRequest,
    RelayRefused,
    TooManyHops,
    Unauthorized,
    UnknownAction,
)

log = logging.getLogger(__name__)

# Where the original serves its RPC endpoint, here and on the clusters a call is passed on to.
PATH = "/cluster"
COMPAT = web.AppKey("compat", CompatSettings)
# Every action this endpoint answers, by its name on the wire.
ALL_ACTIONS: dict[str, Action] = {**ACTIONS, **handlers.ACTIONS, **clusters.ACTIONS, **security.ACTIONS}
IDS = web.AppKey("ids", IdClock)
UNMARSHAL = "ClusterServiceJsonCreate.Unmarshal"
# The most of the body read at a time.
READ_CHUNK = 64 * 1024


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
    response = web.Response(body=data, headers={"Content-Type": CONTENT_TYPE, "Compress-Type": compress_type})
    if not request.content.is_eof():
        response.force_close()  # refused before its body was all read: close, do not read it on
    return response


async def ping(request: web.Request) -> web.Response:
    """The original's liveness probe: 200 and an empty body."""
    return web.Response(body=b"")


async def _envelope(request: web.Request, now: int) -> Envelope:
    """The envelope in the body, read in bounded steps.

    With authentication on, at most ``[compat] max_read_before_sign_in`` bytes of the body
    are read, and decompressed, before the sender is signed in. A longer envelope is signed
    in from its head (the credentials come first) and only then read on, up to
    ``server.max_body_size``; a stranger's large or stalled body costs no more than that.
    """
    settings = request.app[SETTINGS]
    inflater = Inflater(request.headers.get("Compress-Type", "").strip())
    deadline = asyncio.get_running_loop().time() + settings.body_timeout
    authenticator = request.app.get(AUTHENTICATOR)
    limit = settings.max_body_size
    head = None
    if authenticator is not None:
        before = request.app[COMPAT].max_read_before_sign_in
        if not await _read(request, inflater, before, deadline):
            head = credentials(bytes(inflater.text), settings.max_json_depth, before)
            await _sign_in(request, authenticator, head)
    if (authenticator is None or head is not None) and not (
        inflater.more(limit) and await _read(request, inflater, limit, deadline)
    ):
        raise inflater.too_long(limit, "server.max_body_size")
    text = inflater.finish()
    envelope = parse(text, settings.max_json_depth)
    if head is not None and head != Credentials(envelope.auth_type, envelope.user_name, envelope.auth_info):
        # Signed in as one sender, the envelope must not name another (a key given twice).
        raise Failure(
            10120103,
            "ClusterServiceJsonCreate.Unmarshal: unmarshal fail. ct: , au: ",
            iet="the envelope names its sender twice",
        )
    check_clock(envelope, now)
    if envelope.request is None:
        raise Failure(codes.REQUEST_NULL, "Security.CheckAuthFunc: Request is NIL")
    return envelope


async def _read(request: web.Request, inflater: Inflater, limit: int, deadline: float) -> bool:
    """Feed the body to ``inflater`` until it ends (True) or ``limit`` bytes of body or text are in."""
    content = request.content
    # A body already here (the usual small envelope) needs no deadline, and arms no timer.
    window = contextlib.nullcontext() if content.is_eof() else asyncio.timeout_at(deadline)
    try:
        async with window:
            while inflater.raw <= limit:
                chunk = await content.read(min(READ_CHUNK, limit + 1 - inflater.raw))
                if not chunk:
                    return True
                if not inflater.feed(chunk, limit):
                    return False
    except TimeoutError:
        seconds = request.app[SETTINGS].body_timeout
        late = f"{UNMARSHAL}: the request body did not arrive within {seconds:g} s"
        raise Failure(10120102, late) from None
    except web.RequestPayloadError:
        raise Failure(10120102, f"{UNMARSHAL}: the request body was cut short") from None
    return False


async def _sign_in(request: web.Request, authenticator: Authenticator, head: Credentials) -> None:
    """Refuse a sender whose credentials fail; ``_context`` signs the whole envelope in again
    (a password is then remembered, so the second check costs no hash)."""
    secret = _secret(head.auth_info)
    if head.auth_type == "bearer":
        authenticator.token(secret)
    else:
        await authenticator.basic(head.user_name, secret, request.remote or "")


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
        compat=app[COMPAT],
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


def _acting(identity: Identity, envelope: Envelope, users: AuthStore | None) -> Identity:
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
    return user.identity("impersonated")


async def run(ctx: Context, request: Request, envelope: Envelope) -> object:
    """The action's answer body: run here, or passed on through an external cluster."""
    if ctx.cluster.name in envelope.hops:
        raise CallLoop(f"the call has already passed through cluster {ctx.cluster.name!r}: {envelope.hops}")
    if envelope.hops and request.action in security.ACTIONS:
        # Sent on by another cluster as its link's user: never users or rights (checked before
        # sending too; this is for a sender that did not).
        raise _never_relayed(request.action)
    if request.action == "nested_call":
        first, _, rest = request.object_name.partition("/")
        if rest == "":
            inner = nested(request)
        else:
            inner = Request(action="nested_call", body=request.body, object_name=rest)
        return await forward(ctx, first, inner, envelope)
    if request.action in QUEUE_ACTIONS and "/" in request.object_name:
        first, _, rest = request.object_name.partition("/")
        inner = Request(action=request.action, body=request.body, object_name=rest)
        try:
            return await forward(ctx, first, inner, envelope)
        except ClusterNotFound as exc:
            # The original answers a queue path through no cluster as its GetQueue does.
            raise codes.failure(request.action, exc, ctx.identity.name, place="queue_path") from None
    action = ALL_ACTIONS.get(request.action)
    if action is None:
        raise UnknownAction(f"Unknown operation {request.action}")
    return await action(ctx, request)


def nested(request: Request) -> Request:
    """The request a ``nested_call`` carries as its body, or ``InvalidRequest``."""
    try:
        return msgspec.json.decode(request.body, type=Request)
    except msgspec.DecodeError as exc:  # ValidationError too: the body is JSON, of another shape
        raise InvalidRequest(f"the body of {request.action} is not a request: {exc}") from None


def final_action(request: Request) -> str:
    """The action a request sent on will run at the end of its hops: ``nested_call`` bodies
    peeled until one is not (each level is a level of the envelope's JSON, so
    ``server.max_json_depth`` bounds them)."""
    while request.action == "nested_call":
        request = nested(request)
    return request.action


def _never_relayed(action: str) -> RelayRefused:
    return RelayRefused(
        f"{action} is never run through an external cluster: a link must not create or change "
        "users and rights as its far-side user"
    )


async def forward(ctx: Context, cluster: str, request: Request, envelope: Envelope) -> object:
    """Send ``request`` to external cluster ``cluster`` as the cluster's user; its answer, or its error."""
    # What the /v1 relay through the cluster needs (external_cluster relay): one check, two doors.
    ctx.same_as("GET", RELAY_PATH, name=cluster)
    action = final_action(request)
    if action in security.ACTIONS:
        raise _never_relayed(action)
    if len(envelope.hops) >= ctx.compat.max_hops:
        raise TooManyHops(f"the call has passed through {len(envelope.hops)} clusters ([compat] max_hops)")
    # The envelope carries the link's credentials in its body: the original protocol's own way.
    links = ctx.clusters
    link = links.link(cluster)
    kind, username, secret = link.secret_kind, link.username, links.secret(link)
    now = time.time_ns()
    sent = Envelope(
        auth_type="bearer" if kind == "token" else "basic" if kind == "password" else "",
        user_name=username or "",
        auth_info=None if secret is None else base64.b64encode(orjson.dumps(secret)).decode("ascii"),
        wait=max(envelope.current_time + envelope.wait - now, 1_000_000_000),
        current_time=now,
        request=Request(action=request.action, body=request.body, object_name=request.object_name),
        hops=[*envelope.hops, ctx.cluster.name],
    )
    raw = await post(await links.client(cluster), msgspec.json.encode(sent))
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


async def post(client: AsyncClient, envelope: bytes) -> bytes:
    """POST an envelope (gzipped) to the far side's ``/cluster`` through ``client``: the answer's bytes.

    The envelope carries its own credentials, as the original's clients send them.
    """
    body = gzip.compress(envelope, compresslevel=5)
    return await client.transport.call("POST", PATH, data=body, headers={"Compress-Type": "gzip"})


def _route(method: str, path: str, handler: Handler, summary: str) -> Route:
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
        # /cluster runs any action whatever the method: a GET from another site's page is refused too.
        writes=path == PATH,
    )


# Served with [compat] original = true; the original does not check the method.
ROUTES = [
    _route("POST", PATH, cluster_call, "The original Capella's RPC endpoint (docs/compat.md)"),
    _route("GET", PATH, cluster_call, "The original Capella's RPC endpoint (docs/compat.md)"),
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
