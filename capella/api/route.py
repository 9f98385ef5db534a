"""One row per route: method, path, handler, what the caller needs, and what it answers.

Each resource module declares its ``ROUTES``; ``create_app`` serves them, the access check
reads their ``need``, and ``openapi.document`` describes them. Nothing else lists routes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# Whether a route's requests change state whatever their method: always, or per request.
Writes = bool | Callable[[web.Request], bool]


# The paths named outside their own rows, written once here: the rows serve them, the original
# protocol checks each action with the need of the /v1 route that does the same thing
# (``api/original/actions.py`` ``same_as``), and the browser guard serves the probes under any
# Host. A path that only its own rows name is written in its row.
HEALTHZ_PATH = "/healthz"
READYZ_PATH = "/readyz"
QUEUE_PATH = "/v1/queues/{queue}"
MESSAGES_PATH = "/v1/queues/{queue}/messages"
SUBSCRIPTION_PATH = "/v1/queues/{queue}/subscriptions/{name}"
REPLICAS_PATH = "/v1/queues/{queue}/replicas"
HANDLER_PATH = "/v1/handlers/{name}"
HANDLER_START_PATH = "/v1/handlers/{name}/start"
HANDLER_STOP_PATH = "/v1/handlers/{name}/stop"
CLUSTER_PATH = "/v1/clusters/{name}"
RELAY_PATH = "/v1/clusters/{name}/v1/{path}"
USER_PATH = "/v1/users/{name}"


@dataclass(frozen=True, slots=True)
class Need:
    """``action`` on the ``type`` object named by ``name`` (a template over the path)."""

    type: str
    action: str
    name: str


def on_queue(action: str) -> Need:
    return Need("queue", action, "{queue}")


def on_subscription(action: str) -> Need:
    return Need("subscription", action, "{queue}/{name}")


def on_named(kind: str, action: str) -> Need:
    """``action`` on the handler, external cluster or user named ``{name}`` in the path."""
    return Need(kind, action, "{name}")


@dataclass(frozen=True, slots=True)
class Route:
    """A route and its contract.

    ``need`` is what the caller must be allowed: ``None`` for a public route (no credentials),
    ``()`` for any signed-in user (the handler filters or checks ownership itself).
    ``answers`` maps a status to its OpenAPI response; ``fails`` lists the error statuses
    beyond 401, 403, 429 and 503, which every non-public route can answer (``None``: none at all).
    ``params`` are the query and header parameters; path parameters follow from ``path``.
    ``writes`` says whether a request may change state whatever its method (``True``, or a
    function of the request): a browser may not send such a request from another site
    (``api/browser.py``); ``POST``, ``PUT``, ``PATCH`` and ``DELETE`` always count as writes.
    """

    method: str
    path: str
    handler: Handler
    need: tuple[Need, ...] | None
    op: str
    summary: str
    tag: str
    answers: Mapping[int, dict[str, Any]]
    fails: tuple[int, ...] | None = ()
    params: tuple[dict[str, Any], ...] = ()
    body: dict[str, Any] | None = None
    writes: Writes = False
