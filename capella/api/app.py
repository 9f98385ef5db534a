"""``create_app``: the aiohttp application, its routes and the middleware that renders errors."""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from capella.api import (
    clusters,
    handlers,
    health,
    messages,
    openapi,
    queues,
    scheduled,
    subscriptions,
    tokens,
    users,
    work,
)
from capella.api.access import AUTHENTICATOR, CHALLENGE, access_middleware, check_routes
from capella.api.connection import ConnectionGuard
from capella.api.errors import status_for
from capella.api.request import CLUSTER, SETTINGS, STOPPING, SUPERVISOR, json_response
from capella.auth.authenticator import Authenticator
from capella.config import ServerSettings
from capella.core.cluster import Cluster
from capella.errors import CapellaError, Unauthorized
from capella.handlers.supervisor import Supervisor

__all__ = ["CLUSTER", "SETTINGS", "SUPERVISOR", "create_app"]

log = logging.getLogger(__name__)

# aiohttp raises these itself (unknown route, wrong method, body over client_max_size).
_HTTP_CODES = {
    400: "invalid_request",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    413: "payload_too_large",
}


def create_app(
    cluster: Cluster,
    settings: ServerSettings,
    supervisor: Supervisor,
    *,
    authenticator: Authenticator | None = None,
    guard: ConnectionGuard | None = None,
) -> web.Application:
    """The API; with an ``authenticator`` every non-public route needs credentials.

    ``guard`` is the connection guard of the site that will serve it.
    """
    # The guard's middleware goes first: a head is complete whatever the later ones decide.
    middlewares: list[Middleware] = [error_middleware, access_middleware]
    if guard is not None:
        middlewares.insert(0, guard.middleware)
    app = web.Application(client_max_size=settings.max_body_size, middlewares=middlewares)
    if authenticator is not None:
        app[AUTHENTICATOR] = authenticator
    app[CLUSTER] = cluster
    app[SETTINGS] = settings
    app[SUPERVISOR] = supervisor
    app[STOPPING] = asyncio.Event()
    app.on_shutdown.append(_stop_streams)
    modules = (
        queues,
        messages,
        scheduled,
        subscriptions,
        work,
        handlers,
        clusters,
        users,
        tokens,
        health,
        openapi,
    )
    for module in modules:
        module.add_routes(app.router)
    check_routes(app)
    return app


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
        headers = {"WWW-Authenticate": CHALLENGE} if isinstance(exc, Unauthorized) else None
        return error_response(status_for(exc), exc.code, exc.message, exc.details, headers)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = _HTTP_CODES.get(exc.status, "internal" if exc.status >= 500 else "invalid_request")
        headers = {k: v for k, v in exc.headers.items() if k.lower() == "allow"}
        return error_response(exc.status, code, _http_message(request, exc), {}, headers)
    except Exception:
        log.error("unexpected error method=%s path=%s", request.method, request.path, exc_info=True)
        return error_response(500, "internal", "internal server error", {})


def error_response(
    status: int,
    code: str,
    message: str,
    details: dict[str, object],
    headers: dict[str, str] | None = None,
) -> web.Response:
    return json_response({"error": {**details, "code": code, "message": message}}, status, headers)


def _http_message(request: web.Request, exc: web.HTTPException) -> str:
    if exc.status == 404:
        return f"no such resource: {request.path}"
    if exc.status == 405:
        return f"method {request.method} is not allowed on {request.path}"
    if exc.status == 413:
        return f"the request body is larger than {request.app[SETTINGS].max_body_size} bytes"
    return exc.reason
