"""The OpenAPI 3.1 document of the HTTP API (docs/api.md), served at ``GET /v1/openapi.json``.

The document is built once, as plain dicts, and rendered to bytes at import time.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from capella import wire

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
        "properties": {
            "limits": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "max_count": {"type": "integer", "minimum": 1, "maximum": 10_000_000},
                    "max_bytes": {
                        "oneOf": [{"type": "integer", "minimum": 1024, "maximum": 1024**3}, SIZE_TEXT],
                        "description": "from 1 KiB to 1 GiB",
                    },
                    "max_age": {**POSITIVE_DURATION, "description": "greater than 0"},
                },
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
    "unknown_receipt, handler_not_found, cluster_not_found, user_not_found, token_not_found",
    405: "method_not_allowed",
    408: "request_timeout: the body (or the request head) did not arrive within its deadline",
    409: "already_exists, conflict, wrong_subscription_mode, lease_lost",
    413: "payload_too_large: body, message or batch over the limit",
    503: "storage_unavailable, storage_timeout, shutting_down, corrupt_data, not_ready, too_many_connections",
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


def operation(
    op_id: str,
    summary: str,
    answers: dict[str, Any],
    *params: dict[str, Any],
    body: dict[str, Any] | None = None,
    tag: str = "",
) -> dict[str, Any]:
    op: dict[str, Any] = {"operationId": op_id, "summary": summary, "responses": answers}
    if tag:
        op["tags"] = [tag]
    if params:
        op["parameters"] = list(params)
    if body is not None:
        op["requestBody"] = body
    return op


PATHS: dict[str, Any] = {
    "/v1/queues": {
        "get": operation(
            "listQueues", "List queues", {"200": answer("Queues", ref("QueueList")), **fails()}, tag="queues"
        ),
    },
    "/v1/queues/{queue}": {
        "parameters": [QUEUE],
        "put": operation(
            "putQueue",
            "Create (201) or update (200) a queue",
            {
                "200": answer("Updated", ref("QueueInfo")),
                "201": answer("Created", ref("QueueInfo")),
                **fails(400, 408, 409, 413),
            },
            body={"required": False, "content": json_content(ref("QueueDefinition"))},
            tag="queues",
        ),
        "get": operation(
            "getQueue",
            "Describe a queue",
            {"200": answer("The queue", ref("QueueInfo")), **fails(404)},
            tag="queues",
        ),
        "delete": operation(
            "dropQueue",
            "Drop a queue and all its messages",
            {"204": answer("Dropped"), **fails(404)},
            tag="queues",
        ),
    },
    "/v1/queues/{queue}/messages": {
        "parameters": [QUEUE],
        "post": operation(
            "produce",
            "Append messages (a batch is stored whole or not at all)",
            {
                "200": answer("One result per message, in request order", ref("ProduceResults")),
                **fails(400, 404, 408, 413),
            },
            SAVE,
            param(
                "replicas",
                "query",
                {"type": "integer", "minimum": 0, "maximum": 1000},
                "wait until this many replica subscriptions have passed the batch (a receipt)",
            ),
            param(
                "replica_timeout",
                "query",
                DURATION,
                "how long to wait for the replicas (seconds or a duration; default 10 s, at most max_wait)",
            ),
            param(
                "source",
                "query",
                {"type": "string", "minLength": 1, "maxLength": 255},
                "octet-stream only: source (at most 255 bytes)",
            ),
            param("external_id", "query", INT64, "octet-stream only: external id"),
            param(
                "external_time",
                "query",
                {"type": "string", "pattern": TIME_TEXT_PATTERN},
                "octet-stream only: UNIX seconds or RFC 3339, not in the future",
            ),
            param("segment", "query", INT64, "octet-stream only: segment"),
            body={
                "required": True,
                "content": {
                    "application/json": {"schema": {"oneOf": [ref("MessageBatch"), ref("Message")]}},
                    wire.NDJSON: {"schema": {"type": "string", "description": "one Message object per line"}},
                    "application/octet-stream": {
                        "schema": {
                            "type": "string",
                            "format": "binary",
                            "description": "the payload; message headers from Capella-Header-<Name>",
                        },
                    },
                },
            },
            tag="messages",
        ),
        "get": operation(
            "readMessages",
            "Read messages after an id (long-poll with wait)",
            {"200": MESSAGES_ANSWER, **fails(400, 404)},
            AFTER,
            LIMIT,
            SEGMENTS,
            WAIT,
            ACCEPT,
            tag="messages",
        ),
    },
    "/v1/queues/{queue}/stream": {
        "parameters": [QUEUE],
        "get": operation(
            "streamMessages",
            "Server-Sent Events tail (event: message, id: message id)",
            {
                "200": {
                    "description": "An endless text/event-stream",
                    "content": {"text/event-stream": {"schema": SSE_EVENT}},
                },
                **fails(400, 404),
            },
            AFTER,
            SEGMENTS,
            param(
                "Last-Event-ID",
                "header",
                {"type": "string", "pattern": r"^\s*\d+\s*$"},
                "Resume after this message id (wins over after)",
            ),
            tag="messages",
        ),
    },
    "/v1/queues/{queue}/scheduled": {
        "parameters": [QUEUE],
        "get": operation(
            "listScheduled",
            "Delayed messages in delivery order",
            {"200": answer("A page of delayed messages", ref("ScheduledList")), **fails(400, 404)},
            LIMIT,
            param("after", "query", {"type": "string"}, "the next value of the previous page"),
            param(
                "due_after", "query", {"type": "string"}, "only due at or after this time (UNIX or RFC 3339)"
            ),
            param("due_before", "query", {"type": "string"}, "only due before this time (UNIX or RFC 3339)"),
            *MESSAGE_FILTERS,
            tag="scheduled",
        ),
    },
    "/v1/queues/{queue}/scheduled/cancel": {
        "parameters": [QUEUE],
        "post": operation(
            "cancelScheduledMany",
            "Cancel delayed messages by id",
            {"200": answer("What was cancelled", ref("CancelledScheduled")), **fails(400, 404, 408, 413)},
            SAVE,
            body={"required": True, "content": json_content(ref("CancelScheduled"))},
            tag="scheduled",
        ),
    },
    "/v1/queues/{queue}/scheduled/{id}": {
        "parameters": [QUEUE, SCHEDULED_ID],
        "get": operation(
            "getScheduled",
            "Describe a delayed message",
            {"200": answer("The delayed message", ref("ScheduledMessage")), **fails(400, 404)},
            tag="scheduled",
        ),
        "patch": operation(
            "reschedule",
            "Move a delayed message to another time (409 while it is being delivered)",
            {"200": answer("Rescheduled", ref("ScheduledMessage")), **fails(400, 404, 408, 409, 413)},
            SAVE,
            body={"required": True, "content": json_content(ref("Reschedule"))},
            tag="scheduled",
        ),
        "delete": operation(
            "cancelScheduled",
            "Cancel a delayed message (409 while it is being delivered)",
            {"204": answer("Cancelled"), **fails(400, 404, 409)},
            SAVE,
            tag="scheduled",
        ),
    },
    "/v1/queues/{queue}/subscriptions": {
        "parameters": [QUEUE],
        "get": operation(
            "listSubscriptions",
            "List a queue's subscriptions",
            {"200": answer("Subscriptions", ref("SubscriptionList")), **fails(404)},
            tag="subscriptions",
        ),
    },
    "/v1/queues/{queue}/subscriptions/{name}": {
        "parameters": [QUEUE, SUBSCRIPTION],
        "put": operation(
            "commitSubscription",
            "Create (201) or commit (200); never moves backwards unless reset",
            {
                "200": answer("Committed", ref("Subscription")),
                "201": answer("Created", ref("Subscription")),
                **fails(400, 404, 408, 413),
            },
            SAVE,
            body={"required": False, "content": json_content(ref("SubscriptionCommit"))},
            tag="subscriptions",
        ),
        "get": operation(
            "getSubscription",
            "Describe a subscription",
            {"200": answer("The subscription", ref("Subscription")), **fails(404)},
            tag="subscriptions",
        ),
        "delete": operation(
            "deleteSubscription",
            "Delete a subscription",
            {"204": answer("Deleted"), **fails(404)},
            tag="subscriptions",
        ),
    },
    "/v1/queues/{queue}/subscriptions/{name}/messages": {
        "parameters": [QUEUE, SUBSCRIPTION],
        "get": operation(
            "readSubscription",
            "Read after the subscription's cursor; commit=auto moves it",
            {"200": MESSAGES_ANSWER, **fails(400, 404)},
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
            tag="subscriptions",
        ),
    },
    "/v1/queues/{queue}/subscriptions/{name}/claim": {
        "parameters": [QUEUE, SUBSCRIPTION],
        "post": operation(
            "claim",
            "Lease messages of an ack-mode subscription: due retries first, then new ones in id order",
            {"200": answer("Claimed messages (maybe none)", ref("Claimed")), **fails(400, 404, 409)},
            param(
                "limit",
                "query",
                {"type": "integer", "minimum": 1, "default": 1},
                "At most this many messages (capped at the server's max_limit)",
            ),
            param("lease", "query", DURATION, "How long the claim is held (default: the policy's)"),
            WAIT,
            SAVE,
            tag="work",
        ),
    },
    **{
        f"/v1/queues/{{queue}}/subscriptions/{{name}}/{verb}": {
            "parameters": [QUEUE, SUBSCRIPTION],
            "post": operation(
                verb,
                summary,
                {
                    "200": answer("One result per receipt", ref("ReceiptResults")),
                    **fails(400, 404, 408, 409, 413),
                },
                SAVE,
                body={"required": True, "content": json_content(ref("Receipts"))},
                tag="work",
            ),
        }
        for verb, summary in (
            ("ack", "Finish claimed messages"),
            ("nack", "Give claimed messages back with an error: retried after a delay, or dead"),
            ("extend", "Lengthen the lease of claimed messages"),
        )
    },
    "/v1/queues/{queue}/subscriptions/{name}/work": {
        "parameters": [QUEUE, SUBSCRIPTION],
        "get": operation(
            "listWork",
            "Messages of an ack-mode subscription by status, filtered, in id order",
            {"200": answer("A page", ref("WorkList")), **fails(400, 404, 409)},
            param(
                "status",
                "query",
                {"type": "string"},
                "comma-separated: pending, in_flight, failed, dead (default all)",
            ),
            *MESSAGE_FILTERS,
            AFTER,
            LIMIT,
            tag="work",
        ),
    },
    "/v1/queues/{queue}/subscriptions/{name}/work/{id}": {
        "parameters": [QUEUE, SUBSCRIPTION, param("id", "path", MESSAGE_ID, "Message id")],
        "get": operation(
            "getWork",
            "One message's status, attempts and last error",
            {"200": answer("The message", ref("WorkMessage")), **fails(400, 404, 409)},
            tag="work",
        ),
    },
    "/v1/queues/{queue}/subscriptions/{name}/work/retry": {
        "parameters": [QUEUE, SUBSCRIPTION],
        "post": operation(
            "retryWork",
            "Make waiting messages claimable now (or at), and move dead ones back",
            {
                "200": answer(
                    "What was retried",
                    {
                        "type": "object",
                        "required": ["retried", "next_after"],
                        "properties": {
                            "retried": {"type": "array", "items": MESSAGE_ID},
                            "next_after": {"type": ["integer", "null"]},
                        },
                    },
                ),
                **fails(400, 404, 408, 409, 413),
            },
            SAVE,
            body={"required": False, "content": json_content(ref("WorkSelection"))},
            tag="work",
        ),
    },
    "/v1/queues/{queue}/subscriptions/{name}/work/delete": {
        "parameters": [QUEUE, SUBSCRIPTION],
        "post": operation(
            "deleteWork",
            "Finish messages without processing them (skip)",
            {
                "200": answer(
                    "What was deleted",
                    {
                        "type": "object",
                        "required": ["deleted", "next_after"],
                        "properties": {
                            "deleted": {"type": "array", "items": MESSAGE_ID},
                            "next_after": {"type": ["integer", "null"]},
                        },
                    },
                ),
                **fails(400, 404, 408, 409, 413),
            },
            SAVE,
            body={"required": True, "content": json_content(ref("WorkSelection"))},
            tag="work",
        ),
    },
    "/v1/queues/{queue}/replicas": {
        "parameters": [QUEUE],
        "get": operation(
            "replicas",
            "Replica subscriptions whose cursor is at or past id",
            {"200": answer("Replicas", ref("Replicas")), **fails(400, 404)},
            param("id", "query", MESSAGE_ID, "Message id", required=True),
            tag="subscriptions",
        ),
    },
    "/v1/handlers": {
        "get": operation(
            "listHandlers",
            "List handlers, sorted by name",
            {"200": answer("Handlers", ref("HandlerList")), **fails()},
            tag="handlers",
        ),
    },
    "/v1/handlers/{name}": {
        "parameters": [HANDLER],
        "put": operation(
            "putHandler",
            "Create (201) or replace (200) a handler; started unless started is false",
            {
                "200": answer("Replaced", ref("HandlerInfo")),
                "201": answer("Created", ref("HandlerInfo")),
                **fails(400, 408, 413),
            },
            body={"required": True, "content": json_content(ref("HandlerDefinition"))},
            tag="handlers",
        ),
        "get": operation(
            "getHandler",
            "Describe a handler and its status",
            {"200": answer("The handler", ref("HandlerInfo")), **fails(404)},
            tag="handlers",
        ),
        "delete": operation(
            "dropHandler",
            "Stop a handler and delete its definition",
            {"204": answer("Dropped"), **fails(404)},
            tag="handlers",
        ),
    },
    "/v1/handlers/{name}/start": {
        "parameters": [HANDLER],
        "post": operation(
            "startHandler",
            "Start the handler's loop (kept across restarts)",
            {"200": answer("The handler", ref("HandlerInfo")), **fails(404)},
            tag="handlers",
        ),
    },
    "/v1/handlers/{name}/stop": {
        "parameters": [HANDLER],
        "post": operation(
            "stopHandler",
            "Stop the handler's loop, waiting for a running pass to end (kept across restarts)",
            {"200": answer("The handler", ref("HandlerInfo")), **fails(404)},
            tag="handlers",
        ),
    },
    "/v1/handlers/{name}/run": {
        "parameters": [HANDLER],
        "post": operation(
            "runHandler",
            "Run one pass now, started or not; answers after it",
            {"200": answer("The handler after the pass", ref("HandlerInfo")), **fails(404)},
            tag="handlers",
        ),
    },
    "/v1/clusters": {
        "get": operation(
            "listClusters",
            "List external clusters, sorted by name (no secrets)",
            {"200": answer("External clusters", ref("ClusterList")), **fails()},
            tag="clusters",
        ),
    },
    "/v1/clusters/{name}": {
        "parameters": [CLUSTER],
        "put": operation(
            "putCluster",
            "Register (201) or replace (200) an external cluster",
            {
                "200": answer("Replaced", ref("ClusterInfo")),
                "201": answer("Created", ref("ClusterInfo")),
                **fails(400, 408, 413),
            },
            body={"required": True, "content": json_content(ref("ClusterDefinition"))},
            tag="clusters",
        ),
        "get": operation(
            "getCluster",
            "Describe an external cluster (no secrets)",
            {"200": answer("The cluster", ref("ClusterInfo")), **fails(404)},
            tag="clusters",
        ),
        "delete": operation(
            "dropCluster",
            "Forget an external cluster and its stored secret",
            {"204": answer("Dropped"), **fails(404)},
            tag="clusters",
        ),
    },
    "/v1/clusters/{name}/ping": {
        "parameters": [CLUSTER],
        "post": operation(
            "pingCluster",
            "Reach the cluster's /readyz and one authenticated call; a failure is ok false, not 5xx",
            {"200": answer("What happened", ref("ClusterPing")), **fails(404)},
            tag="clusters",
        ),
    },
    "/v1/users": {
        "get": operation(
            "listUsers",
            "Users the caller may read",
            {"200": answer("Users", ref("UserList")), **fails(404)},
            tag="users",
        ),
    },
    "/v1/users/{name}": {
        "parameters": [USER],
        "put": operation(
            "putUser",
            "Create (password required) or change a user",
            {
                "200": answer("Changed", ref("User")),
                "201": answer("Created", ref("User")),
                **fails(400, 404, 409),
            },
            body={"required": True, "content": json_content(ref("UserPut"))},
            tag="users",
        ),
        "get": operation(
            "getUser",
            "A user (never its password)",
            {"200": answer("User", ref("User")), **fails(404)},
            tag="users",
        ),
        "delete": operation(
            "dropUser",
            "Delete a user and revoke its tokens",
            {"204": answer("Deleted"), **fails(404, 409)},
            tag="users",
        ),
    },
    "/v1/users/{name}/password": {
        "parameters": [USER],
        "post": operation(
            "changePassword",
            "Change a password (your own with old_password, or as user admin)",
            {"200": answer("Changed", ref("User")), **fails(400, 404)},
            body={"required": True, "content": json_content(ref("PasswordChange"))},
            tag="users",
        ),
    },
    "/v1/me": {
        "get": operation(
            "me",
            "Who the credentials belong to",
            {"200": answer("Identity", ref("Me")), **fails()},
            tag="users",
        ),
    },
    "/v1/tokens": {
        "post": operation(
            "createToken",
            "A bearer token for yourself (from Basic credentials) or, as user admin, for another user",
            {"201": answer("Created; the token text is shown only now", ref("Token")), **fails(400, 404)},
            body={"required": False, "content": json_content(ref("TokenCreate"))},
            tag="users",
        ),
        "get": operation(
            "listTokens",
            "Your tokens, and those of users you administer",
            {"200": answer("Tokens", ref("TokenList")), **fails(404)},
            tag="users",
        ),
    },
    "/v1/tokens/{id}": {
        "parameters": [param("id", "path", {"type": "string", "pattern": r"^[0-9a-f]{16}$"}, "Token id")],
        "delete": operation(
            "revokeToken", "Revoke a token", {"204": answer("Revoked"), **fails(404)}, tag="users"
        ),
    },
    "/healthz": {
        "get": operation("healthz", "Liveness", {"200": answer("Serving", ref("Status"))}, tag="operations")
    },
    "/readyz": {
        "get": operation(
            "readyz",
            "Readiness: every queue recovered and accepting writes",
            {
                "200": answer("Ready", ref("Status")),
                "503": answer("Recovering, or a queue cannot accept writes", ref("Readiness")),
            },
            tag="operations",
        )
    },
    "/metrics": {
        "get": operation(
            "metrics",
            "Prometheus text format 0.0.4",
            {
                "200": {"description": "Metrics", "content": {"text/plain": {"schema": {"type": "string"}}}},
                **fails(),
            },
            tag="operations",
        )
    },
    "/v1/openapi.json": {
        "get": operation(
            "openapi", "This document", {"200": answer("OpenAPI 3.1", {"type": "object"})}, tag="operations"
        )
    },
}

DOCUMENT: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {
        "title": "Capella",
        "version": "1",
        "description": "A block-based, replicated message broker. See docs/api.md.",
    },
    "paths": PATHS,
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

# Liveness, readiness and this document answer without credentials.
for _public in ("/healthz", "/readyz", "/v1/openapi.json"):
    PATHS[_public]["get"]["security"] = []

BODY = wire.dumps(DOCUMENT)


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/v1/openapi.json", serve)


async def serve(request: web.Request) -> web.Response:
    return web.Response(body=BODY, content_type=wire.JSON)
