"""``create_app``: the aiohttp application, its routes and the middleware that renders errors."""

from __future__ import annotations

import asyncio
import functools
import logging
import re
from collections.abc import Callable, Iterator
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from multidict import MultiMapping

from capella import wire
from capella.api import (
    clusters,
    console,
    delayed,
    handlers,
    health,
    messages,
    openapi,
    queues,
    relay,
    subscriptions,
    tokens,
    topics,
    users,
    work,
)
from capella.api.access import AUTHENTICATOR, NEEDS, access_middleware, challenge
from capella.api.browser import WRITES, BrowserGuard, on_prepare
from capella.api.connection import ConnectionGuard
from capella.api.cors import Cors
from capella.api.errors import answered, status_for
from capella.api.request import CLUSTER, SETTINGS, STOPPING, SUPERVISOR, json_response
from capella.api.route import Route, Writes
from capella.auth.authenticator import Authenticator
from capella.config import CompatSettings, ServerSettings
from capella.core.cluster import Cluster
from capella.errors import CapellaError, InvalidRequest, RateLimited, Unauthorized
from capella.handlers.supervisor import Supervisor
from capella.wire.answers import Error

__all__ = ["CLUSTER", "ROUTES", "SETTINGS", "SUPERVISOR", "create_app", "document"]

log = logging.getLogger(__name__)

# Every route the API serves, in one table: the app, the access check and the OpenAPI
# document are built from it.
ROUTES: list[Route] = [
    *queues.ROUTES,
    *topics.ROUTES,
    *messages.ROUTES,
    *delayed.ROUTES,
    *subscriptions.ROUTES,
    *work.ROUTES,
    *handlers.ROUTES,
    *clusters.ROUTES,
    *relay.ROUTES,
    *users.ROUTES,
    *tokens.ROUTES,
    *health.ROUTES,
    *openapi.ROUTES,
    *console.ROUTES,
]


@functools.cache
def document() -> dict[str, Any]:
    """The OpenAPI document of ``ROUTES``, built on first use (generating the schemas from
    the wire structs takes ~20 ms that start-up need not pay)."""
    return openapi.document(ROUTES)


@functools.cache
def document_body() -> bytes:
    return wire.dumps(document())


# aiohttp raises some itself (unknown route, wrong method, body over client_max_size): each
# status gets the code of the most general error answered with it (404 not_found...).
HTTP_CODES = {status: kinds[0].code for status, kinds in answered().items()}


def create_app(
    cluster: Cluster,
    settings: ServerSettings,
    supervisor: Supervisor,
    *,
    authenticator: Authenticator | None = None,
    guard: ConnectionGuard | None = None,
    compat: CompatSettings | None = None,
) -> web.Application:
    """The API; with an ``authenticator`` every non-public route needs credentials.

    ``guard`` is the connection guard of the site that will serve it; ``compat`` with
    ``original`` adds the original Capella's ``POST /cluster`` (not in the OpenAPI document:
    its bodies are the original's, docs/compat.md).
    """
    # The guard's middleware goes first: a head is complete whatever the later ones decide.
    # The browser checks come before the access check, so a refused request costs no login.
    browser = BrowserGuard(settings, check_host=authenticator is None)
    middlewares: list[Middleware] = [error_middleware, browser.middleware, access_middleware, single_values]
    cors = Cors(settings.cors) if settings.cors.origins else None
    if cors is not None:
        middlewares.insert(0, cors.middleware)  # a preflight carries no credentials
    if guard is not None:
        middlewares.insert(0, guard.middleware)
    app = web.Application(client_max_size=settings.max_body_size, middlewares=middlewares)
    if cors is not None:
        app.on_response_prepare.append(cors.on_prepare)
    app.on_response_prepare.append(on_prepare)  # nosniff and a CSP on every answer
    if authenticator is not None:
        app[AUTHENTICATOR] = authenticator
        app[messages.STREAMS] = {}  # streams are counted per user, so only when there are users
    app[CLUSTER] = cluster
    app[SETTINGS] = settings
    app[SUPERVISOR] = supervisor
    app[STOPPING] = asyncio.Event()
    app.on_shutdown.append(_stop_streams)
    # How many clusters a relayed /v1 request may pass through, as for nested /cluster calls.
    app[relay.MAX_HOPS] = (compat or CompatSettings()).max_hops
    for route in ROUTES:
        path = served_path(route.path, ROUTES)
        if route.method == "GET":
            app.router.add_get(path, route.handler)  # HEAD too
        else:
            app.router.add_route(route.method, path, route.handler)
    served = list(ROUTES)
    if compat is not None and compat.original:
        # Imported only when it is on, as storage providers are: a second front door that
        # most servers never open costs them no memory (~0.4 MB of code).
        from capella.api.original import endpoint as original

        served += original.serve(app, compat)
    app[NEEDS] = {(route.method, route.path): route.need for route in served}
    app[WRITES] = {key: writes for key, writes in _writes(served)}
    render: Callable[[], bytes] = document_body
    app[openapi.DOCUMENT_BODY] = render
    return app


def _writes(routes: list[Route]) -> Iterator[tuple[tuple[str, str], Writes]]:
    """The routes that write whatever their method, with their ``writes``."""
    for route in routes:
        if route.writes is not False:
            yield (route.method, route.path), route.writes


def served_path(path: str, routes: list[Route]) -> str:
    """``path`` as aiohttp matches it.

    A trailing ``{path}`` is the rest of the path, slashes included (the cluster relay). Any
    other ``{name}`` is not one of the fixed segments beside it: ``/scheduled/cancel`` is not a
    scheduled message whose id is "cancel", so a method cancel does not take is 405 with an
    ``Allow`` of cancel's methods alone, as the document says.
    """
    parts = path.split("/")
    for i, part in enumerate(parts):
        if part == "{path}":
            parts[i] = "{path:.*}"
        elif part.startswith("{"):
            fixed = sorted(
                {
                    other[i]
                    for other in (r.path.split("/") for r in routes)
                    if len(other) > i and other[:i] == parts[:i] and other[i] and not other[i].startswith("{")
                }
            )
            if fixed:
                parts[i] = f"{part[:-1]}:(?!(?:{'|'.join(map(re.escape, fixed))})$)[^{{}}/]+}}"
    return "/".join(parts)


async def _stop_streams(app: web.Application) -> None:
    app[STOPPING].set()


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except CapellaError as exc:
        if status_for(exc) >= 500:
            log.warning(
                "request failed method=%s path=%s code=%s: %s",
                request.method,
                request.path,
                exc.code,
                exc.message,
            )
        headers = None
        if isinstance(exc, Unauthorized):
            headers = {"WWW-Authenticate": challenge(request)}
        elif isinstance(exc, RateLimited):
            headers = {"Retry-After": str(exc.retry_after)}
        return error_response(status_for(exc), exc.code, exc.message, exc.details, headers)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = HTTP_CODES.get(exc.status, "internal" if exc.status >= 500 else "invalid_request")
        headers = {k: v for k, v in exc.headers.items() if k.lower() == "allow"}
        return error_response(exc.status, code, _http_message(request, exc), {}, headers)
    except Exception:
        log.error("unexpected error method=%s path=%s", request.method, request.path, exc_info=True)
        return error_response(500, "internal", "internal server error", {})


@web.middleware
async def single_values(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A parameter that takes one value, given twice: 400 rather than the first silently
    winning (``header.<name>`` and ``json.<path>`` filters may repeat: all must match).
    After the access check, so a request without credentials is still a 401."""
    query = request.query
    if len(query) != len(set(query)):
        _refuse_repeated(query)
    return await handler(request)


def _refuse_repeated(query: MultiMapping[str]) -> None:
    for key in query:
        if not key.startswith(("header.", "json.")) and len(query.getall(key)) > 1:
            raise InvalidRequest(f"{key}: given more than once", parameter=key)


def error_response(
    status: int,
    code: str,
    message: str,
    details: dict[str, object],
    headers: dict[str, str] | None = None,
) -> web.Response:
    return json_response(Error.of(code, message, details), status, headers)


def _http_message(request: web.Request, exc: web.HTTPException) -> str:
    if exc.status == 404:
        return f"no such resource: {request.path}"
    if exc.status == 405:
        return f"method {request.method} is not allowed on {request.path}"
    if exc.status == 413:
        return f"the request body is larger than {request.app[SETTINGS].max_body_size} bytes"
    return exc.reason
