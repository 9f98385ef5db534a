"""Who is asking, and may they: authentication, and the check of each route's ``need``.

This is the one place that checks access. Every row of the route table (``api/route.py``)
names what the caller needs (object type, action, and the object's name from the path), so a
new endpoint cannot be left open by accident. Routes whose need is ``()`` are open to any
signed-in user: they list only what the caller may read, or check ownership themselves
(tokens, own password); ``None`` marks the public ones (health, readiness, the document).

With authentication off (the loopback default) every request runs as ``UNRESTRICTED``.
"""

from __future__ import annotations

import base64
import binascii

from aiohttp import web
from aiohttp.typedefs import Handler

from capella.api.request import CLUSTER
from capella.api.route import Need
from capella.auth.authenticator import Authenticator
from capella.auth.rule import UNRESTRICTED, Identity
from capella.errors import Unauthorized

AUTHENTICATOR = web.AppKey("authenticator", Authenticator)
IDENTITY = web.RequestKey("identity", Identity)

CHALLENGE = 'Basic realm="capella", charset="UTF-8", Bearer realm="capella"'
# A page's script (the console sends X-Requested-With, as many web frameworks do) is not
# challenged for Basic: browsers would put up their own password prompt over the page's.
SCRIPT_CHALLENGE = 'Bearer realm="capella"'


def challenge(request: web.Request) -> str:
    """The ``WWW-Authenticate`` value of a 401 answer to ``request``."""
    scripted = request.headers.get("X-Requested-With", "").lower() == "xmlhttprequest"
    return SCRIPT_CHALLENGE if scripted else CHALLENGE


# What each route needs, by (method, path template); ``None`` for a public route.
NEEDS = web.AppKey("needs", dict[tuple[str, str], tuple[Need, ...] | None])


@web.middleware
async def access_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    authenticator = request.app.get(AUTHENTICATOR)
    if authenticator is None:
        request[IDENTITY] = UNRESTRICTED
        return await handler(request)
    resource = request.match_info.route.resource
    method = "GET" if request.method == "HEAD" else request.method
    key = (method, resource.canonical if resource is not None else "")
    # Unknown paths need credentials too: a stranger learns nothing about what exists.
    needs = request.app[NEEDS].get(key, ())
    if needs is None:
        request[IDENTITY] = UNRESTRICTED
        return await handler(request)
    identity = await authenticate(request, authenticator)
    request[IDENTITY] = identity
    if needs:
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
        return await authenticator.basic(name, password, request.remote or "")
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
