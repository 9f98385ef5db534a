"""Every handler period has a floor: a narrow user cannot make a handler spin.

Issue 33: a flush handler with ``interval: 1e-9`` was accepted and used 0.8 of a core. Every
type's ``interval``, copy's and push's long poll ``wait`` and push's retry ``delay`` and
``max_delay`` take at least ``MIN_PERIOD`` (0 stays where it means "none": copy's interval,
the long polls), and the document says so.
"""

from __future__ import annotations

from typing import Any

from capella.wire.fields import MIN_PERIOD
from security.conftest import Secured, StartSecured

LOOPBACK = '[egress]\nallow = ["127.0.0.0/8", "::1/128"]\n\n'
DSN = "postgresql://app@127.0.0.1:1/db?sslmode=disable"
# Each type's smallest definition, and the params that are periods.
TYPES: dict[str, tuple[dict[str, Any], dict[str, Any], tuple[str, ...]]] = {
    "flush": ({"queue": "dev-q"}, {}, ("interval",)),
    "unload": ({"queue": "dev-q"}, {}, ("interval",)),
    "archive": ({"queue": "dev-q"}, {"conditions": [{"mark": 0}]}, ("interval",)),
    "expire": ({"queue": "dev-q"}, {"max_age": "1d"}, ("interval",)),
    "copy": ({"queue": "dev-q"}, {"to": "dev-copy"}, ("interval", "wait")),
    "push": (
        {"queue": "dev-q"},
        {"url": "http://127.0.0.1:1/hook", "delay": 0.01},
        ("wait", "delay", "max_delay"),
    ),
    "pg_outbox": ({}, {"to": "dev-q", "dsn": DSN}, ("interval",)),
    "pg_inbox": ({"queue": "dev-q"}, {"dsn": DSN}, ("interval",)),
}
# Where 0 means none (continuous, or no long poll), it is taken.
ZERO_TAKEN = {("copy", "interval"), ("copy", "wait"), ("push", "wait")}


def define(secured: Secured, kind: str, period: str, value: object) -> Any:
    top, params, _ = TYPES[kind]
    body = {"type": kind, **top, "started": False, "params": {**params, period: value}}
    return secured.call("PUT", f"/v1/handlers/dev-{kind}", body)


def test_every_period_below_the_floor_is_refused_and_the_floor_is_taken(start_secured: StartSecured) -> None:
    secured = start_secured(LOOPBACK)
    for queue in ("dev-q", "dev-copy"):
        assert secured.call("PUT", f"/v1/queues/{queue}", {}).status == 201
    for kind, (_, _, periods) in TYPES.items():
        for period in periods:
            for below in (1e-9, MIN_PERIOD / 2, "1ms", "5000us"):
                answer = define(secured, kind, period, below)
                assert answer.status == 400, (kind, period, below, answer.body)
                assert answer.body["error"]["code"] == "invalid_request"
                assert answer.body["error"]["field"] == f"params.{period}", answer.body
                assert f"at least {MIN_PERIOD:g} seconds" in answer.body["error"]["message"]
            for floor in (MIN_PERIOD, "10ms"):
                answer = define(secured, kind, period, floor)
                assert answer.status in (200, 201), (kind, period, floor, answer.body)
                assert answer.body["params"][period] == MIN_PERIOD
            zero = define(secured, kind, period, 0)
            assert (zero.status in (200, 201)) == ((kind, period) in ZERO_TAKEN), (kind, period, zero.body)


def test_the_document_declares_the_floor(secured: Secured) -> None:
    schemas = secured.call("GET", "/v1/openapi.json").body["components"]["schemas"]
    numbers = [
        s for s in schemas["FlushParams"]["properties"]["interval"]["anyOf"] if s.get("type") == "number"
    ]
    assert numbers == [{"type": "number", "minimum": MIN_PERIOD}]
    wait = schemas["CopyParams"]["properties"]["wait"]["anyOf"]
    assert {"const": 0} in wait and {"type": "number", "minimum": MIN_PERIOD} in wait
