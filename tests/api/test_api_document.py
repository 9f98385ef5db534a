"""The document and the server agree: one test for each disagreement schemathesis found.

Each sends what the document allows (or forbids) and checks that the server accepts (or
refuses) it too; the whole run is ``test_schemathesis_finds_no_disagreement`` in
tests/e2e/test_fuzz.py (``make fuzz``).
"""

from __future__ import annotations

import ast
import asyncio
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

import certifi
import jsonschema
import msgspec
import orjson
import pytest
from aiohttp.test_utils import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from support.http import error_of

import capella
from capella.api.app import document
from capella.api.openapi import WIRE_MODULES
from capella.errors import InvalidRequest, error_classes
from capella.handlers import postgres
from capella.handlers.postgres import split_password
from capella.units import parse_duration, parse_size
from capella.wire.answers import ErrorDetail
from capella.wire.fields import POSITIVE_SIZE_PATTERN, duration_at_most
from capella.wire.postgres import DSN_PATTERN

DOCUMENT = document()
Q = "/v1/queues/q"
W = f"{Q}/subscriptions/w"
# A CA bundle that exists wherever the tests run (the server reads the files definitions name).
CA_FILE = certifi.where()


def valid(schema_name: str, body: object) -> bool:
    schema = {"$ref": f"#/components/schemas/{schema_name}", "components": DOCUMENT["components"]}
    return bool(jsonschema.Draft202012Validator(schema).is_valid(body))


def parameter(path: str, method: str, name: str) -> dict[str, Any]:
    item = DOCUMENT["paths"][path]
    found = [
        p for p in (*item.get("parameters", ()), *item[method].get("parameters", ())) if p["name"] == name
    ]
    assert found, (path, method, name)
    return dict(found[0])


def valid_parameter(path: str, method: str, name: str, value: str) -> bool:
    spec = parameter(path, method, name)
    if value == "" and spec.get("allowEmptyValue"):
        return True
    return bool(jsonschema.Draft202012Validator(spec["schema"]).is_valid(value))


@pytest.fixture
async def q(api: TestClient) -> TestClient:
    assert (await api.put(Q, json={})).status == 201
    return api


async def test_a_method_a_fixed_segment_lacks_is_405_with_its_own_allow(q: TestClient) -> None:
    # ST204, ST205: {id} matched cancel, retry and delete, adding the methods of a message's
    # path to theirs.
    resp = await q.patch(f"{Q}/scheduled/cancel", json={"ids": []})
    assert (await error_of(resp, 405))["code"] == "method_not_allowed"
    assert resp.headers["Allow"] == "POST"
    for action in ("retry", "delete"):
        resp = await q.options(f"{W}/work/{action}")
        assert resp.status == 405
        assert resp.headers["Allow"] == "POST"
    # What is not a fixed segment is still an id, and a bad one is still named.
    assert (await error_of(await q.get(f"{Q}/scheduled/abc"), 400))["parameter"] == "id"


async def test_ids_start_at_1_in_the_document_as_in_the_server(q: TestClient) -> None:
    # ST202: the document allowed 0, which names nothing.
    for path in ("/v1/queues/{queue}/scheduled/{id}", "/v1/queues/{queue}/subscriptions/{name}/work/{id}"):
        assert parameter(path, "get", "id")["schema"]["minimum"] == 1
    assert (await error_of(await q.get(f"{Q}/scheduled/0"), 400))["parameter"] == "id"
    assert not valid("CancelScheduled", {"ids": [0]})
    assert (await error_of(await q.post(f"{Q}/scheduled/cancel", json={"ids": [0]}), 400))["field"] == "ids"
    assert valid("CancelScheduled", {"ids": [1]})
    assert (await q.post(f"{Q}/scheduled/cancel", json={"ids": [1]})).status == 200


@pytest.mark.parametrize(
    ("value", "accepted"),
    # Blanks alone are not an empty value (schemathesis sent U+0085); blanks and digits are
    # ASCII's, which every checker reads alike (\s and \d differ past ASCII).
    [("\x85", False), (" ", False), ("0-9, 20", True), ("\u0663-\u0665", False), ("1-", False)],
)
async def test_a_segments_filter_is_the_same_in_both(q: TestClient, value: str, accepted: bool) -> None:
    assert valid_parameter("/v1/queues/{queue}/messages", "get", "segments", value) is accepted
    resp = await q.get(f"{Q}/messages", params={"segments": value})
    assert (resp.status == 200) is accepted, await resp.text()


@pytest.mark.parametrize(
    ("value", "accepted"), [("", True), (" ", True), (" 5 ", True), ("\u0663", False), ("-1", False)]
)
async def test_a_last_event_id_is_the_same_in_both(q: TestClient, value: str, accepted: bool) -> None:
    assert valid_parameter("/v1/queues/{queue}/stream", "get", "Last-Event-ID", value) is accepted
    resp = await q.get(f"{Q}/stream", headers={"Last-Event-ID": value.encode().decode("latin-1")})
    assert (resp.status == 200) is accepted, await resp.text()
    resp.close()


async def test_a_receipt_of_other_digits_is_refused_not_a_crash(q: TestClient) -> None:
    assert (await q.put(W, json={"mode": "ack"})).status in (200, 201)
    resp = await q.post(f"{W}/ack", json={"receipts": ["\u00b2.1"]})
    assert (await error_of(resp, 400))["field"] == "receipts"


@pytest.mark.parametrize(
    ("path", "name"),
    [
        (f"{Q}/messages?wait=", "wait"),
        (f"{Q}/scheduled?segments=", "segments"),
        (f"{Q}/messages?after=", "after"),
    ],
)
async def test_an_empty_query_parameter_is_not_given_in_both(q: TestClient, path: str, name: str) -> None:
    # ST201: the server read ?wait= as no wait, the document refused the empty value.
    template = "/v1/queues/{queue}/messages" if "/messages" in path else "/v1/queues/{queue}/scheduled"
    assert valid_parameter(template, "get", name, "")
    assert (await q.get(path)).status == 200


async def test_an_empty_last_event_id_is_not_given_in_both(q: TestClient) -> None:
    # ST201: the same for the stream's Last-Event-ID header.
    assert valid_parameter("/v1/queues/{queue}/stream", "get", "Last-Event-ID", "")
    async with q.get(f"{Q}/stream", headers={"Last-Event-ID": ""}) as resp:
        assert resp.status == 200


@pytest.mark.parametrize(("status", "accepted"), [("failed,dead", True), ("dead", True), ("waiting", False)])
async def test_a_work_status_list_is_the_same_in_both(q: TestClient, status: str, accepted: bool) -> None:
    # ST202: the document took any text.
    assert (await q.put(W, json={"mode": "ack"})).status == 201
    path = "/v1/queues/{queue}/subscriptions/{name}/work"
    assert valid_parameter(path, "get", "status", status) is accepted
    assert ((await q.get(f"{W}/work", params={"status": status})).status == 200) is accepted


@pytest.mark.parametrize(
    "query",
    [{"source": "s" * 256}, {"external_id": "x"}, {"segment": "x"}, {"replica_timeout": "-5"}],
)
async def test_a_bad_produce_parameter_is_refused_with_any_body(q: TestClient, query: dict[str, str]) -> None:
    # ST201: octet-stream metadata and replica_timeout (without replicas) were ignored, not checked.
    (name, value), *_ = query.items()
    assert not valid_parameter("/v1/queues/{queue}/messages", "post", name, value)
    resp = await q.post(f"{Q}/messages", json={"messages": []}, params=query)
    assert (await error_of(resp, 400))["code"] in ("invalid_request", "invalid_message")
    assert (await q.post(f"{Q}/messages", json={"messages": []}, params={"source": "ok"})).status == 200


HANDLER = ("/v1/handlers/h", "HandlerDefinition")  # the path a handler body goes to, its schema


@pytest.mark.parametrize(
    ("path", "schema", "body", "accepted"),
    [
        # The definition's nulls keep the current values; save modes are names or numbers.
        (Q, "QueueDefinition", {"save": None, "block": None, "mounts": None}, True),
        (Q, "QueueDefinition", {"subscription_save": 0}, True),
        (Q, "QueueDefinition", {"save": 4}, False),
        (
            Q,
            "QueueDefinition",
            {"mounts": {"meta": "default", "marks": {"0": "default", "007": "default"}}},
            True,
        ),
        (Q, "QueueDefinition", {"mounts": {"marks": {"256": "default"}}}, False),
        (Q, "QueueDefinition", {"segments": None}, True),
        # A cluster's timeouts are left out for the default, not null.
        ("/v1/clusters/c", "ClusterDefinition", {"url": "http://127.0.0.1:9", "timeout": None}, False),
        # A handler names its queues unless its type names them in params.
        (*HANDLER, {"type": "copy"}, False),
        (*HANDLER, {"type": "flush", "queues": None}, False),
        (*HANDLER, {"type": "flush", "queue": "q", "started": False}, True),
        # A pass interval is more than 0, written as a number or as text (schemathesis sent "0").
        (*HANDLER, {"type": "flush", "queue": "q", "params": {"interval": "0"}}, False),
        (*HANDLER, {"type": "flush", "queue": "q", "params": {"interval": "2s"}}, True),
        # A definition without a type is refused by both: pg_outbox's rule once replaced its
        # fields in the document, which then took {"params": {}} (schemathesis, seed 20261123).
        (*HANDLER, {"params": {}}, False),
        (*HANDLER, {"params": {}, "started": False}, False),
        # pg_outbox's queue is params.to: it takes no queue or queues in both (schemathesis
        # sent a queue).
        (
            *HANDLER,
            {"type": "pg_outbox", "queue": "q", "params": {"dsn": "postgresql://u@h/db", "to": "q"}},
            False,
        ),
        (
            *HANDLER,
            {
                "type": "pg_outbox",
                "queue": None,
                "started": False,
                "params": {"dsn": "postgresql://u@h/db", "to": "q"},
            },
            True,
        ),
        # A copy names its source in queues, queue or params.from: a null from names none.
        (*HANDLER, {"type": "copy", "started": False, "params": {"from": None, "to": "q"}}, False),
        (*HANDLER, {"type": "copy", "started": False, "params": {"from": "q", "to": "q"}}, True),
        # A size in params is more than 0 in both, text too (schemathesis sent "0"); a positive
        # one under a byte is a byte.
        (*HANDLER, {"type": "expire", "queue": "q", "params": {"max_bytes": "0"}}, False),
        (*HANDLER, {"type": "expire", "queue": "q", "started": False, "params": {"max_bytes": "0.5"}}, True),
        # Handler params take whole floats as integers, as the document's integer does, and
        # no integer past int64 (schemathesis sent save 0.0 and max_messages 98699230045634527232).
        (
            *HANDLER,
            {
                "type": "copy",
                "queue": "q",
                "started": False,
                "params": {"to": "q", "save": 0.0, "batch": 5.0},
            },
            True,
        ),
        (*HANDLER, {"type": "expire", "queue": "q", "params": {"max_messages": 98699230045634527232}}, False),
        # A push header is an HTTP token name in both (schemathesis sent "\u00ae\u0012u%").
        (
            *HANDLER,
            {"type": "push", "queue": "q", "params": {"url": "http://x", "headers": {"a b": "1"}}},
            False,
        ),
        (
            *HANDLER,
            {"type": "push", "queue": "q", "params": {"url": "http://x", "headers": {"X-A": "a\nb"}}},
            False,
        ),
        (
            *HANDLER,
            {
                "type": "push",
                "queue": "q",
                "started": False,
                "params": {"url": "http://x", "headers": {"X-A": "1"}},
            },
            True,
        ),
        (*HANDLER, {"type": "expire", "queue": "q", "params": {"max_bytes": 32589158477190044729}}, False),
        # A duration written as a whole float is seconds, as any float: only a JSON integer
        # of 10**12 or more is the original's nanoseconds (to_age 4188193079906183.0 s is above
        # from_age 56999766.905 s).
        (
            *HANDLER,
            {
                "type": "archive",
                "queue": "q",
                "started": False,
                "params": {
                    "conditions": [{"mark": 0, "from_age": "56999766905ms", "to_age": 4188193079906183.0}]
                },
            },
            True,
        ),
        # A push URL has no control character in both (schemathesis sent "https://\u0089..\u001c";
        # Python's \s takes \x1c as a blank, a JSON Schema checker does not).
        (*HANDLER, {"type": "push", "queue": "q", "params": {"url": "https://h\u001c"}}, False),
        (
            *HANDLER,
            {"type": "push", "queue": "q", "started": False, "params": {"url": "https://\u00fch/p?q"}},
            True,
        ),
        # An external cluster's URL has no control character in both (schemathesis sent
        # "http://\u00dbm\u001c...": Python's \s takes \x1c, a JSON Schema checker does not).
        ("/v1/clusters/c", "ClusterDefinition", {"url": "http://h\u001cx/l"}, False),
        ("/v1/clusters/c", "ClusterDefinition", {"url": "http://\u00dbm/l"}, True),
        # A handler runs as a user name in both (schemathesis sent "").
        (*HANDLER, {"type": "flush", "queue": "q", "user": ""}, False),
        (*HANDLER, {"type": "flush", "queue": "q", "user": "a b"}, False),
        (*HANDLER, {"type": "flush", "queue": "q", "started": False, "user": "ops@site"}, True),
        # A pg handler's dsn is a postgresql:// URL in both (schemathesis sent "").
        (*HANDLER, {"type": "pg_inbox", "queue": "q", "params": {"dsn": ""}}, False),
        # (A file the dsn names must be one the server may read, [files] allow: no document can
        # say which, so this one names none; the fuzz hooks skip dsn files for the same reason.)
        (
            *HANDLER,
            {
                "type": "pg_inbox",
                "queue": "q",
                "started": False,
                # A file that exists: the server reads the files a definition names.
                "params": {
                    "dsn": f"postgresql://app@127.0.0.1:5432/db?sslmode=require&sslrootcert={CA_FILE}"
                },
            },
            True,
        ),
    ],
)
async def test_a_body_is_accepted_by_both_or_refused_by_both(
    q: TestClient, path: str, schema: str, body: dict[str, Any], accepted: bool
) -> None:
    # ST202: null where the document allowed it, a copy handler without queues, an empty mount.
    assert valid(schema, body) is accepted
    resp = await q.put(path, json=body)
    assert (resp.status < 300) is accepted, await resp.text()


@settings(max_examples=300, deadline=None)
@given(st.from_regex(DSN_PATTERN, fullmatch=True))
def test_a_dsn_the_document_allows_the_server_takes(dsn: str) -> None:
    bare, _ = split_password(dsn, "params.dsn")
    target = postgres.parse_target(bare, "params.dsn", InvalidRequest)
    assert target.host and target.user


def test_every_struct_schema_keeps_its_own_fields() -> None:
    """A type's extra schema rules sit beside what its fields say, never over them."""
    for module in WIRE_MODULES:
        for kind in vars(module).values():
            schema = DOCUMENT["components"]["schemas"].get(getattr(kind, "__name__", ""))
            if not (isinstance(kind, type) and issubclass(kind, msgspec.Struct)) or schema is None:
                continue
            fields = {f.encode_name for f in msgspec.structs.fields(kind)}
            assert fields <= set(schema.get("properties", {})), kind.__name__


@settings(max_examples=300, deadline=None)
@given(st.from_regex(POSITIVE_SIZE_PATTERN, fullmatch=True))
def test_a_size_the_document_calls_positive_is_at_least_a_byte(text: str) -> None:
    try:
        size = parse_size(text)
    except ValueError as exc:
        assert "larger than" in str(exc)  # a number too large: the fuzz rules leave these out
        return
    assert size >= 1


async def test_the_document_names_a_mount_the_server_has() -> None:
    # ST202: an empty mount name was schema-valid; the example is the built-in mount.
    mounts = DOCUMENT["components"]["schemas"]["Mounts"]["properties"]
    assert mounts["meta"]["anyOf"][0]["examples"] == ["default"]


async def test_work_bodies_take_only_their_own_fields(q: TestClient) -> None:
    # ST202: ack, nack and extend shared one body in the document, and the server refused the
    # others' fields by hand; each is its own struct now.
    assert (await q.put(W, json={"mode": "ack"})).status == 201
    schemas = {"ack": "Receipts", "nack": "NackReceipts", "extend": "ExtendReceipts"}
    for action, body, accepted in (
        ("ack", {"receipt": "1.1", "delay": 1}, False),
        ("nack", {"receipt": "1.1", "delay": 1}, True),
        ("extend", {"receipt": "1.1", "lease": "1m"}, True),
        ("extend", {"receipt": "1.1", "error": "x"}, False),
    ):
        op = DOCUMENT["paths"][f"/v1/queues/{{queue}}/subscriptions/{{name}}/{action}"]["post"]
        assert op["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(schemas[action])
        assert valid(schemas[action], body) is accepted
        resp = await q.post(f"{W}/{action}", json=body)
        if accepted:
            assert resp.status != 400, await resp.text()  # the receipt is unknown: 404
        else:
            error = await error_of(resp, 400)
            assert error["field"] == next(iter(set(body) - {"receipt"}))
            assert error["message"].startswith("unknown field")


async def test_a_reschedule_takes_exactly_one_time_in_both(q: TestClient) -> None:
    # ST202: both null was schema-valid.
    produced = await (await q.post(f"{Q}/messages", json={"data": "x", "delay": "1h"})).json()
    sid = produced["results"][0]["scheduled_id"]
    for body, accepted in (
        ({"delay": None, "deliver_at": None}, False),
        ({"delay": "2h", "deliver_at": None}, True),
        ({"delay": "2h", "deliver_at": 1}, False),
    ):
        assert valid("Reschedule", body) is accepted
        resp = await q.patch(f"{Q}/scheduled/{sid}", json=body)
        assert (resp.status == 200) is accepted, await resp.text()


async def test_an_unknown_field_is_refused_one_way_with_a_hint(q: TestClient) -> None:
    for path, body, field, hint in (
        (Q, {"block": {"max_mesages": 5}}, "block.max_mesages", "block.max_messages"),
        (W, {"mode": "ack", "policy": {"leese": "1m"}}, "policy.leese", "policy.lease"),
        (W, {"last_idd": 3}, "last_idd", "last_id"),
    ):
        error = await error_of(await q.put(path, json=body), 400)
        assert (error["code"], error["field"]) == ("invalid_request", field)
        assert error["message"] == f"unknown field {field!r} (did you mean {hint!r}?)"


def test_every_detail_the_server_raises_is_a_field_of_the_error_body() -> None:
    # The error body is rendered from wire.answers.Error: a detail it lacks would be dropped.
    classes = {cls.__name__ for cls in error_classes() if not cls.client_only}
    client_only = {"status", "failures", "holders", "known", "answer"}
    found = set()
    root = Path(capella.__file__).parent
    for path in root.rglob("*.py"):
        if path.parts[len(root.parts)] == "client":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", getattr(node.func, "attr", None))
                if name in classes:
                    found |= {k.arg for k in node.keywords if k.arg is not None}
    assert found - client_only <= set(ErrorDetail.__struct_fields__)


async def test_an_accept_header_that_is_not_utf8_is_406_not_500(q: TestClient) -> None:
    # ST101/ST103: the error echoed the header's undecodable byte, which JSON cannot hold.
    reader, writer = await asyncio.open_connection(q.server.host, q.server.port)
    writer.write(f"GET {Q}/messages HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n".encode())
    writer.write(b"Accept: \x84\r\n\r\n")
    answer = await reader.read()
    writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 406 ")
    error = orjson.loads(body)["error"]
    assert (error["code"], error["accept"]) == ("not_acceptable", "\\udc84")


@pytest.mark.parametrize(
    ("value", "accepted"), [("1700000000", True), ("2026-01-01T00:00:00Z", True), ("Å8+", False)]
)
async def test_a_due_time_filter_is_the_same_in_both(q: TestClient, value: str, accepted: bool) -> None:
    # ST202: the document took any text for due_after and due_before.
    for name in ("due_after", "due_before"):
        assert valid_parameter("/v1/queues/{queue}/scheduled", "get", name, value) is accepted
        assert ((await q.get(f"{Q}/scheduled", params={name: value})).status == 200) is accepted


async def test_a_null_cursor_field_beside_ack_mode_is_not_given(q: TestClient) -> None:
    # ST202: {"replica": null, "mode": "ack"} was refused as a cursor's field.
    body = {"replica": None, "mode": "ack"}
    assert valid("SubscriptionCommit", body)
    assert (await q.put(W, json=body)).status == 201


async def test_a_whole_float_is_an_integer_and_a_rounded_one_is_not(q: TestClient) -> None:
    # ST202: JSON Schema's integer takes 3.0; msgspec's int did not.
    assert valid("SubscriptionCommit", {"mode": "ack", "policy": {"max_attempts": 3.0}})
    assert (await q.put(W, json={"mode": "ack", "policy": {"max_attempts": 3.0}})).status == 201
    # ST201: but a float past 2**53 may be an integer rounded into range; it stays refused.
    body = b'{"segments": {"min": -9223372036854775809, "max": 0}}'
    resp = await q.put(Q, data=body, headers={"Content-Type": "application/json"})
    assert (await error_of(resp, 400))["code"] == "invalid_request"


@pytest.mark.parametrize(
    ("extra", "accepted"), [({"external_id": 5.0, "segment": 2.0}, True), ({"segment": 2.5}, False)]
)
async def test_a_produced_message_takes_whole_floats_as_integers(
    q: TestClient, extra: dict[str, float], accepted: bool
) -> None:
    # ST202: the produce path decodes straight into its struct, whose int refused 5.0.
    body = {"data": "x", **extra}
    assert valid("Message", body) is accepted
    resp = await q.post(f"{Q}/messages", json=body)
    assert (resp.status == 200) is accepted, await resp.text()
    if accepted:
        (message,) = (await (await q.get(f"{Q}/messages")).json())["messages"]
        assert (message["external_id"], message["segment"]) == (5, 2)


async def test_a_time_in_text_has_each_part_in_its_range_in_both(q: TestClient) -> None:
    # ST202: the document's date-time took month 80; the server refuses it.
    for text, accepted in (("2026-01-31T23:59:59Z", True), ("2026-80-01T00:00:00Z", False)):
        assert valid_parameter("/v1/queues/{queue}/scheduled", "get", "due_after", text) is accepted
        assert ((await q.get(f"{Q}/scheduled", params={"due_after": text})).status == 200) is accepted
        assert valid("Message", {"data": "x", "external_time": text}) is accepted
        resp = await q.post(f"{Q}/messages", json={"data": "x", "external_time": text})
        assert (resp.status == 200) is accepted, await resp.text()


@pytest.mark.parametrize(
    ("body", "accepted"),
    [
        ({"mode": "ack", "last_id": 0}, False),
        ({"mode": "cursor", "policy": {}}, False),
        ({"policy": {"dead_letter": None}, "reset": True}, False),
        ({"mode": "ack", "policy": {"max_attempts": 2}}, True),
        ({"last_id": 3, "replica": True}, True),
    ],
)
async def test_a_work_queue_definition_has_no_cursor_field_in_both(
    q: TestClient, body: dict[str, Any], accepted: bool
) -> None:
    # ST202: the document allowed a cursor's fields beside mode ack or a policy.
    assert valid("SubscriptionCommit", body) is accepted
    assert ((await q.put(W, json=body)).status < 300) is accepted


async def test_a_password_needs_a_username_that_is_not_null_in_both(q: TestClient) -> None:
    # ST202: dependentRequired took a null username.
    body = {"url": "http://127.0.0.1:9", "password": "secret-pass", "username": None}
    assert not valid("ClusterDefinition", body)
    assert (await error_of(await q.put("/v1/clusters/c", json=body), 400))["field"] == "username"
    assert valid("ClusterDefinition", {**body, "username": "u"})


def test_the_document_says_what_a_pg_handler_and_a_copy_subscription_take() -> None:
    # ST202: a pg handler needs exactly one of dsn and dsn_secret; a copy's subscription is a name.
    assert not valid("PgInboxParams", {"sslpassword_secret": "S"})
    assert valid("PgInboxParams", {"dsn_secret": "S"})
    assert not valid("CopyParams", {"to": "q", "subscription": "a/b"})
    # Year 0 and February 30 are not times the server reads.
    assert not valid("Reschedule", {"deliver_at": "0000-01-01T00:00:00Z"})
    assert not valid("Reschedule", {"deliver_at": "2026-02-30T00:00:00Z"})


async def test_a_parameter_given_twice_is_refused(q: TestClient) -> None:
    # ST201: ?due_after=&due_after=junk read the first, empty, value; a filter may repeat.
    error = await error_of(await q.get(f"{Q}/scheduled?due_after=&due_after=junk"), 400)
    assert (error["code"], error["parameter"]) == ("invalid_request", "due_after")
    assert (await q.get(f"{Q}/messages?header.k=a&header.k=b")).status == 200


async def test_a_message_has_not_both_deliver_at_and_delay_in_both(q: TestClient) -> None:
    # ST202: the document allowed both.
    body = {"data": "x", "delay": 1, "deliver_at": 1}
    assert not valid("Message", body)
    assert (await error_of(await q.post(f"{Q}/messages", json=body), 400))["field"] == "delay"
    assert valid("Message", {**body, "deliver_at": None})


async def test_reading_an_ack_mode_subscription_as_a_cursor_is_a_documented_409(q: TestClient) -> None:
    # ST103: the 409 was not among the read's documented answers.
    assert (await q.put(W, json={"mode": "ack"})).status == 201
    assert (await error_of(await q.get(f"{W}/messages"), 409))["code"] == "wrong_subscription_mode"
    assert "409" in DOCUMENT["paths"]["/v1/queues/{queue}/subscriptions/{name}/messages"]["get"]["responses"]


async def test_a_handler_whose_params_have_a_required_field_needs_params_in_both(q: TestClient) -> None:
    # ST202: {"type": "copy", "queue": "q"} was schema-valid; copy's params.to is required.
    body = {"type": "copy", "queue": "q", "started": False}
    assert not valid("HandlerDefinition", body)
    assert (await error_of(await q.put("/v1/handlers/h", json=body), 400))["field"] == "params.to"
    assert valid("HandlerDefinition", {"type": "flush", "queue": "q"})


async def test_an_expire_handler_gives_one_of_its_limits_in_both(q: TestClient) -> None:
    # ST202: {"type": "expire"} without params, or with a null limit, was schema-valid.
    for body in (
        {"type": "expire", "queue": "q"},
        {"type": "expire", "queue": "q", "params": {"max_age": None}},
    ):
        assert not valid("HandlerDefinition", body)
        assert (await error_of(await q.put("/v1/handlers/h", json=body), 400))["field"] == "params.max_age"
    body = {"type": "expire", "queue": "q", "params": {"max_messages": 10}, "started": False}
    assert valid("HandlerDefinition", body)
    assert (await q.put("/v1/handlers/h", json=body)).status == 201
    assert not valid("PgInboxParams", {"dsn_secret": "S", "subscription": "a/b"})


def test_a_copy_names_a_destination() -> None:
    # ST202: an empty params.to was schema-valid; the server refuses it.
    assert not valid("CopyParams", {"to": ""})
    assert not valid("PgOutboxParams", {"to": "", "dsn_secret": "S"})


# --- issue 34: a document that validates and tells the truth -----------------------------

# Maps whose keys are names (a property, a schema, a status), not keywords: a property named
# "default" is not a default.
NAMED_MAPS = frozenset(
    {"properties", "patternProperties", "$defs", "schemas", "responses", "paths", "headers", "content"}
)
NAMED_MAPS |= {"securitySchemes", "dependentSchemas", "encoding"}


def stated_values(node: object, where: str = "") -> list[tuple[str, object, dict[str, Any]]]:
    """Every default and example in the document, with where it is and the schema it must meet."""
    found: list[tuple[str, object, dict[str, Any]]] = []
    if isinstance(node, list):
        for i, item in enumerate(node):
            found += stated_values(item, f"{where}/{i}")
    if not isinstance(node, dict):
        return found
    own = {k: v for k, v in node.items() if k not in ("default", "example", "examples")}
    # A parameter or a media type carries its example beside its schema; a schema carries its own.
    schema_of = node["schema"] if isinstance(node.get("schema"), dict) else own
    if "default" in node:
        found.append((f"{where}/default", node["default"], schema_of))
    if "example" in node:
        found.append((f"{where}/example", node["example"], schema_of))
    if isinstance(node.get("examples"), list):
        found += [(f"{where}/examples/{i}", v, schema_of) for i, v in enumerate(node["examples"])]
    elif isinstance(node.get("examples"), dict):  # OpenAPI's Example objects
        found += [(f"{where}/examples/{k}", v.get("value"), schema_of) for k, v in node["examples"].items()]
    for key, value in node.items():
        if key in NAMED_MAPS and isinstance(value, dict):
            for name, item in value.items():
                found += stated_values(item, f"{where}/{key}/{name}")
        elif key not in ("default", "example", "examples"):
            found += stated_values(value, f"{where}/{key}")
    return found


def test_the_document_passes_openapi_spec_validator() -> None:
    # Issue 34: CopyParams' and PgInboxParams' subscription declared default '', which their
    # own pattern refused, and openapi-spec-validator rejected the whole document.
    from openapi_spec_validator import validate

    validate(orjson.loads(orjson.dumps(DOCUMENT)))


def test_every_default_and_example_meets_its_own_schema() -> None:
    stated = stated_values(DOCUMENT)
    assert len(stated) > 50, "the walk found the document's defaults"
    components = DOCUMENT["components"]
    broken = [
        (where, value)
        for where, value, schema in stated
        if not jsonschema.Draft202012Validator({**schema, "components": components}).is_valid(value)
    ]
    assert broken == []


async def test_a_default_subscription_of_nothing_is_taken_by_both(q: TestClient) -> None:
    # The default the document states ("") is one the server takes, and one the schema takes.
    body = {"type": "copy", "queue": "q", "started": False, "params": {"to": "q2", "subscription": ""}}
    assert (await q.put("/v1/queues/q2", json={})).status == 201
    assert valid("HandlerDefinition", body)
    resp = await q.put("/v1/handlers/c", json=body)
    assert resp.status == 201, await resp.text()
    assert (await resp.json())["params"]["subscription"] == "copy-to-q2"
    assert not valid("HandlerDefinition", {**body, "params": {"to": "q2", "subscription": "-x"}})


@pytest.mark.parametrize(
    ("body", "accepted"),
    [
        # Issue 34, seed 20261123: schema-valid, and refused.
        ({"connect_timeout": 4.8e297}, False),
        ({"timeout": 5.3e16}, False),
        ({"timeout": 86_400}, True),
        ({"timeout": 86_401}, False),
        ({"connect_timeout": " 24 h "}, True),
        ({"connect_timeout": "24.0001h"}, False),
        ({"timeout": "86400000000000ns"}, True),
        ({"timeout": "1d"}, True),
        ({"timeout": "1.5d"}, False),
        ({"timeout": "0s"}, False),
        # Seed 424242: a whole float is seconds, never the original's nanoseconds.
        ({"timeout": 20790139118458.0}, False),
    ],
)
async def test_a_cluster_timeout_is_at_most_a_day_in_both(
    api: TestClient, body: dict[str, Any], accepted: bool
) -> None:
    body = {"url": "http://127.0.0.1:9", **body}
    assert valid("ClusterDefinition", body) is accepted
    resp = await api.put("/v1/clusters/far", json=body)
    assert (resp.status < 300) is accepted, await resp.text()
    if not accepted:
        assert (await error_of(resp, 400))["field"] in body


@pytest.mark.parametrize(
    ("value", "accepted"),
    [(6.3e302, False), (253_402_300_800, False), ("9999-12-31T23:59:59Z", False), (1_800_000_000, True)],
)
async def test_a_delivery_time_no_number_holds_is_refused_by_both(
    q: TestClient, value: object, accepted: bool
) -> None:
    # Issue 34: deliver_at 6.3e302 was schema-valid. The document now stops where RFC 3339 text
    # stops (the year 9999); "at most ten years ahead" is a rule of now, in words and the hooks.
    message = {"data": "x", "deliver_at": value}
    assert valid("Message", message) is (value != 6.3e302 and value != 253_402_300_800)
    resp = await q.post(f"{Q}/messages", json={"messages": [message]})
    assert (resp.status < 300) is accepted, await resp.text()


async def test_a_mount_named_nothing_is_refused_by_both(q: TestClient) -> None:
    # Issue 34: a mount mark "0" mapped to "" was schema-valid.
    body = {"mounts": {"marks": {"0": ""}}}
    assert not valid("QueueDefinition", body)
    assert (await error_of(await q.put(Q, json=body), 400))["field"] == "mounts.marks"
    assert valid("QueueDefinition", {"mounts": {"marks": {"0": "default"}}})


@pytest.mark.parametrize(
    ("delay", "accepted"),
    [
        # Issue 34: blanks around 37 digits, schema-valid and refused (more than ten years).
        (" " + "9" * 37 + " ", False),
        (" 5 ", True),
        ("3650d", True),
        ("3650.5d", False),
        ("87600h", True),
        (str(10 * 365 * 86_400 + 1), False),
    ],
)
async def test_a_retry_delay_is_at_most_ten_years_in_both(q: TestClient, delay: str, accepted: bool) -> None:
    body = {"mode": "ack", "policy": {"delay": delay, "max_delay": "3650d"}}
    assert valid("SubscriptionCommit", body) is accepted
    resp = await q.put(W, json=body)
    assert (resp.status < 300) is accepted, await resp.text()


@pytest.mark.parametrize(
    ("params", "accepted"),
    [
        ({"timeout": "60s"}, True),
        ({"timeout": "1m"}, True),
        ({"timeout": "60001ms"}, False),
        ({"timeout": 61}, False),
        ({"timeout": "0.0167h"}, False),
        ({"delay": "3650d", "max_delay": "3650d"}, True),
        ({"max_delay": "3651d"}, False),
    ],
)
async def test_a_push_timeout_and_retry_delays_are_bounded_in_both(
    q: TestClient, params: dict[str, Any], accepted: bool
) -> None:
    params = {"url": "http://127.0.0.1:9/", **params}
    body = {"type": "push", "queue": "q", "started": False, "params": params}
    assert valid("HandlerDefinition", body) is accepted
    resp = await q.put("/v1/handlers/p", json=body)
    assert (resp.status < 300) is accepted, await resp.text()


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from([60.0, 43_200.0, 86_400.0, 315_360_000.0]),
    st.decimals(min_value=0, max_value=10**16, places=4),
    st.sampled_from(["ns", "us", "ms", "s", "", "m", "h", "d"]),
)
def test_a_bounded_duration_pattern_takes_what_the_server_takes(
    limit: float, number: Decimal, unit: str
) -> None:
    per_second = {"ns": 10**9, "us": 10**6, "ms": 1000}.get(unit)
    seconds = {"m": 60, "h": 3600, "d": 86_400}.get(unit, 1)
    at_limit = Decimal(limit) * per_second if per_second else Decimal(limit) / seconds
    # Numbers near the limit in this unit (just above it, just below), as well as anywhere.
    for value in (number, at_limit, at_limit + Decimal("0.0001"), at_limit - Decimal("0.0001")):
        value = value.quantize(Decimal("0.0001"))
        text = f"{value:f}{unit}"
        exact = value / per_second if per_second else value * seconds
        matches = bool(re.fullmatch(duration_at_most(limit), text))
        assert matches == (exact <= Decimal(limit)), text
        # The server reads a float: what the pattern takes it takes; a value over the limit by
        # less than a float tells apart ("43200000000000.0001ns") it may take as well.
        assert not matches or parse_duration(text) <= limit, text


@pytest.mark.parametrize(
    ("pair", "accepted"), [([-8825, 46438718615328588300288], False), ([-(2**63), 2**63 - 1], True)]
)
async def test_a_copy_segment_range_is_64_bit_in_both(q: TestClient, pair: list[int], accepted: bool) -> None:
    # make fuzz, seed 4242: a pair past 64 bits was schema-valid, and the server refused it.
    assert (await q.put("/v1/queues/q2", json={})).status == 201
    body = {"type": "copy", "queue": "q", "started": False, "params": {"to": "q2", "segments": [pair]}}
    assert valid("HandlerDefinition", body) is accepted
    resp = await q.put("/v1/handlers/c", json=body)
    assert (resp.status < 300) is accepted, await resp.text()


def test_the_relay_declares_its_502_and_504() -> None:
    for method in ("get", "post", "put", "patch", "delete"):
        responses = DOCUMENT["paths"]["/v1/clusters/{name}/v1/{path}"][method]["responses"]
        assert {"502", "504"} <= set(responses), method
    assert "gateway_timeout" in DOCUMENT["components"]["responses"]["E504"]["description"]


async def test_a_relay_to_a_far_side_that_never_answers_is_504(api: TestClient) -> None:
    # Accepts connections and reads them, answers nothing.
    held: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        body = {"url": f"http://127.0.0.1:{port}", "timeout": 0.3, "connect_timeout": 0.3}
        assert (await api.put("/v1/clusters/silent", json=body)).status == 201
        resp = await api.get("/v1/clusters/silent/v1/queues")
        error = await error_of(resp, 504)
        assert error["code"] == "gateway_timeout"
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()
