"""Who is asking, and may they: authentication and the permission table for every route.

This is the one place that checks access. ``PERMISSIONS`` names, for every route, what the
caller needs (object type, action, and the object's name from the path); ``create_app``
refuses to build an application with a route missing from it, so a new endpoint cannot be
left open by accident. Routes whose need is ``()`` are open to any signed-in user: they list
only what the caller may read, or check ownership themselves (tokens, own password).

With authentication off (the loopback default) every request runs as ``UNRESTRICTED``.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from aiohttp import web
from aiohttp.typedefs import Handler

from capella.api.request import CLUSTER
from capella.auth.authenticator import Authenticator
from capella.auth.rule import UNRESTRICTED, Identity
from capella.errors import Unauthorized

AUTHENTICATOR = web.AppKey("authenticator", Authenticator)
IDENTITY = web.RequestKey("identity", Identity)

CHALLENGE = 'Basic realm="capella", charset="UTF-8", Bearer realm="capella"'


@dataclass(frozen=True, slots=True)
class Need:
    """``action`` on the ``type`` object named by ``name`` (a template over the path)."""

    type: str
    action: str
    name: str


def _q(action: str) -> Need:
    return Need("queue", action, "{queue}")


def _sub(action: str) -> Need:
    return Need("subscription", action, "{queue}/{name}")


PUBLIC = frozenset({("GET", "/healthz"), ("GET", "/readyz"), ("GET", "/v1/openapi.json")})

_Q = "/v1/queues/{queue}"
_S = "/v1/queues/{queue}/subscriptions/{name}"
PERMISSIONS: dict[tuple[str, str], tuple[Need, ...]] = {
    # queues and messages
    ("GET", "/v1/queues"): (),
    ("PUT", _Q): (_q("admin"),),
    ("GET", _Q): (_q("read"),),
    ("DELETE", _Q): (_q("admin"),),
    ("POST", f"{_Q}/messages"): (_q("write"),),
    ("GET", f"{_Q}/messages"): (_q("read"),),
    ("GET", f"{_Q}/stream"): (_q("read"),),
    ("GET", f"{_Q}/replicas"): (_q("read"),),
    # delayed delivery
    ("GET", f"{_Q}/scheduled"): (_q("read"),),
    ("GET", f"{_Q}/scheduled/{{id}}"): (_q("read"),),
    ("PATCH", f"{_Q}/scheduled/{{id}}"): (_q("write"),),
    ("DELETE", f"{_Q}/scheduled/{{id}}"): (_q("write"),),
    ("POST", f"{_Q}/scheduled/cancel"): (_q("write"),),
    # subscriptions (named queue/subscription in rules)
    ("GET", f"{_Q}/subscriptions"): (_q("read"),),
    ("PUT", _S): (_sub("write"),),
    ("GET", _S): (_sub("read"),),
    ("DELETE", _S): (_sub("admin"),),
    ("GET", f"{_S}/messages"): (_q("read"), _sub("read")),
    # work queues (ack-mode subscriptions): workers write, operators administer
    ("POST", f"{_S}/claim"): (_q("read"), _sub("write")),
    ("POST", f"{_S}/ack"): (_sub("write"),),
    ("POST", f"{_S}/nack"): (_sub("write"),),
    ("POST", f"{_S}/extend"): (_sub("write"),),
    ("GET", f"{_S}/work"): (_q("read"), _sub("read")),
    ("GET", f"{_S}/work/{{id}}"): (_q("read"), _sub("read")),
    ("POST", f"{_S}/work/retry"): (_sub("admin"),),
    ("POST", f"{_S}/work/delete"): (_sub("admin"),),
    # handlers
    ("GET", "/v1/handlers"): (),
    ("PUT", "/v1/handlers/{name}"): (Need("handler", "admin", "{name}"),),
    ("GET", "/v1/handlers/{name}"): (Need("handler", "read", "{name}"),),
    ("DELETE", "/v1/handlers/{name}"): (Need("handler", "admin", "{name}"),),
    ("POST", "/v1/handlers/{name}/start"): (Need("handler", "write", "{name}"),),
    ("POST", "/v1/handlers/{name}/stop"): (Need("handler", "write", "{name}"),),
    ("POST", "/v1/handlers/{name}/run"): (Need("handler", "write", "{name}"),),
    # external clusters
    ("GET", "/v1/clusters"): (),
    ("PUT", "/v1/clusters/{name}"): (Need("external_cluster", "admin", "{name}"),),
    ("GET", "/v1/clusters/{name}"): (Need("external_cluster", "read", "{name}"),),
    ("DELETE", "/v1/clusters/{name}"): (Need("external_cluster", "admin", "{name}"),),
    ("POST", "/v1/clusters/{name}/ping"): (Need("external_cluster", "write", "{name}"),),
    # users and tokens
    ("GET", "/v1/users"): (),
    ("PUT", "/v1/users/{name}"): (Need("user", "admin", "{name}"),),
    ("GET", "/v1/users/{name}"): (),  # yourself, or user read
    ("DELETE", "/v1/users/{name}"): (Need("user", "admin", "{name}"),),
    ("POST", "/v1/users/{name}/password"): (),  # yourself (with the old password), or user admin
    ("GET", "/v1/me"): (),
    ("POST", "/v1/tokens"): (),
    ("GET", "/v1/tokens"): (),
    ("DELETE", "/v1/tokens/{id}"): (),  # your own, or user admin on the owner
    # this cluster
    ("GET", "/metrics"): (Need("cluster", "read", "{cluster}"),),
}


def check_routes(app: web.Application) -> None:
    """Every route must be public or in ``PERMISSIONS``."""
    for route in app.router.routes():
        if route.method in ("HEAD", "*"):
            continue
        key = (route.method, route.resource.canonical if route.resource else "")
        if key not in PERMISSIONS and key not in PUBLIC:
            raise RuntimeError(f"route {key[0]} {key[1]} has no entry in capella.api.access.PERMISSIONS")


@web.middleware
async def access_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    authenticator = request.app.get(AUTHENTICATOR)
    if authenticator is None:
        request[IDENTITY] = UNRESTRICTED
        return await handler(request)
    resource = request.match_info.route.resource
    method = "GET" if request.method == "HEAD" else request.method
    key = (method, resource.canonical if resource is not None else "")
    if key in PUBLIC:
        request[IDENTITY] = UNRESTRICTED
        return await handler(request)
    # Unknown paths need credentials too: a stranger learns nothing about what exists.
    identity = await authenticate(request, authenticator)
    request[IDENTITY] = identity
    if needs := PERMISSIONS.get(key, ()):
        names = {**request.match_info, "cluster": request.app[CLUSTER].name}
        for need in needs:
            identity.check(need.type, need.action, need.name.format_map(names))
    return await handler(request)


async def authenticate(request: web.Request, authenticator: Authenticator) -> Identity:
    header = request.headers.get("Authorization")
    if header is None:
        if authenticator.settings.tls_client_users and (name := _certificate_name(request)):
            return authenticator.certificate(name)
        raise Unauthorized("credentials are required: HTTP Basic or a bearer token")
    scheme, _, value = header.partition(" ")
    scheme = scheme.lower()
    if scheme == "bearer":
        return authenticator.token(value.strip())
    if scheme == "basic":
        try:
            name, sep, password = base64.b64decode(value.strip(), validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            raise Unauthorized("malformed Basic credentials") from None
        if not sep:
            raise Unauthorized("malformed Basic credentials")
        return await authenticator.basic(name, password)
    raise Unauthorized(f"unsupported authorization scheme {scheme!r}: use Basic or Bearer")


def identity(request: web.Request) -> Identity:
    return request[IDENTITY]


def _certificate_name(request: web.Request) -> str | None:
    """The subject common name of a verified TLS client certificate, if there is one."""
    transport = request.transport
    cert = transport.get_extra_info("peercert") if transport is not None else None
    if not cert:
        return None
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None
