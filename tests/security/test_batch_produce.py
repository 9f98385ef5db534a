"""A limited user against the record-batch forms (``application/vnd.capella.batch`` produce and
``application/vnd.capella.batches`` reads), on a real server with auth on.

The binary forms are a second door onto the same routes: the same access rules, the same
limits and no way to crash the server or store half a request with bytes it cannot parse.
"""

from __future__ import annotations

import struct
import zlib

import pytest

from capella.config import ServerSettings
from capella.records import record_batch
from capella.wire import batch_page
from security.conftest import Secured

pytestmark = pytest.mark.slow

BATCH = {"Content-Type": batch_page.BATCH_MEDIA_TYPE}
PAGE = {"Accept": batch_page.PAGE_MEDIA_TYPE}
DEFAULTS = ServerSettings()


def messages_of(secured: Secured, queue: str) -> list[str]:
    got = secured.call("GET", f"/v1/queues/{queue}/messages?limit=1000", user="admin")
    assert got.status == 200, got.body
    return [m.get("data", m.get("data_b64")) for m in got.body["messages"]]


def huge_count(batch: bytes) -> bytes:
    """``batch`` claiming 2**24 messages, its head checksum right: only the body gives it away."""
    data = bytearray(batch)
    struct.pack_into("<I", data, 12, record_batch.MAX_COUNT)
    struct.pack_into("<I", data, 4, zlib.crc32(bytes(data[8 : record_batch.HEAD.size])))
    return bytes(data)


def test_a_limited_user_gets_no_further_with_batches_than_with_json(secured: Secured) -> None:
    for queue in ("prod", "dev-own"):
        assert secured.call("PUT", f"/v1/queues/{queue}", {}, user="admin").status == 201
    assert secured.call("POST", "/v1/queues/prod/messages", {"data": "secret"}, user="admin").status == 200
    body = record_batch.encode([b"planted"], sources=["prod-cluster"], external_ids=[1])

    # Another's queue: refused before the body is looked at, in both directions.
    refused = secured.call("POST", "/v1/queues/prod/messages", data=body, headers=BATCH)
    assert (refused.status, refused.body["error"]["code"]) == (403, "forbidden")
    read = secured.call("GET", "/v1/queues/prod/messages", headers=PAGE)
    assert (read.status, read.body["error"]["code"]) == (403, "forbidden")
    subscription = secured.call("GET", "/v1/queues/prod/subscriptions/s/messages", headers=PAGE)
    assert subscription.status == 403
    # Without credentials, and with a huge body: 401, nothing read or stored.
    anonymous = secured.call("POST", "/v1/queues/prod/messages", data=body * 1000, headers=BATCH, user=None)
    assert anonymous.status == 401
    assert messages_of(secured, "prod") == ["secret"]

    # Its own queue: corrupt bytes are a 400 invalid_batch, never a 500, and store nothing.
    good = record_batch.encode([b"ok"])
    for bad in (good[:-1], huge_count(good), good + b"\xff" * 64, b"\x00" * 4096, b"CPP2" + good):
        answer = secured.call("POST", "/v1/queues/dev-own/messages", data=good + bad, headers=BATCH)
        assert (answer.status, answer.body["error"]["code"]) == (400, "invalid_batch"), answer.body
    # The limits hold: headers, payload size, body size.
    many = [{f"h{i}": "v" for i in range(DEFAULTS.max_message_headers + 1)}]
    answer = secured.call(
        "POST", "/v1/queues/dev-own/messages", data=record_batch.encode([b"h"], headers=many), headers=BATCH
    )
    assert (answer.status, answer.body["error"]["code"]) == (400, "message_headers_too_large")
    big = record_batch.encode([b"x" * (DEFAULTS.max_message_size + 1)])
    answer = secured.call("POST", "/v1/queues/dev-own/messages", data=big, headers=BATCH)
    assert (answer.status, answer.body["error"]["code"]) == (413, "payload_too_large")
    assert messages_of(secured, "dev-own") == []

    # And what it may do, it does, in the binary forms both ways.
    stored = secured.call("POST", "/v1/queues/dev-own/messages", data=body, headers=BATCH)
    assert stored.status == 200 and stored.body["results"] == [{"id": 1, "duplicate": False}]
    page = secured.call("GET", "/v1/queues/dev-own/messages", headers=PAGE)
    assert page.status == 200
    messages, last_id = batch_page.decode_page(page.body)
    assert [(m.data, m.source, m.external_id) for m in messages] == [("planted", "prod-cluster", 1)]
    assert last_id == 1
    assert secured.call("GET", "/healthz", user=None).status == 200


def test_a_page_on_another_site_cannot_post_a_batch(secured: Secured) -> None:
    assert secured.call("PUT", "/v1/queues/dev-web", {}, user="admin").status == 201
    cross_site = {**BATCH, "Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}
    body = record_batch.encode([b"from a page"])
    answer = secured.call("POST", "/v1/queues/dev-web/messages", data=body, headers=cross_site)
    assert (answer.status, answer.body["error"]["code"]) == (403, "cross_site_request")
    assert messages_of(secured, "dev-web") == []
