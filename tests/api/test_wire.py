"""The wire structs describe what the server really sends and takes.

Answers of a real app decode strictly into their wire types (a field the server sends and
the type lacks, or a type mismatch, fails here and in the client that uses them); bodies
decoded with ``read_struct`` name the bad field by its dotted path.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiohttp.test_utils import TestClient
from support.supervisor import launched

from capella.api import create_app
from capella.api.app import ROUTES
from capella.api.openapi import WIRE_MODULES
from capella.auth.authenticator import Authenticator
from capella.auth.rule import AccessRule
from capella.auth.store import AuthStore
from capella.config import AuthSettings, ServerSettings
from capella.core.cluster import Cluster
from capella.wire import answers, handler_status, messages, queues, work
from capella.wire.decode import field_error

Q = "/v1/queues/orders"


async def answer(resp: Any, status: int = 200) -> bytes:
    assert resp.status == status, await resp.text()
    body: bytes = await resp.read()
    return body


def strict(kind: type[Any]) -> type[Any]:
    """``kind`` with unknown fields refused, so an answer field the type lacks fails the test."""
    fields = [(f.name, f.type, f.default) for f in msgspec.structs.fields(kind)]
    return msgspec.defstruct(kind.__name__, fields, forbid_unknown_fields=True)  # type: ignore[arg-type]


async def test_answers_decode_into_their_wire_types(api: TestClient) -> None:
    info = msgspec.json.decode(await answer(await api.put(Q, json={}), 201), type=queues.QueueInfo)
    assert info.name == "orders" and info.stats.writable
    produced = msgspec.json.decode(
        await answer(
            await api.post(
                f"{Q}/messages",
                json={"messages": [{"data": "a"}, {"data_b64": "/w=="}, {"data": "later", "delay": 600}]},
            )
        ),
        type=messages.ProduceResults,
    )
    assert [r.id for r in produced.results[:2]] == [1, 2] and produced.results[2].scheduled_id
    page = msgspec.json.decode(await answer(await api.get(f"{Q}/messages?after=0")), type=messages.Messages)
    assert [(m.data, m.data_b64) for m in page.messages] == [("a", msgspec.UNSET), (msgspec.UNSET, "/w==")]
    scheduled = msgspec.json.decode(
        await answer(await api.get(f"{Q}/scheduled")), type=messages.ScheduledList
    )
    assert scheduled.scheduled[0].data == "later"

    sub = msgspec.json.decode(
        await answer(await api.put(f"{Q}/subscriptions/w", json={"mode": "ack"}), 201), type=work.Subscription
    )
    assert sub.mode == "ack" and sub.policy is not msgspec.UNSET and sub.work is not msgspec.UNSET
    claimed = msgspec.json.decode(
        await answer(await api.post(f"{Q}/subscriptions/w/claim?limit=1")), type=work.Claimed
    )
    (message,) = claimed.messages
    assert message.attempt == 1
    acked = msgspec.json.decode(
        await answer(await api.post(f"{Q}/subscriptions/w/ack", json={"receipts": [message.receipt]})),
        type=work.ReceiptResults,
    )
    assert acked.results[0].ok
    listed = msgspec.json.decode(
        await answer(await api.get(f"{Q}/subscriptions")), type=work.SubscriptionList
    )
    assert {s.name for s in listed.subscriptions} == {"w"}

    await answer(await api.put("/v1/handlers/f", json={"type": "flush", "queue": "orders"}), 201)
    found = msgspec.json.decode(await answer(await api.get("/v1/handlers")), type=handler_status.HandlerList)
    assert [h.name for h in found.handlers] == ["f"]

    error = msgspec.json.decode(await answer(await api.get("/v1/queues/none"), 404), type=answers.Error)
    assert error.error.code == "queue_not_found"


async def test_no_answer_field_is_missing_from_its_type(api: TestClient) -> None:
    """The same answers against the types with unknown fields refused: the types are complete."""
    await api.put(Q, json={})
    await api.post(f"{Q}/messages", json={"data": "x"})
    await api.put(f"{Q}/subscriptions/w", json={"mode": "ack"})
    await api.put("/v1/handlers/f", json={"type": "flush", "queue": "orders"})
    for path, kind in (
        (Q, queues.QueueInfo),
        (f"{Q}/subscriptions/w", work.Subscription),
        (f"{Q}/messages?after=0", messages.Messages),
        ("/v1/handlers/f", handler_status.HandlerInfo),
    ):
        value = msgspec.json.decode(await answer(await api.get(path)))
        msgspec.convert(value, strict(kind))
        for name, nested in (("stats", queues.QueueStats), ("messages", messages.StoredMessage)):
            if name in value:
                items = value[name] if isinstance(value[name], list) else [value[name]]
                for item in items:
                    msgspec.convert(item, strict(nested))


@pytest.mark.parametrize(
    ("text", "message", "field"),
    [
        ("Object contains unknown field `when`", "unknown field 'when'", "when"),
        ("Object contains unknown field `x` - at `$.policy`", "unknown field 'policy.x'", "policy.x"),
        ("Object missing required field `ids`", "ids is required", "ids"),
        (
            "Expected `float | str | null`, got `array` - at `$.policy.lease`",
            "policy.lease: expected a number or a string or null, got an array",
            "policy.lease",
        ),
        ("Expected `int`, got `bool` - at `$.ids[0]`", "ids[0]: expected an integer, got a boolean", "ids"),
        ("Expected `object`, got `array`", "the body must be a JSON object", None),
    ],
)
def test_decoding_errors_name_the_field(text: str, message: str, field: str | None) -> None:
    error = field_error(text)
    assert (error.code, error.message, error.details.get("field")) == ("invalid_request", message, field)


async def test_a_body_decoded_into_a_struct_names_the_bad_field(api: TestClient) -> None:
    await api.put(Q, json={})
    for body, field in (({"idz": [1]}, "idz"), ({}, "ids"), ({"ids": ["1"]}, "ids")):
        resp = await api.post(f"{Q}/scheduled/cancel", json=body)
        assert resp.status == 400
        error = (await resp.json())["error"]
        assert (error["code"], error["field"]) == ("invalid_request", field), error


# --- every GET answer against the type its route documents ------------------------------------

ROOT = {"Authorization": "Basic " + base64.b64encode(b"root:root-password").decode()}
WIRE_TYPES = {
    obj.__name__: obj
    for module in WIRE_MODULES
    for obj in vars(module).values()
    if isinstance(obj, type) and issubclass(obj, msgspec.Struct)
}
# The resources the setup below creates, by the path segment before a parameter.
PATH_VALUES = {
    ("queues", "queue"): ["orders"],
    ("subscriptions", "name"): ["c", "w"],
    ("handlers", "name"): ["f", "cp"],
    ("clusters", "name"): ["dc2"],
    ("users", "name"): ["root", "bob"],
    ("topics", "topic"): ["events"],
}


@pytest.fixture
async def secured_api(
    aiohttp_client: Any, cluster: Cluster, tmp_path: Path, api_settings: ServerSettings
) -> AsyncIterator[TestClient]:
    users = AuthStore(tmp_path / "auth")
    users.add_user("root", "root-password", admin=True)
    users.add_user("bob", "bob-password", rules=[AccessRule.parse("allow:queue:read:orders")])
    supervisor = await launched(cluster, users=users)
    authenticator = Authenticator(users, AuthSettings(enabled=True, token_ttl=3600))
    yield await aiohttp_client(create_app(cluster, api_settings, supervisor, authenticator=authenticator))
    await supervisor.close()


async def test_every_json_answer_of_a_get_round_trips_through_its_wire_type(
    secured_api: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decoded into the type its route documents and encoded back, every answer is unchanged:
    no field the server sends is missing from the types, at any depth, and none changes."""
    monkeypatch.setenv("DC2_TOKEN", "t")
    api = secured_api

    async def call(method: str, path: str, body: object = None, status: int = 200) -> Any:
        async with api.request(method, path, json=body, headers=ROOT) as resp:
            assert resp.status == status, await resp.text()
            return await resp.json()

    await call("PUT", Q, {}, 201)
    await call("PUT", "/v1/queues/copied", {}, 201)
    await call(
        "POST", f"{Q}/messages", {"messages": [{"data": "a", "headers": {"k": "v"}}, {"data_b64": "/w=="}]}
    )
    sid = (await call("POST", f"{Q}/messages", {"data": "later", "delay": 600}))["results"][0]["scheduled_id"]
    await call("PUT", f"{Q}/subscriptions/c", {"last_id": 1}, 201)
    await call("PUT", f"{Q}/subscriptions/w", {"mode": "ack"}, 201)
    await call("POST", f"{Q}/subscriptions/w/claim?limit=1")
    await call("PUT", "/v1/handlers/f", {"type": "flush", "queue": "orders"}, 201)
    await call("PUT", "/v1/handlers/cp", {"type": "copy", "queue": "orders", "params": {"to": "copied"}}, 201)
    await call("POST", "/v1/handlers/cp/run")
    await call("PUT", "/v1/clusters/dc2", {"url": "http://127.0.0.1:9", "username": "u"}, 201)
    await call("POST", "/v1/tokens", {"description": "ci"}, 201)
    await call("PUT", "/v1/topics/events", {"partitions": 2}, 201)

    checked = []
    for route in ROUTES:
        schema = route.answers.get(200, {}).get("content", {}).get("application/json", {}).get("schema", {})
        if route.method != "GET" or "$ref" not in schema:
            continue
        kind = WIRE_TYPES[schema["$ref"].rsplit("/", 1)[1]]
        for path in _paths(route.path, sid):
            params = {"id": "1"} if path.endswith("/replicas") else {}
            async with api.get(path, params=params, headers=ROOT) as resp:
                assert resp.status == 200, (path, await resp.text())
                raw = await resp.read()
            decoded = msgspec.json.decode(raw, type=kind)
            assert msgspec.to_builtins(decoded) == msgspec.json.decode(raw), (path, kind.__name__)
            checked.append(path)
    assert len(checked) >= 24, checked  # 21 routes, two handlers, two users, two subscriptions


def _paths(template: str, sid: int) -> list[str]:
    paths = [template.replace("{scheduled_id}", str(sid))]
    parts = template.strip("/").split("/")
    for i, part in enumerate(parts):
        if not part.startswith("{"):
            continue
        name = part[1:-1]
        if parts[i - 1] == "subscriptions" and i + 1 < len(parts):
            values = ["w"] if parts[i + 1] == "work" else ["c"]  # ack mode / cursor only
        elif (parts[i - 1], name) in PATH_VALUES:
            values = PATH_VALUES[(parts[i - 1], name)]
        else:
            values = [str(sid) if parts[i - 1] == "scheduled" else "1"]
        paths = [p.replace(part, v, 1) for p in paths for v in values]
    return paths
