"""The OpenAPI 3.1 document of the HTTP API (docs/api.md), served at ``GET /v1/openapi.json``.

``document(routes)`` builds it from the route table (each module's ``ROUTES``): paths,
operations, parameters and answers come from the rows, the schemas from the wire structs
(``capella/wire/``).
``create_app`` renders it to bytes once.
"""

from __future__ import annotations

from collections.abc import Callable
from types import UnionType
from typing import Any, get_args

import msgspec
from aiohttp import web

from capella import wire
from capella.api.errors import answered
from capella.api.route import Route
from capella.errors import CapellaError
from capella.wire import (
    answers,
    auth,
    batch_page,
    clusters,
    copy,
    fields,
    frames,
    handler_status,
    handlers,
    messages,
    params,
    postgres,
    push,
    queues,
    topics,
    upkeep,
    work,
)


def schema_of(kind: object) -> dict[str, Any]:
    """The JSON Schema of a wire field type (for query and path parameters)."""
    return msgspec.json.schema(kind)


INT64 = schema_of(fields.Int64)
MESSAGE_ID = schema_of(fields.MessageId)
TIME_TEXT_PATTERN = rf"^(\d+(\.\d+)?|{fields.RFC3339})$"
DURATION = schema_of(fields.Duration)
NAME = schema_of(fields.Name)


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def json_content(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def answer(description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    if schema is None:
        return {"description": description}
    return {"description": description, "content": json_content(schema)}


def param(
    name: str,
    where: str,
    schema: dict[str, Any],
    description: str,
    required: bool = False,
    *,
    empty: bool = True,
) -> dict[str, Any]:
    """A parameter of an operation. An optional query parameter given empty (``?wait=``) counts
    as not given, as ``api/request.py`` reads them; ``empty=False`` for one whose reader
    refuses an empty value."""
    result = {
        "name": name,
        "in": where,
        "required": required or where == "path",
        "schema": schema,
        "description": description,
    }
    if where == "query" and not required and empty:
        result["allowEmptyValue"] = True
    return result


# A queue's own name, or a topic's partition (``orders~2``): every queue path takes both, but
# only a topic's definition creates or drops a partition (``QUEUE_NAME``, for those two).
QUEUE = param(
    "queue", "path", schema_of(fields.QueueReference), "Queue name, or a topic's partition: topic~N"
)
QUEUE_NAME = param("queue", "path", NAME, "Queue name (a topic's partitions come from its definition)")
TOPIC = param("topic", "path", NAME, "Topic name")
SUBSCRIPTION = param("name", "path", NAME, "Subscription name")
# Ids are handed out from 1: 0 names nothing (400, as a path of another kind would).
STORED_ID = {**MESSAGE_ID, "minimum": 1}
SCHEDULED_ID = param("id", "path", STORED_ID, "Scheduled message id (scheduled_id)")
HANDLER = param("name", "path", NAME, "Handler name")
CLUSTER = param("name", "path", NAME, "External cluster name")
USER = param("name", "path", schema_of(fields.UserName), "User name")
SAVE = param("save", "query", schema_of(fields.SaveModeText), "Save mode (default: the queue's)")
AFTER = param("after", "query", MESSAGE_ID, "Return messages with an id greater than this")
LIMIT = param(
    "limit",
    "query",
    {"type": "integer", "minimum": 1, "maximum": wire.INT64_MAX, "default": 100},
    "At most this many messages (capped at the server's max_limit)",
)
SEGMENTS = param(
    "segments",
    "query",
    schema_of(fields.SegmentsText),
    "Inclusive segment ranges, e.g. 0-9,20-29,42",
)
WAIT = param("wait", "query", DURATION, "Long-poll up to this many seconds (capped at max_wait)")
# What answer_form takes: nothing, or a list naming */*, application/* or one of the forms.
ACCEPT_PATTERN = (
    r"^(\s*|(.*,)?\s*(\*/\*|application/(\*|json|x-ndjson|vnd\.capella\.messages))\s*(;[^,]*)?(,.*)?)$"
)
ACCEPT = param(
    "Accept",
    "header",
    {"type": "string", "pattern": ACCEPT_PATTERN},
    "application/json (the default), application/x-ndjson for one StoredMessage per line, or "
    f"{frames.MEDIA_TYPE} for binary frames, {batch_page.PAGE_MEDIA_TYPE} for a page of record "
    "batches (docs/format.md); anything else is 406 not_acceptable",
)

MESSAGES_ANSWER = {
    "description": "Messages after the cursor",
    "headers": {
        "Capella-Last-Id": {"description": "last_id (NDJSON and binary answers)", "schema": MESSAGE_ID}
    },
    "content": {
        "application/json": {"schema": ref("Messages")},
        wire.NDJSON: {"schema": {"type": "string", "description": "one StoredMessage per line"}},
        frames.MEDIA_TYPE: {
            "schema": {
                "type": "string",
                "format": "binary",
                "description": "a page head and one frame per message (docs/format.md)",
            }
        },
        batch_page.PAGE_MEDIA_TYPE: {
            "schema": {
                "type": "string",
                "format": "binary",
                "description": "a CPP2 page head, then record batches (docs/format.md)",
            }
        },
    },
}

# One event of the stream, as OpenAPI 3.2 has itemSchema describe it (and 3.1 tools read schema).
SSE_EVENT = {
    "type": "object",
    "description": "event: message, id: the message id, data: the StoredMessage as JSON",
    "required": ["event", "id", "data"],
    "properties": {
        "event": {"const": "message"},
        "id": {"type": "string", "pattern": r"^\d+$"},
        "data": {
            "type": "string",
            "contentMediaType": "application/json",
            "contentSchema": ref("StoredMessage"),
        },
    },
}

# Every struct of these modules is a schema of the document, under its class name.
WIRE_MODULES = (
    answers,
    messages,
    queues,
    topics,
    work,
    params,
    upkeep,
    copy,
    push,
    postgres,
    handlers,
    handler_status,
    clusters,
    auth,
)


def schemas() -> dict[str, Any]:
    """The components' schemas, generated from the wire structs.

    A struct's docstring is its description; ``__schema_extra__`` adds what a type cannot
    say (exactly one of two fields, at least one of three); a base that is only the shared part
    of others (``__schema_base__``) is no schema of its own.
    """
    types = [
        obj
        for module in WIRE_MODULES
        for obj in vars(module).values()
        if isinstance(obj, type)
        and issubclass(obj, msgspec.Struct)
        and obj.__module__ == module.__name__
        and not vars(obj).get("__schema_base__", False)
    ]
    # A union of structs named at module level is a schema of its own (HandlerDefinition).
    unions = {
        name: obj
        for module in WIRE_MODULES
        for name, obj in vars(module).items()
        if isinstance(obj, UnionType)
        and all(isinstance(a, type) and issubclass(a, msgspec.Struct) for a in get_args(obj))
    }
    shown, components = msgspec.json.schema_components(
        [*types, *unions.values()], ref_template="#/components/schemas/{name}", schema_hook=fields.schema_hook
    )
    for kind in types:
        schema = components[kind.__name__]
        schema.pop("title", None)
        extra = getattr(kind, "__schema_extra__", {})
        # Added beside what msgspec made, never over it: a rule's "properties" or "required"
        # would replace the struct's own (pg_outbox's definition once lost all its fields).
        clash = extra.keys() & schema.keys()
        if clash:
            raise TypeError(f"{kind.__name__}.__schema_extra__ replaces {sorted(clash)}: wrap it in allOf")
        schema.update(extra)
    components.update(zip(unions, shown[len(types) :], strict=True))
    return dict(sorted(components.items()))


def error_text(kinds: list[type[CapellaError]]) -> str:
    """What the errors of one status mean: each code with the first paragraph of its docstring."""
    return "; ".join(f"{kind.code}: {_summary(kind)}" for kind in kinds)


def _summary(kind: type[CapellaError]) -> str:
    first = (kind.__doc__ or "").split("\n\n")[0]
    return " ".join(first.split())


# What any request can be answered, whatever its operation: a request that is not valid HTTP
# (400), one whose head or body did not arrive in time (408), or whose head is over its limits
# (431); a login over its bounds (401, 403, 429); and a server that cannot serve (503).
ANY_OPERATION = (400, 401, 403, 408, 429, 431, 503)


def fails(*statuses: int) -> dict[str, Any]:
    """The error answers of an operation, ``ANY_OPERATION``'s and its own; every one has the
    Error body."""
    return {str(s): {"$ref": f"#/components/responses/E{s}"} for s in sorted({*ANY_OPERATION, *statuses})}


MESSAGE_FILTERS = [
    param("source", "query", {"type": "string"}, "only this source"),
    SEGMENTS,
    param(
        "header.{name}",
        "query",
        {"type": "string"},
        "only messages whose header {name} has this value (repeatable, any name)",
    ),
    param(
        "json.{path}",
        "query",
        {"type": "string"},
        "only JSON payloads whose field at the dotted path equals this JSON value "
        '(42, true, "text"; anything else is a string)',
    ),
]


# Path parameters by name and the path segment before them ("name" is a subscription's name
# under subscriptions/, a handler's under handlers/ ...).
_PATH_PARAMS = {
    ("queues", "queue"): QUEUE,
    ("topics", "topic"): TOPIC,
    ("subscriptions", "name"): SUBSCRIPTION,
    ("scheduled", "id"): SCHEDULED_ID,
    ("work", "id"): param("id", "path", STORED_ID, "Message id"),
    ("handlers", "name"): HANDLER,
    ("clusters", "name"): CLUSTER,
    ("users", "name"): USER,
    # OpenAPI's path parameters hold no "/" (a client sends it as %2F, which the relay refuses):
    # the document states one segment; the server takes several, joined by "/".
    ("v1", "path"): param(
        "path",
        "path",
        {"type": "string", "pattern": f"^{fields.RELAY_SEGMENT}$"},
        "The path on the far cluster, after /v1/: segments of letters, digits, '_', '-', '.' and '~' "
        "(not first), unencoded, joined by '/' (which a path parameter cannot hold)",
    ),
    ("ui", "file"): param("file", "path", {"type": "string", "pattern": r"^[\w.-]+$"}, "File name"),
    ("tokens", "id"): param("id", "path", {"type": "string", "pattern": r"^[0-9a-f]{16}$"}, "Token id"),
}


def path_parameters(path: str) -> list[dict[str, Any]]:
    parts = path.strip("/").split("/")
    return [
        _PATH_PARAMS[(parts[i - 1], part[1:-1])]
        for i, part in enumerate(parts)
        if part.startswith("{") and part.endswith("}")
    ]


def operation(route: Route) -> dict[str, Any]:
    responses = {str(status): answer for status, answer in route.answers.items()}
    if route.fails is not None:
        responses.update(fails(*route.fails))
    op: dict[str, Any] = {
        "operationId": route.op,
        "summary": route.summary,
        "responses": responses,
        "tags": [route.tag],
    }
    if route.params:
        op["parameters"] = list(route.params)
    if route.body is not None:
        op["requestBody"] = route.body
    if route.need is None:
        op["security"] = []  # answers without credentials
    return op


def document(routes: list[Route]) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``routes``: paths from the table, schemas from ``SCHEMAS``."""
    paths: dict[str, Any] = {}
    for route in routes:
        item = paths.setdefault(route.path, {})
        if (params := path_parameters(route.path)) and "parameters" not in item:
            item["parameters"] = params
        item[route.method.lower()] = operation(route)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Capella",
            "version": "1",
            "description": "A block-based, replicated message broker. See docs/api.md.",
        },
        "paths": paths,
        # Enforced when [auth] enabled = true; with auth off (loopback only) no credentials are needed.
        "security": [{"basic": []}, {"bearer": []}],
        "components": {
            "securitySchemes": {
                "basic": {"type": "http", "scheme": "basic"},
                "bearer": {"type": "http", "scheme": "bearer", "description": "A token from POST /v1/tokens"},
            },
            "schemas": schemas(),
            "responses": {
                f"E{status}": {"description": error_text(kinds), "content": json_content(ref("Error"))}
                for status, kinds in answered().items()
            },
        },
    }


# The rendered document, built on the first request for it.
DOCUMENT_BODY: web.AppKey[Callable[[], bytes]] = web.AppKey("openapi")


async def serve(request: web.Request) -> web.Response:
    return web.Response(body=request.app[DOCUMENT_BODY](), content_type=wire.JSON)


ROUTES = [
    Route(
        "GET",
        "/v1/openapi.json",
        serve,
        need=None,
        op="openapi",
        summary="This document",
        tag="operations",
        answers={200: answer("OpenAPI 3.1", {"type": "object"})},
        fails=None,
    ),
]
