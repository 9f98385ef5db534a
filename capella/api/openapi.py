"""The OpenAPI 3.1 document of the HTTP API (docs/api.md), served at ``GET /v1/openapi.json``.

``document(routes)`` builds it from the route table (each module's ``ROUTES``): paths,
operations, parameters and answers come from the rows, the schemas from ``SCHEMAS`` here.
``create_app`` renders it to bytes once.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from capella import wire
from capella.api.route import Route

NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$"
SEGMENTS_PATTERN = r"^\s*-?\d+(--?\d+)?(\s*,\s*-?\d+(--?\d+)?)*\s*$"
INT64 = {"type": "integer", "format": "int64", "minimum": wire.INT64_MIN, "maximum": wire.INT64_MAX}
MESSAGE_ID = {"type": "integer", "format": "int64", "minimum": 0, "maximum": wire.INT64_MAX}
TIME = {"type": "number", "description": "UNIX seconds"}
SAVE_MODES = ["none", "immediate", "mark", "wait", "default", "0", "1", "2", "3", "4"]
DEFINITION_SAVE_MODES = ["none", "immediate", "mark", "wait", "0", "1", "2", "3"]
BASE64_PATTERN = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
TIME_TEXT_PATTERN = r"^(\d+(\.\d+)?|\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2}))$"
DURATION_TEXT = {"type": "string", "pattern": r"^\s*\d+(\.\d+)?\s*(ns|us|ms|s|m|h|d)?\s*$"}
DURATION = {"oneOf": [{"type": "number", "minimum": 0}, DURATION_TEXT]}
# A text duration of zero ("0s") is refused too; a pattern that said so would be unreadable.
POSITIVE_DURATION = {"oneOf": [{"type": "number", "exclusiveMinimum": 0}, DURATION_TEXT]}
# Handler durations also take integers of nanoseconds (>= 1e12), as the original API did.
HANDLER_DURATION = POSITIVE_DURATION
HANDLER_TYPES = ["flush", "unload", "archive", "expire", "copy"]
COMPRESSIONS = ["none", "gzip", "zstd"]
ENV_NAME = {"type": "string", "pattern": r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"}
SIZE_TEXT = {"type": "string", "pattern": r"^\s*\d+(\.\d+)?\s*([kmgtKMGT][iI]?[bB]?|[bB])?\s*$"}
SIZE = {"oneOf": [{"type": "integer", "minimum": 0}, SIZE_TEXT]}
CREDENTIALS = ("password", "password_env", "token", "token_env")
# A queue's block limits: when a block is sealed.
BLOCK_MESSAGES = {"type": "integer", "minimum": 1, "maximum": 10_000_000}
BLOCK_BYTES = {
    "oneOf": [{"type": "integer", "minimum": 1024, "maximum": 1024**3}, SIZE_TEXT],
    "description": "from 1 KiB to 1 GiB",
}
BLOCK_AGE = {**POSITIVE_DURATION, "description": "greater than 0"}


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def json_content(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def answer(description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    if schema is None:
        return {"description": description}
    return {"description": description, "content": json_content(schema)}


def param(
    name: str, where: str, schema: dict[str, Any], description: str, required: bool = False
) -> dict[str, Any]:
    return {
        "name": name,
        "in": where,
        "required": required or where == "path",
        "schema": schema,
        "description": description,
    }


QUEUE = param("queue", "path", {"type": "string", "pattern": NAME_PATTERN}, "Queue name")
SUBSCRIPTION = param("name", "path", {"type": "string", "pattern": NAME_PATTERN}, "Subscription name")
SCHEDULED_ID = param("id", "path", MESSAGE_ID, "Scheduled message id (scheduled_id)")
HANDLER = param("name", "path", {"type": "string", "pattern": NAME_PATTERN}, "Handler name")
CLUSTER = param("name", "path", {"type": "string", "pattern": NAME_PATTERN}, "External cluster name")
USER = param(
    "name", "path", {"type": "string", "pattern": r"^[A-Za-z0-9][A-Za-z0-9_.@\-]{0,127}$"}, "User name"
)
SAVE = param("save", "query", {"type": "string", "enum": SAVE_MODES}, "Save mode (default: the queue's)")
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
    {"type": "string", "pattern": SEGMENTS_PATTERN},
    "Inclusive segment ranges, e.g. 0-9,20-29,42",
)
WAIT = param("wait", "query", DURATION, "Long-poll up to this many seconds (capped at max_wait)")
ACCEPT = param(
    "Accept",
    "header",
    {"type": "string"},
    "application/x-ndjson for one StoredMessage per line (last_id in Capella-Last-Id)",
)

MESSAGES_ANSWER = {
    "description": "Messages after the cursor",
    "headers": {"Capella-Last-Id": {"description": "last_id (NDJSON answers)", "schema": MESSAGE_ID}},
    "content": {
        "application/json": {"schema": ref("Messages")},
        wire.NDJSON: {"schema": {"type": "string", "description": "one StoredMessage per line"}},
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

SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["code", "message"],
                "properties": {
                    "code": {"type": "string"},
                    "message": {"type": "string"},
                    "index": {"type": "integer", "description": "index of the bad message"},
                    "field": {"type": "string", "description": "the bad field"},
                    "parameter": {"type": "string", "description": "the bad query parameter"},
                    "limit": {"type": "integer", "description": "the limit that was exceeded"},
                },
            }
        },
    },
    "QueueDefinition": {
        "type": "object",
        "additionalProperties": False,
        "not": {"required": ["block", "limits"]},
        "properties": {
            "block": {
                "type": "object",
                "additionalProperties": False,
                "description": "a block is sealed when it reaches any of these (not retention)",
                "properties": {
                    "max_messages": BLOCK_MESSAGES,
                    "max_bytes": BLOCK_BYTES,
                    "max_age": BLOCK_AGE,
                },
            },
            "limits": {
                "type": "object",
                "additionalProperties": False,
                "deprecated": True,
                "description": "the old name of block, with max_count for max_messages; not with block",
                "properties": {"max_count": BLOCK_MESSAGES, "max_bytes": BLOCK_BYTES, "max_age": BLOCK_AGE},
            },
            "save": {"type": "string", "enum": DEFINITION_SAVE_MODES},
            "subscription_save": {"type": "string", "enum": DEFINITION_SAVE_MODES},
            "segments": {
                "type": ["object", "null"],
                "description": "min must not be greater than max; null removes the range",
                "additionalProperties": False,
                "properties": {"min": INT64, "max": INT64},
                "required": ["min", "max"],
            },
            "mounts": {
                "type": "object",
                "additionalProperties": False,
                "description": "names of configured mounts; meta cannot change on an existing queue",
                "properties": {
                    "meta": {"type": "string"},
                    "marks": {
                        "type": "object",
                        "description": "mark (0-255) → mount; must map mark 0",
                        "required": ["0"],
                        "propertyNames": {"pattern": "^[0-9]{1,3}$"},
                        "additionalProperties": {"type": "string"},
                    },
                },
            },
        },
    },
    "QueueStats": {
        "type": "object",
        "required": ["first_id", "last_id", "messages", "bytes", "blocks", "subscriptions"],
        "properties": {
            "first_id": {"type": "integer"},
            "last_id": {"type": "integer"},
            "messages": {"type": "integer"},
            "bytes": {"type": "integer"},
            "blocks": {
                "type": "object",
                "properties": {
                    "total": {"type": "integer"},
                    "by_mark": {"type": "object", "additionalProperties": {"type": "integer"}},
                    "by_state": {"type": "object", "additionalProperties": {"type": "integer"}},
                },
            },
            "subscriptions": {"type": "integer"},
            "recovery": {
                "type": "object",
                "properties": {
                    "truncated_bytes": {"type": "integer"},
                    "quarantined_blocks": {"type": "array"},
                    "gaps": {"type": "array"},
                },
            },
            "writable": {"type": "boolean", "description": "Whether the queue accepts writes now"},
            "faults": {
                "type": "array",
                "description": "What stops writes: the failing step, its last error, since when",
                "items": {
                    "type": "object",
                    "required": ["step", "error", "since"],
                    "properties": {
                        "step": {"enum": ["journal", "seal", "state"]},
                        "error": {"type": "string"},
                        "since": {"type": "number"},
                    },
                },
            },
            "last_error": {"type": ["string", "null"]},
        },
    },
    "QueueInfo": {
        "type": "object",
        "required": ["name", "definition", "stats"],
        "properties": {
            "name": {"type": "string"},
            "definition": {"type": "object", "description": "QueueDefinition, fully resolved"},
            "stats": ref("QueueStats"),
        },
    },
    "QueueList": {
        "type": "object",
        "required": ["queues"],
        "properties": {"queues": {"type": "array", "items": ref("QueueInfo")}},
    },
    "Message": {
        "type": "object",
        "description": "Exactly one of data (UTF-8 text) and data_b64 (standard base64).",
        "oneOf": [{"required": ["data"]}, {"required": ["data_b64"]}],
        "additionalProperties": False,
        "properties": {
            "data": {"type": "string"},
            "data_b64": {"type": "string", "contentEncoding": "base64", "pattern": BASE64_PATTERN},
            "source": {
                "type": "string",
                "minLength": 1,
                "maxLength": 255,
                "description": "at most 255 bytes of UTF-8; default the cluster name",
            },
            "external_id": INT64,
            "external_time": {
                "oneOf": [{"type": "number", "minimum": 0}, {"type": "string", "format": "date-time"}],
                "description": "UNIX seconds or RFC 3339; not in the future",
            },
            "segment": INT64,
            "headers": {"type": "object", "additionalProperties": {"type": "string"}},
            "deliver_at": {
                "oneOf": [{"type": "number"}, {"type": "string", "format": "date-time"}],
                "description": "UNIX seconds or RFC 3339: hold the message back until then (at most "
                "ten years ahead; a time in the past delivers at once)",
            },
            "delay": {**DURATION, "description": "hold the message back this long (not with deliver_at)"},
        },
    },
    "MessageBatch": {
        "type": "object",
        "required": ["messages"],
        "additionalProperties": False,
        "properties": {"messages": {"type": "array", "items": ref("Message")}},
    },
    "ProduceResults": {
        "type": "object",
        "required": ["results"],
        "properties": {
            "results": {
                "type": "array",
                "items": {
                    "type": "object",
                    "description": "id for a message stored now; scheduled_id and deliver_at for a "
                    "delayed one (its id comes when it is delivered)",
                    "required": ["duplicate"],
                    "properties": {
                        "id": MESSAGE_ID,
                        "scheduled_id": MESSAGE_ID,
                        "deliver_at": TIME,
                        "duplicate": {"type": "boolean"},
                    },
                },
            },
            "replicas": {
                "type": "object",
                "description": "with replicas=N: the replica subscriptions that have the batch",
                "required": ["required", "count", "subscriptions"],
                "properties": {
                    "required": {"type": "integer"},
                    "count": {"type": "integer"},
                    "subscriptions": {"type": "array", "items": {"type": "string"}},
                },
            },
        },
    },
    "StoredMessage": {
        "type": "object",
        "required": ["id", "time", "source", "external_id", "external_time", "segment", "headers"],
        "properties": {
            "id": MESSAGE_ID,
            "time": TIME,
            "source": {"type": "string"},
            "external_id": INT64,
            "external_time": TIME,
            "segment": INT64,
            "headers": {"type": "object", "additionalProperties": {"type": "string"}},
            "data": {"type": "string"},
            "data_b64": {"type": "string", "contentEncoding": "base64"},
        },
    },
    "Messages": {
        "type": "object",
        "required": ["messages", "last_id"],
        "properties": {
            "messages": {"type": "array", "items": ref("StoredMessage")},
            "last_id": {"type": "integer", "description": "pass as the next after"},
        },
    },
    "ScheduledMessage": {
        "type": "object",
        "required": [
            "scheduled_id",
            "deliver_at",
            "created",
            "source",
            "external_id",
            "external_time",
            "segment",
            "headers",
        ],
        "properties": {
            "scheduled_id": MESSAGE_ID,
            "deliver_at": TIME,
            "created": TIME,
            "source": {"type": "string"},
            "external_id": {**INT64, "description": "the scheduled_id when the producer gave none"},
            "external_time": {**TIME, "type": ["number", "null"]},
            "segment": INT64,
            "headers": {"type": "object", "additionalProperties": {"type": "string"}},
            "data": {"type": "string"},
            "data_b64": {"type": "string", "contentEncoding": "base64"},
        },
    },
    "ScheduledList": {
        "type": "object",
        "required": ["scheduled", "count", "next"],
        "properties": {
            "scheduled": {"type": "array", "items": ref("ScheduledMessage")},
            "count": {"type": "integer", "description": "everything scheduled in the queue"},
            "next": {"type": ["string", "null"], "description": "pass as after for the next page"},
        },
    },
    "Reschedule": {
        "type": "object",
        "description": "exactly one of deliver_at and delay",
        "additionalProperties": False,
        "properties": {
            "deliver_at": {"oneOf": [{"type": "number"}, {"type": "string", "format": "date-time"}]},
            "delay": DURATION,
        },
    },
    "CancelScheduled": {
        "type": "object",
        "required": ["ids"],
        "additionalProperties": False,
        "properties": {"ids": {"type": "array", "maxItems": 10_000, "items": MESSAGE_ID}},
    },
    "CancelledScheduled": {
        "type": "object",
        "required": ["cancelled", "not_cancelled"],
        "properties": {
            "cancelled": {"type": "array", "items": MESSAGE_ID},
            "not_cancelled": {
                "type": "array",
                "items": MESSAGE_ID,
                "description": "already delivered, being delivered right now, or unknown",
            },
        },
    },
    "SubscriptionCommit": {
        "type": "object",
        "description": "a cursor takes last_id, replica and reset; an ack-mode subscription takes "
        "mode ack and policy (its mode never changes)",
        "additionalProperties": False,
        "properties": {
            "last_id": {"type": ["integer", "null"], "minimum": 0, "maximum": wire.INT64_MAX},
            "replica": {"type": ["boolean", "null"]},
            "reset": {"type": "boolean", "default": False},
            "mode": {"type": "string", "enum": ["cursor", "ack"], "default": "cursor"},
            "policy": ref("RetryPolicy"),
        },
    },
    "RetryPolicy": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "lease": {**DURATION, "description": "default lease of a claim (30 s; at most 12 h)"},
            "max_attempts": {
                "type": "integer",
                "minimum": 0,
                "maximum": 1_000_000,
                "description": "claims before a failure goes to the dead letters (5; 0: no limit)",
            },
            "backoff": {"type": "string", "enum": ["fixed", "exponential"], "default": "exponential"},
            "delay": {**DURATION, "description": "first retry delay (1 s); fixed: every retry"},
            "max_delay": {**DURATION, "description": "cap of a retry delay (300 s)"},
            "jitter": {"type": "number", "minimum": 0, "maximum": 1, "description": "± fraction (0.1)"},
            "dead_letter": {
                "type": ["string", "null"],
                "description": "an existing queue that gets a copy of each dead message",
            },
        },
    },
    "Subscription": {
        "type": "object",
        "required": ["name", "mode", "last_id", "replica", "lag", "created", "updated"],
        "properties": {
            "name": {"type": "string"},
            "mode": {"type": "string", "enum": ["cursor", "ack"]},
            "last_id": {"type": "integer", "description": "ack mode: every id up to it is finished"},
            "replica": {"type": "boolean"},
            "lag": {"type": "integer", "minimum": 0},
            "created": TIME,
            "updated": TIME,
            "policy": {**ref("RetryPolicy"), "description": "ack mode only, fully resolved"},
            "work": {
                "type": "object",
                "description": "ack mode only",
                "properties": {
                    "claimed_through": {"type": "integer", "description": "highest id ever claimed"},
                    "backlog": {"type": "integer", "description": "ids after claimed_through"},
                    "in_flight": {"type": "integer"},
                    "failed": {"type": "integer", "description": "given back, waiting for a retry"},
                    "dead": {"type": "integer"},
                },
            },
        },
    },
    "ClaimedMessage": {
        "allOf": [
            ref("StoredMessage"),
            {
                "type": "object",
                "required": ["receipt", "attempt", "lease_until", "last_error"],
                "properties": {
                    "receipt": {"type": "string", "pattern": r"^\d+\.\d+$"},
                    "attempt": {"type": "integer", "minimum": 1},
                    "lease_until": TIME,
                    "last_error": {"type": ["string", "null"]},
                },
            },
        ]
    },
    "Claimed": {
        "type": "object",
        "required": ["messages"],
        "properties": {"messages": {"type": "array", "items": ref("ClaimedMessage")}},
    },
    "WorkMessage": {
        "allOf": [
            ref("StoredMessage"),
            {
                "type": "object",
                "required": ["status", "attempts", "last_error"],
                "properties": {
                    "status": {
                        "type": "string",
                        "enum": ["in_flight", "failed", "pending", "dead", "done", "deleted"],
                    },
                    "attempts": {"type": "integer", "minimum": 0},
                    "last_error": {"type": ["string", "null"]},
                    "lease_until": {**TIME, "description": "in_flight"},
                    "retry_at": {**TIME, "description": "waiting (or ready again after a failure)"},
                    "died": {**TIME, "description": "dead"},
                },
            },
        ]
    },
    "WorkList": {
        "type": "object",
        "required": ["messages", "next_after"],
        "properties": {
            "messages": {"type": "array", "items": ref("WorkMessage")},
            "next_after": {
                "type": ["integer", "null"],
                "description": "pass as after for the next page; null when everything was looked at",
            },
        },
    },
    "WorkSelection": {
        "type": "object",
        "description": "which messages: status (retry: default waiting and dead; delete: status or ids is "
        "required), optional filters, at most limit of them after after",
        "additionalProperties": False,
        "properties": {
            "status": {
                "type": "array",
                "items": {"type": "string", "enum": ["in_flight", "failed", "pending", "dead"]},
            },
            "ids": {"type": "array", "maxItems": 10_000, "items": MESSAGE_ID},
            "source": {"type": "string"},
            "segments": {"type": "string", "pattern": SEGMENTS_PATTERN},
            "headers": {"type": "object", "additionalProperties": {"type": "string"}},
            "json": {"type": "object", "description": "dotted path of the JSON payload → value, all equal"},
            "after": MESSAGE_ID,
            "limit": {"type": "integer", "minimum": 1, "maximum": 10_000, "default": 1000},
            "at": {
                "oneOf": [{"type": "number"}, {"type": "string", "format": "date-time"}],
                "description": "retry: claimable from then (default now)",
            },
            "delay": {**DURATION, "description": "retry: claimable after this"},
        },
    },
    "Receipts": {
        "type": "object",
        "description": "exactly one of receipts (answered per receipt) and receipt (its error is the "
        "answer's status); nack also takes delay and error, extend takes lease",
        "additionalProperties": False,
        "properties": {
            "receipts": {"type": "array", "minItems": 1, "items": {"type": "string"}},
            "receipt": {"type": "string"},
            "delay": {**DURATION, "description": "nack: retry after this (default: the backoff)"},
            "error": {"type": "string", "description": "nack: why it failed (first 2048 characters kept)"},
            "lease": {**DURATION, "description": "extend: the new lease from now (default: the policy's)"},
        },
    },
    "ReceiptResult": {
        "type": "object",
        "required": ["receipt", "id", "ok"],
        "properties": {
            "receipt": {"type": "string"},
            "id": MESSAGE_ID,
            "ok": {"type": "boolean"},
            "lease_until": TIME,
            "retry_at": TIME,
            "dead": {"type": "boolean", "description": "nack: its attempts were used up"},
            "error": {
                "type": "object",
                "required": ["code", "message"],
                "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
            },
        },
    },
    "ReceiptResults": {
        "oneOf": [
            {
                "type": "object",
                "required": ["results"],
                "properties": {"results": {"type": "array", "items": ref("ReceiptResult")}},
            },
            ref("ReceiptResult"),
        ]
    },
    "SubscriptionList": {
        "type": "object",
        "required": ["subscriptions"],
        "properties": {"subscriptions": {"type": "array", "items": ref("Subscription")}},
    },
    "Replicas": {
        "type": "object",
        "required": ["id", "count", "subscriptions"],
        "properties": {
            "id": MESSAGE_ID,
            "count": {"type": "integer", "minimum": 0},
            "subscriptions": {"type": "array", "items": {"type": "string"}},
        },
    },
    "HandlerDefinition": {
        "type": "object",
        "required": ["type"],
        "description": "queues (or its shorthand queue) is required; params depend on type",
        "additionalProperties": False,
        "properties": {
            "type": {"type": "string", "enum": HANDLER_TYPES},
            "queues": {
                "type": "array",
                "minItems": 1,
                "items": {"type": "string", "minLength": 1},
                "description": "queue names or fnmatch patterns (orders, logs-*); "
                "a plain name must name an existing queue, a pattern may match none yet",
            },
            "queue": {"type": "string", "minLength": 1, "description": "shorthand for one queue"},
            "params": {"type": "object", "description": "by type: FlushParams for flush, and so on"},
            "started": {"type": "boolean", "default": True},
        },
        # The params of one type: a oneOf over all five would refuse {"interval": 5}, which
        # is valid flush, unload and expire params alike.
        "allOf": [
            {
                "if": {"required": ["type"], "properties": {"type": {"const": kind}}},
                "then": {"properties": {"params": ref(f"{kind.capitalize()}Params")}},
            }
            for kind in HANDLER_TYPES
        ],
    },
    "FlushParams": {
        "type": "object",
        "additionalProperties": False,
        "properties": {"interval": HANDLER_DURATION},
    },
    "UnloadParams": {
        "type": "object",
        "description": "with neither idle nor age, idle is 60 s",
        "additionalProperties": False,
        "properties": {
            "interval": HANDLER_DURATION,
            "idle": {**HANDLER_DURATION, "description": "unload blocks not read for this long"},
            "age": {**HANDLER_DURATION, "description": "unload blocks older than this"},
        },
    },
    "ArchiveParams": {
        "type": "object",
        "required": ["conditions"],
        "additionalProperties": False,
        "properties": {
            "interval": HANDLER_DURATION,
            "conditions": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "required": ["mark"],
                    "additionalProperties": False,
                    "properties": {
                        "mark": {
                            "type": "integer",
                            "minimum": 0,
                            "maximum": 255,
                            "description": "a mark the queue maps to a mount",
                        },
                        "from_age": {**DURATION, "description": "default 0"},
                        "to_age": {
                            "oneOf": [DURATION, {"type": "null"}],
                            "description": "null: no upper bound",
                        },
                    },
                },
            },
            "limit": {"type": "integer", "minimum": 1, "description": "blocks moved per pass"},
        },
    },
    "ExpireParams": {
        "type": "object",
        "description": "at least one of max_age, max_bytes and max_messages",
        "anyOf": [{"required": ["max_age"]}, {"required": ["max_bytes"]}, {"required": ["max_messages"]}],
        "additionalProperties": False,
        "properties": {
            "interval": HANDLER_DURATION,
            "max_age": HANDLER_DURATION,
            "max_bytes": SIZE,
            "max_messages": {"type": "integer", "minimum": 1},
        },
    },
    "CopyParams": {
        "type": "object",
        "required": ["to"],
        "additionalProperties": False,
        "properties": {
            "from": {"type": "string", "description": "the source queue when the definition names no queues"},
            "to": {"type": "string", "description": "the destination queue (local)"},
            "subscription": {
                "type": "string",
                "description": "the cursor on each source (default copy-to-<to>)",
            },
            "interval": {**HANDLER_DURATION, "description": "pause between passes (default 0: continuous)"},
            "batch": {"type": "integer", "minimum": 1},
            "wait": {**HANDLER_DURATION, "description": "long-poll when caught up (default 2 s)"},
            "segments": {
                "type": "array",
                "items": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2},
            },
            "save": {"type": "string", "enum": SAVE_MODES},
            "commit_save": {"type": "string", "enum": SAVE_MODES},
        },
    },
    "HandlerStatus": {
        "type": "object",
        "required": ["running", "runs", "items", "bytes", "last_complete", "last_error", "next_run"],
        "properties": {
            "running": {"type": "boolean", "description": "a pass is in progress"},
            "runs": {"type": "integer", "minimum": 0, "description": "passes completed"},
            "items": {"type": "integer", "minimum": 0, "description": "blocks or messages handled"},
            "bytes": {"type": "integer", "minimum": 0, "description": "bytes handled"},
            "last_complete": {**TIME, "type": ["number", "null"], "description": "end of the last good pass"},
            "last_error": {
                "type": ["object", "null"],
                "required": ["message", "time"],
                "properties": {"message": {"type": "string"}, "time": TIME},
            },
            "next_run": {**TIME, "type": ["number", "null"], "description": "null when stopped"},
        },
    },
    "HandlerInfo": {
        "type": "object",
        "required": ["name", "type", "queues", "params", "started", "status"],
        "properties": {
            "name": {"type": "string"},
            "type": {"type": "string", "enum": HANDLER_TYPES},
            "queues": {"type": "array", "items": {"type": "string"}},
            "params": {"type": "object", "description": "fully resolved; durations in seconds"},
            "started": {"type": "boolean"},
            "status": ref("HandlerStatus"),
        },
    },
    "HandlerList": {
        "type": "object",
        "required": ["handlers"],
        "properties": {"handlers": {"type": "array", "items": ref("HandlerInfo")}},
    },
    "ClusterDefinition": {
        "type": "object",
        "required": ["url"],
        "description": "at most one of password, password_env, token and token_env; "
        "a password (stored or from the environment) needs a username",
        "not": {
            "anyOf": [{"required": [a, b]} for i, a in enumerate(CREDENTIALS) for b in CREDENTIALS[i + 1 :]]
        },
        "dependentRequired": {"password": ["username"], "password_env": ["username"]},
        "additionalProperties": False,
        "properties": {
            "url": {"type": "string", "pattern": r"^https?://[^\s/@]+(/\S*)?$"},
            "username": {"type": "string", "minLength": 1},
            "password": {
                "type": "string",
                "minLength": 1,
                "writeOnly": True,
                "description": "stored encrypted with the server's key; never shown again",
            },
            "password_env": {**ENV_NAME, "description": "the variable the server reads it from"},
            "token": {
                "type": "string",
                "minLength": 1,
                "writeOnly": True,
                "description": "a bearer token, stored encrypted; never shown again",
            },
            "token_env": {**ENV_NAME, "description": "the variable the server reads it from"},
            "verify_tls": {"type": "boolean", "default": True},
            "ca_file": {"type": "string", "description": "a PEM file on the server that exists"},
            "connect_timeout": {**HANDLER_DURATION, "description": "default 5 s"},
            "timeout": {**HANDLER_DURATION, "description": "per request; default 30 s"},
            "compression": {
                "type": "string",
                "enum": COMPRESSIONS,
                "default": "none",
                "description": "Content-Encoding of request bodies of 1 KiB or more",
            },
        },
    },
    "ClusterInfo": {
        "type": "object",
        "description": "a link as shown: never its password or token",
        "required": ["name", "url", "credentials", "tls", "timeouts", "compression"],
        "properties": {
            "name": {"type": "string"},
            "url": {"type": "string"},
            "credentials": {
                "type": ["object", "null"],
                "required": ["kind", "username", "source"],
                "properties": {
                    "kind": {"type": "string", "enum": ["password", "token"]},
                    "username": {"type": ["string", "null"]},
                    "source": {
                        "type": "string",
                        "description": "env:<VARIABLE> or stored encrypted",
                    },
                },
            },
            "tls": {
                "type": "object",
                "required": ["verify", "ca_file"],
                "properties": {"verify": {"type": "boolean"}, "ca_file": {"type": ["string", "null"]}},
            },
            "timeouts": {
                "type": "object",
                "required": ["connect", "request"],
                "properties": {"connect": {"type": "number"}, "request": {"type": "number"}},
            },
            "compression": {"type": "string", "enum": COMPRESSIONS},
        },
    },
    "ClusterList": {
        "type": "object",
        "required": ["clusters"],
        "properties": {"clusters": {"type": "array", "items": ref("ClusterInfo")}},
    },
    "ClusterPing": {
        "type": "object",
        "required": ["ok", "error"],
        "properties": {
            "ok": {"type": "boolean", "description": "reached, ready, and the credentials accepted"},
            "ready": {"type": "boolean"},
            "latency_ms": {"type": "number", "description": "both calls, in milliseconds"},
            "error": {
                "type": ["object", "null"],
                "required": ["code", "message"],
                "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
            },
        },
    },
    "Status": {"type": "object", "required": ["status"], "properties": {"status": {"type": "string"}}},
    "Readiness": {
        "type": "object",
        "required": ["status"],
        "properties": {
            "status": {"enum": ["recovering", "not_writable"]},
            "queues": {
                "type": "array",
                "description": "The queues that cannot accept writes, with the storage error that stops them",
                "items": {
                    "type": "object",
                    "required": ["queue", "reason", "since"],
                    "properties": {
                        "queue": {"type": "string"},
                        "reason": {"type": "string"},
                        "since": {"type": "number", "description": "UNIX seconds of the first failure"},
                    },
                },
            },
        },
    },
    "Rule": {
        "type": "object",
        "required": ["effect", "type", "action"],
        "properties": {
            "effect": {"enum": ["allow", "deny"]},
            "type": {
                "enum": ["cluster", "queue", "subscription", "handler", "external_cluster", "user", "*"]
            },
            "action": {"enum": ["read", "write", "admin", "*"]},
            "name": {"type": "string", "minLength": 1, "description": "Name pattern; * matches anything"},
        },
        "additionalProperties": False,
    },
    "User": {
        "type": "object",
        "required": ["name", "admin", "enabled", "rules"],
        "properties": {
            "name": {"type": "string"},
            "admin": {"type": "boolean"},
            "enabled": {"type": "boolean"},
            "rules": {"type": "array", "items": ref("Rule")},
            "created": TIME,
            "updated": TIME,
        },
    },
    "UserList": {"type": "object", "properties": {"users": {"type": "array", "items": ref("User")}}},
    "UserPut": {
        "type": "object",
        "description": "password is required for a new user; only an admin may set admin or rules",
        "properties": {
            "password": {"type": "string", "minLength": 8, "maxLength": 1024},
            "admin": {"type": "boolean"},
            "enabled": {"type": "boolean"},
            "rules": {"type": "array", "items": ref("Rule")},
        },
        "additionalProperties": False,
    },
    "PasswordChange": {
        "type": "object",
        "required": ["password"],
        "properties": {
            "password": {"type": "string", "minLength": 8, "maxLength": 1024},
            "old_password": {"type": "string", "description": "Required to change your own password"},
        },
        "additionalProperties": False,
    },
    "Me": {
        "type": "object",
        "properties": {
            "user": {"type": ["string", "null"]},
            "admin": {"type": "boolean"},
            "via": {"enum": ["basic", "token", "tls", "none"]},
            "rules": {"type": "array", "items": ref("Rule")},
        },
    },
    "Token": {
        "type": "object",
        "required": ["id", "user", "created"],
        "properties": {
            "id": {"type": "string"},
            "user": {"type": "string"},
            "created": TIME,
            "expires": {"type": ["number", "null"]},
            "description": {"type": "string"},
            "token": {
                "type": "string",
                "description": "The bearer token; only in the answer that created it",
            },
        },
    },
    "TokenList": {"type": "object", "properties": {"tokens": {"type": "array", "items": ref("Token")}}},
    "TokenCreate": {
        "type": "object",
        "properties": {
            "ttl": DURATION,
            "description": {"type": "string", "maxLength": 200},
            "user": {"type": "string", "description": "Another user (needs user admin on it)"},
        },
        "additionalProperties": False,
    },
}

_ERROR_TEXT = {
    400: "invalid_request, invalid_message (with index), invalid_name, invalid_save_mode, invalid_config, "
    "json_too_deep",
    401: "unauthorized: no credentials, or not valid ones (with a WWW-Authenticate header)",
    403: "forbidden: the user's rules do not allow this",
    404: "not_found, queue_not_found, subscription_not_found, message_not_found, scheduled_not_found, "
    "unknown_receipt, handler_not_found, cluster_not_found, user_not_found, token_not_found, key_not_found",
    405: "method_not_allowed",
    408: "request_timeout: the body (or the request head) did not arrive within its deadline",
    409: "already_exists, conflict, wrong_subscription_mode, lease_lost",
    413: "payload_too_large: body, message or batch over the limit",
    431: "headers_too_large: the request line, a header or the number of headers is over the limit",
    500: "internal: a bug; the server log has the details",
    503: "storage_unavailable, storage_timeout, unsupported, shutting_down, corrupt_data, not_ready, "
    "too_many_connections",
}


def fails(*statuses: int) -> dict[str, Any]:
    """The error answers of an operation; every one has the Error body."""
    return {str(s): {"$ref": f"#/components/responses/E{s}"} for s in (401, 403, *statuses, 503)}


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
    ("subscriptions", "name"): SUBSCRIPTION,
    ("scheduled", "id"): SCHEDULED_ID,
    ("work", "id"): param("id", "path", MESSAGE_ID, "Message id"),
    ("handlers", "name"): HANDLER,
    ("clusters", "name"): CLUSTER,
    ("users", "name"): USER,
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
            "schemas": SCHEMAS,
            "responses": {
                f"E{status}": {"description": text, "content": json_content(ref("Error"))}
                for status, text in _ERROR_TEXT.items()
            },
        },
    }


DOCUMENT_BODY = web.AppKey("openapi", bytes)


async def serve(request: web.Request) -> web.Response:
    return web.Response(body=request.app[DOCUMENT_BODY], content_type=wire.JSON)


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
