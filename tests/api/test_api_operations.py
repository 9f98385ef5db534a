"""Health, readiness, metrics, the OpenAPI document and the error middleware."""

from __future__ import annotations

import asyncio
import logging
import re
from pathlib import Path
from typing import Any

import jsonschema
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from capella import errors
from capella.api import create_app
from capella.api.app import HTTP_CODES, ROUTES, document
from capella.api.errors import status_for
from capella.config import ServerSettings, parse_config
from capella.core.cluster import Cluster
from capella.handlers.supervisor import Supervisor
from capella.metrics import escape

DOCUMENT = document()

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_]+="(?:[^"\\]|\\.)*",?)*\})? (\S+)$')


async def test_healthz(api: TestClient) -> None:
    resp = await api.get("/healthz")
    assert resp.status == 200
    assert await resp.json() == {"status": "ok"}


async def test_readyz(api: TestClient, cluster: Cluster) -> None:
    resp = await api.get("/readyz")
    assert (resp.status, await resp.json()) == (200, {"status": "ready"})
    cluster.ready = False
    resp = await api.get("/readyz")
    assert resp.status == 503
    cluster.ready = True


def parse_metrics(text: str) -> dict[str, float]:
    samples: dict[str, float] = {}
    types: dict[str, str] = {}
    for line in text.splitlines():
        if not line:
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert name not in types, f"{name} typed twice"
            types[name] = kind
            continue
        if line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        assert m, f"not a valid sample line: {line!r}"
        family = (
            re.sub(r"_(bucket|sum|count)$", "", m.group(1))
            if m.group(1).startswith("capella_flush")
            else m.group(1)
        )
        assert family in types, f"sample before its TYPE: {line!r}"
        samples[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return samples


async def test_metrics(api: TestClient) -> None:
    await api.put("/v1/queues/orders", json={})
    await api.post("/v1/queues/orders/messages", json={"messages": [{"data": "ab"}, {"data": "cd"}]})
    await api.post("/v1/queues/orders/messages", json={"data": "x", "source": "s", "external_id": 1})
    await api.post("/v1/queues/orders/messages", json={"data": "x", "source": "s", "external_id": 1})
    await api.put("/v1/queues/orders/subscriptions/billing", json={"last_id": 1, "replica": True})
    await api.get("/v1/queues/orders/messages")
    resp = await api.get("/metrics")
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    text = await resp.text()
    assert text.endswith("\n")
    samples = parse_metrics(text)
    assert samples['capella_queue_messages{queue="orders"}'] == 3
    assert samples['capella_queue_last_id{queue="orders"}'] == 3
    assert samples['capella_produced_messages_total{queue="orders"}'] == 3
    assert samples['capella_duplicate_messages_total{queue="orders"}'] == 1
    assert samples['capella_produce_requests_total{queue="orders"}'] == 3
    assert samples['capella_read_messages_total{queue="orders"}'] == 3
    assert samples['capella_queue_blocks{queue="orders",state="open"}'] == 1
    assert samples['capella_subscription_lag{queue="orders",subscription="billing",replica="true"}'] == 2
    assert "capella_queue_bytes" in text
    buckets = [(k, v) for k, v in samples.items() if k.startswith("capella_flush_seconds_bucket")]
    assert buckets[-1][0] == 'capella_flush_seconds_bucket{le="+Inf"}'
    counts = [v for _, v in buckets]
    assert counts == sorted(counts), "buckets must be cumulative"
    assert counts[-1] == samples["capella_flush_seconds_count"] >= 1


def test_label_values_are_escaped() -> None:
    assert escape('a"b\\c\nd') == 'a\\"b\\\\c\\nd'


async def test_openapi_describes_every_path(api: TestClient) -> None:
    resp = await api.get("/v1/openapi.json")
    assert resp.status == 200
    doc = orjson.loads(await resp.read())
    assert doc["openapi"].startswith("3.1")
    assert doc == orjson.loads(orjson.dumps(DOCUMENT))
    expected: dict[str, set[str]] = {}
    for route in ROUTES:
        expected.setdefault(route.path, set()).add(route.method.lower())
    assert {path: set(ops) - {"parameters"} for path, ops in doc["paths"].items()} == expected
    # Every route the app serves is in the document.
    routes = {
        (r.method.lower(), r.resource.canonical)
        for r in api.app.router.routes()
        if r.resource is not None and r.method != "HEAD"
    }
    documented = {(op, path) for path, ops in doc["paths"].items() for op in ops if op != "parameters"}
    assert routes == documented
    # Every $ref points at something that exists.
    for target in re.findall(r'"\$ref":"#/components/(\w+)/(\w+)"', orjson.dumps(doc).decode()):
        assert target[1] in doc["components"][target[0]], target


# Bodies on both sides of a rule the document once got wrong (found with schemathesis'
# positive_data_acceptance check): params was not tied to the handler type, and as a oneOf
# it refused {"interval": 5}, which three params schemas take; the credential, size and age
# rules were only in descriptions.
BODY_SCHEMAS = {
    "/v1/queues/q": "QueueDefinition",
    "/v1/handlers/h": "HandlerDefinition",
    "/v1/clusters/c": "ClusterDefinition",
}


@pytest.mark.parametrize(
    ("path", "body", "accepted"),
    [
        ("/v1/handlers/h", {"type": "flush", "queue": "q", "params": {"interval": 5}}, True),
        ("/v1/handlers/h", {"type": "unload", "queue": "q", "params": {}}, True),
        ("/v1/handlers/h", {"type": "flush", "queue": "q", "params": {"idle": 5}}, False),
        ("/v1/handlers/h", {"type": "expire", "queue": "q", "params": {}}, False),
        ("/v1/clusters/c", {"url": "http://a", "username": "u"}, True),
        ("/v1/clusters/c", {"url": "http://a", "password_secret": "P"}, False),
        ("/v1/clusters/c", {"url": "http://a", "token_secret": "T", "password_secret": "P"}, False),
        ("/v1/queues/q", {"block": {"max_bytes": 1024, "max_age": 0.5}}, True),
        ("/v1/queues/q", {"block": {"max_bytes": 1023}}, False),
        ("/v1/queues/q", {"block": {"max_age": 0}}, False),
    ],
)
async def test_the_document_and_the_server_agree_on_a_body(
    api: TestClient, path: str, body: dict[str, Any], accepted: bool
) -> None:
    schema = {"$ref": f"#/components/schemas/{BODY_SCHEMAS[path]}", "components": DOCUMENT["components"]}
    assert jsonschema.Draft202012Validator(schema).is_valid(body) is accepted
    if path != "/v1/queues/q":
        assert (await api.put("/v1/queues/q", json={})).status == 201
    resp = await api.put(path, json=body)
    assert (resp.status < 300) is accepted, await resp.text()


async def test_unknown_route_and_wrong_method(api: TestClient) -> None:
    resp = await api.get("/v1/nothing/here")
    assert resp.status == 404
    assert (await resp.json())["error"]["code"] == "not_found"
    resp = await api.post("/v1/queues")
    assert resp.status == 405
    assert (await resp.json())["error"]["code"] == "method_not_allowed"
    assert "GET" in resp.headers["Allow"]


async def test_unexpected_errors_are_500_internal_and_logged_once(
    aiohttp_client: Any, cluster: Cluster, supervisor: Supervisor, caplog: pytest.LogCaptureFixture
) -> None:
    app = create_app(cluster, ServerSettings(), supervisor)

    async def boom(request: web.Request) -> web.Response:
        raise RuntimeError("kaboom")

    app.router.add_get("/boom", boom)
    client = await aiohttp_client(app)
    with caplog.at_level(logging.ERROR, logger="capella.api.app"):
        resp = await client.get("/boom")
    assert resp.status == 500
    assert await resp.json() == {"error": {"code": "internal", "message": "internal server error"}}
    records = [r for r in caplog.records if r.name == "capella.api.app"]
    assert len(records) == 1 and records[0].exc_info is not None


async def test_body_over_max_body_size_is_413(api: TestClient, api_settings: ServerSettings) -> None:
    await api.put("/v1/queues/q", json={})
    body = b"x" * (api_settings.max_body_size + 1)
    resp = await api.post(
        "/v1/queues/q/messages", data=body, headers={"Content-Type": "application/octet-stream"}
    )
    assert resp.status == 413
    assert (await resp.json())["error"]["code"] == "payload_too_large"


async def test_slow_body_is_408(api: TestClient) -> None:
    await api.put("/v1/queues/q", json={})
    assert api.server.host is not None and api.server.port is not None
    reader, writer = await asyncio.open_connection(api.server.host, api.server.port)
    writer.write(
        b"POST /v1/queues/q/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b'Content-Length: 100\r\n\r\n{"data": '
    )
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
    assert head.startswith(b"HTTP/1.1 408"), head
    length = int(re.search(rb"Content-Length: (\d+)", head, re.IGNORECASE).group(1))  # type: ignore[union-attr]
    body = orjson.loads(await reader.readexactly(length))
    assert body["error"]["code"] == "request_timeout"
    writer.close()
    await writer.wait_closed()
    assert (await api.get("/v1/queues/q")).status == 200
    assert (await (await api.get("/v1/queues/q")).json())["stats"]["last_id"] == 0


async def test_a_recovering_cluster_is_live_but_not_ready(aiohttp_client: Any, tmp_path: Path) -> None:
    config = parse_config(
        {"cluster": {"name": "test"}, "mounts": {"default": {"provider": "memory"}}}, {}, tmp_path
    )
    cluster = Cluster.create(config)
    supervisor = Supervisor(cluster)
    client = await aiohttp_client(create_app(cluster, config.server, supervisor))
    assert (await client.get("/healthz")).status == 200
    resp = await client.get("/readyz")
    assert resp.status == 503
    for path in ("/v1/queues", "/v1/handlers"):
        resp = await client.get(path)
        assert resp.status == 503
        assert (await resp.json())["error"]["code"] == "not_ready"
    assert (await client.get("/metrics")).status == 200
    await cluster.start()
    await supervisor.start()
    try:
        assert (await client.get("/readyz")).status == 200
        assert (await client.get("/v1/queues")).status == 200
        assert (await client.get("/v1/handlers")).status == 200
    finally:
        await supervisor.close()
        await cluster.close()


# Raised by the client library or the command line (a peer it cannot reach, too few clusters
# answered a multi-write, a context that is not in the contexts file); the server never answers
# with them.
CLIENT_ONLY_CODES = {"unreachable", "not_enough_replicas", "context_not_found"}


def test_every_error_code_the_server_can_answer_is_documented_under_its_status() -> None:
    texts = {
        int(name[1:]): response["description"]
        for name, response in DOCUMENT["components"]["responses"].items()
    }
    served = {
        (status_for(cls()), cls.code) for cls in errors.error_classes() if cls.code not in CLIENT_ONLY_CODES
    }
    served |= {(status, code) for status, code in HTTP_CODES.items()}
    missing = sorted((status, code) for status, code in served if code not in texts.get(status, ""))
    assert not missing, f"error codes missing from the document: {missing}"
