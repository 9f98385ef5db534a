"""The wire structs describe what the server really sends and takes.

Answers of a real app decode strictly into their wire types (a field the server sends and
the type lacks, or a type mismatch, fails here and in the client that uses them); bodies
decoded with ``read_struct`` name the bad field by its dotted path.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from aiohttp.test_utils import TestClient

from capella.api.request import field_error
from capella.wire import answers, handlers, messages, queues, work

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
    found = msgspec.json.decode(await answer(await api.get("/v1/handlers")), type=handlers.HandlerList)
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
        ("/v1/handlers/f", handlers.HandlerInfo),
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
