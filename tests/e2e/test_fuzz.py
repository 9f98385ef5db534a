"""Fuzz the whole HTTP API from its OpenAPI document, against a real ``capella serve``.

schemathesis generates requests for every operation in the document: ones that follow it and
ones that break it on purpose. They go to a server subprocess on loopback that already holds
a few queues, subscriptions, handlers and a cluster; the names in the paths are steered
onto those objects part of the time, so real objects are hit as well as missing ones.

Whatever is sent, the server must never answer 5xx, every 4xx must be the JSON error shape,
documented answers must match the document (status, content type, headers, body schema),
and the process must outlive the run with no traceback in its log. The last test checks
that the run made its requests, so it cannot pass by testing nothing.

The run is the same on every machine (a fixed seed). For a longer or different run locally:
``CAPELLA_FUZZ_EXAMPLES=200 CAPELLA_FUZZ_SEED=7 pytest tests/e2e/test_fuzz.py``.

``test_schemathesis_finds_no_disagreement`` (``make fuzz``, a few minutes, not part of
``make test``) is schemathesis' own run with every check but the authorization ones, for three
seeds: a request the document allows is accepted, one it forbids is refused, every method and
``Allow`` header is the document's. It runs against a server with authentication off: the
coverage phase sends bad credentials, and an address locked out by them would be answered 429
for everything, testing nothing.

Credentials: the server runs with authentication on, and every request carries the admin's
Basic ``Authorization`` (``FuzzServer.headers``). A second pass sends generated requests to
every non-public operation without credentials: each must be a 401 with the JSON error.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
import requests
import schemathesis
from hypothesis import settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from support.servers import ServerProcess, free_port

from capella.api.app import ROUTES, document
from capella.records import record_batch
from capella.wire import batch_page
from capella.wire.fields import URL_EXCLUDED

from . import fuzz_rules

DOCUMENT = document()

# Examples per operation in the fuzzing phase, on top of the coverage phase's boundary cases;
# the operations that take a body get four times as many, since most of the parsing is there.
EXAMPLES = int(os.environ.get("CAPELLA_FUZZ_EXAMPLES", 20))
BODY_OPERATIONS = ["putQueue", "produce", "commitSubscription", "putHandler", "putCluster"]
SEED = int(os.environ.get("CAPELLA_FUZZ_SEED", 1_700_000_000))
MIN_REQUESTS = 300

# Long-polls (wait, replica_timeout) are capped by max_wait, so no request holds the run up;
# small limits make the over-the-limit answers reachable by generated bodies.
OPEN_SERVER_TOML = """
[cluster]
name = "fuzz"

[server]
max_wait = "0.2s"
body_timeout = "1s"
max_body_size = "256KiB"
max_message_size = "16KiB"
max_batch = 100
max_limit = 50
shutdown_timeout = "2s"

[mounts.default]
provider = "file"
path = "queues"
"""
SERVER_TOML = (
    OPEN_SERVER_TOML
    + """
[auth]
enabled = true
bootstrap_user = "fuzz-admin"
bootstrap_password_env = "CAPELLA_FUZZ_ADMIN_PASSWORD"
"""
)
ADMIN_PASSWORD = "fuzz-admin-password"
# The routes that answer without credentials (health, the document, the console's files).
PUBLIC_OPERATIONS = [route.op for route in ROUTES if route.need is None]

# Values that random generation seldom reaches and parsers often trip on: digits that overflow
# a float, infinities, 64-bit edges, digits int() takes but a pattern may not, long names.
# Printable ASCII without outer spaces, because they go into headers as well as queries.
EDGE_TEXT = [
    "9" * 400,
    "9" * 400 + "s",
    "1e999",
    "inf",
    "-inf",
    "nan",
    "-0",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775809",
    "1_000",
    "a" * 300,
    "0001-01-01T00:00:00Z",
    "9999-12-31T23:59:59-23:59",
]
# Bodies also get what a header cannot carry: spaces around, another script's digits, NUL.
EDGE_STRINGS = [*EDGE_TEXT, " 5 ", "\u0661\u0662", "\u0000", "\u00e9"]
EDGE_NUMBERS = [2**63 - 1, 2**63, -(2**63) - 1, 2**64, 1e300, -1e300, 5e-324, 0, -1]
EDGE_VALUES = [*EDGE_STRINGS, *EDGE_NUMBERS]
# For a field that holds a number or digits (a duration, a size, an id, a time): extremes of
# the same kind get past type checks and reach the arithmetic behind them.
NUMERIC_EDGES = ["9" * 400, "9" * 400 + "s", "9" * 400 + "MiB", "1e999", "nan", *EDGE_NUMBERS]
KEEP = object()  # an edit that leaves the field as generated

SCHEMATHESIS_CONFIG = {
    "seed": SEED,
    "generation": {
        "mode": "all",
        "max-examples": EXAMPLES,
        # Query, path and header values of these types are an edge value part of the time.
        "dictionaries": {
            "string": {"dictionary": "edge-text", "probability": 0.15},
            "integer": {"dictionary": "edge-numbers", "probability": 0.15},
            "number": {"dictionary": "edge-numbers", "probability": 0.15},
        },
    },
    "dictionaries": {
        "edge-text": {"values": EDGE_TEXT},
        "edge-numbers": {"values": EDGE_NUMBERS},
    },
    "request-timeout": 5,
    # An SSE stream never ends: stop after its first event, or after a short wait on an idle queue.
    "max-stream-events": 1,
    "operations": [
        {"include-operation-id": "streamMessages", "request-timeout": 0.3},
        {"include-operation-id": BODY_OPERATIONS, "generation": {"max-examples": 4 * EXAMPLES}},
    ],
}

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]

# The objects the server holds before the run; path names are steered onto these.
QUEUES = ("orders", "empty")
SUBSCRIPTIONS = ("billing", "mirror")
HANDLERS = ("flush-orders", "expire-orders", "copy-orders")
CLUSTERS = ("remote",)
TOPICS = ("events",)

# A URL the server takes for a cluster (capella/links/link.py _URL: no ASCII blank or
# control character, any other character): its host is replaced before the request goes out, so
# no ping or copy ever leaves the machine, whatever the generated host (U+2003 included).
ACCEPTED_URL = re.compile(rf"(https?://)([^{URL_EXCLUDED}/]+)((/[^{URL_EXCLUDED}]*)?)")

# The document the server serves (the fixture checks that): loaded here, at collection time,
# because schemathesis' loading from a fixture does not work with pytest 9.2.
schema = schemathesis.openapi.from_dict(DOCUMENT, config=schemathesis.Config.from_dict(SCHEMATHESIS_CONFIG))


@schemathesis.serializer("application/x-ndjson")
def ndjson_body(ctx: schemathesis.SerializationContext, value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return json.dumps(value).encode()  # not orjson: negative bodies hold integers past 64 bits


@schemathesis.serializer(batch_page.BATCH_MEDIA_TYPE)
def batch_body(ctx: schemathesis.SerializationContext, value: Any) -> bytes:
    """Generated bytes as they are (most do not parse: 400 invalid_batch) or, for half of them,
    as the payload of a well-formed record batch, so that good bodies are sent too."""
    raw = getattr(value, "data", value)
    raw = raw.encode() if isinstance(raw, str) else bytes(raw) if isinstance(raw, bytes | bytearray) else b"x"
    return record_batch.encode([raw]) if len(raw) % 2 == 0 else raw


def known_names(path: str, parameter: str) -> tuple[str, ...]:
    if parameter == "queue":
        return (*QUEUES, "events~1")
    if parameter == "topic":
        return TOPICS
    if path.startswith("/v1/handlers/"):
        return HANDLERS
    if path.startswith("/v1/clusters/"):
        return CLUSTERS
    return SUBSCRIPTIONS


@schema.hook
def flatmap_path_parameters(ctx: schemathesis.HookContext, path_parameters: Any) -> Any:
    """Each name in the path: the generated one, or one of the objects the server holds.

    Without this nearly every request with a name would be a 404 that never reaches the
    checks of its query or body.
    """
    if not isinstance(path_parameters, dict) or ctx.operation is None:
        return st.just(path_parameters)
    path = ctx.operation.path
    return st.fixed_dictionaries(
        {name: st.sampled_from([value, *known_names(path, name)]) for name, value in path_parameters.items()}
    )


@schema.hook
def flatmap_body(ctx: schemathesis.HookContext, body: Any) -> Any:
    """Some fields of the body, at any depth, become edge values.

    A handler definition also names an existing queue part of the time, so some are created.
    """
    bodies = st.just(body)
    if (
        ctx.operation is not None
        and ctx.operation.label == "PUT /v1/handlers/{name}"
        and isinstance(body, dict)
    ):
        bodies = st.sampled_from([body, {**body, "queues": ["orders"]}, {**body, "queues": ["*"]}])
    return bodies.flatmap(with_edge_values)


def with_edge_values(body: Any) -> st.SearchStrategy[Any]:
    leaves = list(leaf_paths(body, ()))
    if not leaves:
        return st.just(body)
    edits = (edit(leaf_at(body, path)) for path in leaves)
    return st.tuples(*edits).map(lambda values: edited(body, leaves, values))


def edit(value: Any) -> st.SearchStrategy[object]:
    """One field in six: a small body gets an edge value now and then, a big one a few."""
    numeric = type(value) in (int, float) or (isinstance(value, str) and value.strip()[:1].isdigit())
    edges = NUMERIC_EDGES if numeric else EDGE_VALUES
    return st.integers(0, 5).flatmap(lambda n: st.sampled_from(edges) if n == 0 else st.just(KEEP))


def leaf_at(value: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        value = value[key]
    return value


def edited(body: Any, leaves: list[tuple[Any, ...]], edits: tuple[object, ...]) -> Any:
    for path, value in zip(leaves, edits, strict=True):
        if value is not KEEP:
            body = replaced(body, path, value)
    return body


def leaf_paths(value: Any, path: tuple[Any, ...]) -> Iterator[tuple[Any, ...]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from leaf_paths(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from leaf_paths(item, (*path, index))
    elif path:
        yield path


def replaced(value: Any, path: tuple[Any, ...], new: object) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {**value, head: replaced(value[head], rest, new)}
    return [replaced(item, rest, new) if i == head else item for i, item in enumerate(value)]


# Each partition of a topic is a queue: a generated count is folded into 1..MAX_FUZZ_PARTITIONS,
# or every boundary case of the coverage phase (1000, 999) makes and drops a thousand queues
# and the run takes many minutes testing the same code. Still a count the document allows.
MAX_FUZZ_PARTITIONS = 8


def keep_topics_small(case: schemathesis.Case) -> None:
    if case.operation.label != "PUT /v1/topics/{topic}" or not isinstance(case.body, dict):
        return
    partitions = case.body.get("partitions")
    # A whole float (482.0) is a count too: wire.decode takes it as the integer.
    if (
        type(partitions) in (int, float)
        and partitions > MAX_FUZZ_PARTITIONS
        and partitions == int(partitions)
    ):
        case.body["partitions"] = int(partitions) % MAX_FUZZ_PARTITIONS + 1


@dataclass
class FuzzServer:
    """The server under test, the objects it holds, and the requests the run made to it."""

    process: ServerProcess
    # Nothing listens here: the only address a cluster may point at.
    closed_port: int
    # Sent with every request unless a call says otherwise (credentials, once there are any).
    headers: dict[str, str] = field(default_factory=dict)
    calls: Counter[str] = field(default_factory=Counter)
    statuses: Counter[int] = field(default_factory=Counter)

    @property
    def url(self) -> str:
        return self.process.url

    def call(self, case: schemathesis.Case, headers: dict[str, str] | None = None) -> schemathesis.Response:
        """Send ``case`` with ``headers`` (default: the server's), and count it."""
        self.keep_clusters_local(case)
        keep_topics_small(case)
        response = case.call(base_url=self.url, headers=self.headers if headers is None else headers)
        self.calls[case.operation.label] += 1
        self.statuses[response.status_code] += 1
        if case.method == "DELETE" and response.status_code == 204:
            self.put_objects()  # what was dropped may be one of the objects the paths are steered onto
        return response

    def keep_clusters_local(self, case: schemathesis.Case) -> None:
        """Clusters and push handlers reach a closed local port, whatever host was generated."""
        if not isinstance(case.body, dict):
            return
        if case.operation.label == "PUT /v1/clusters/{name}":
            body = case.body
        elif case.operation.label == "PUT /v1/handlers/{name}" and isinstance(case.body.get("params"), dict):
            body = case.body["params"]
        else:
            return
        url = body.get("url")
        if isinstance(url, str) and (m := ACCEPTED_URL.fullmatch(url)) and "@" not in m.group(2):
            body["url"] = f"{m.group(1)}127.0.0.1:{self.closed_port}{m.group(3)}"

    def put_objects(self) -> None:
        """Create, or put back, the objects the generated paths are steered onto."""
        # Generated PUTs may have narrowed a queue to a segment range: this widens it again.
        for queue in (*QUEUES, "copies"):
            self.request("PUT", f"/v1/queues/{queue}", {"block": {"max_messages": 5}, "segments": None})
        messages = [
            {"data": "plain"},
            {"data_b64": "AP8A/w==", "source": "fuzz", "segment": 3, "headers": {"kind": "bytes"}},
            {"data": "with external", "external_id": 42, "external_time": 1_700_000_000},
        ]
        for _ in range(4):
            self.request("POST", "/v1/queues/orders/messages", {"messages": messages})
        # Generated PUTs may have grown the topic, which never shrinks: it keeps its count.
        shown = requests.get(f"{self.url}/v1/topics/events", headers=self.headers, timeout=10)
        partitions = shown.json()["partitions"] if shown.status_code == 200 else 2
        self.request("PUT", "/v1/topics/events", {"partitions": partitions, "queue": {"segments": None}})
        self.request("POST", "/v1/queues/events~1/messages", {"messages": messages})
        self.request("PUT", "/v1/queues/orders/subscriptions/billing", {"last_id": 3})
        self.request("PUT", "/v1/queues/orders/subscriptions/mirror", {"last_id": 10, "replica": True})
        self.request("PUT", "/v1/clusters/remote", {"url": f"http://127.0.0.1:{self.closed_port}"})
        self.request("PUT", "/v1/handlers/flush-orders", {"type": "flush", "queues": ["orders"]})
        expire = {"type": "expire", "queue": "orders", "params": {"max_messages": 1000}}
        self.request("PUT", "/v1/handlers/expire-orders", expire)
        copy = {"type": "copy", "queue": "orders", "params": {"to": "copies", "wait": 0.1}, "started": False}
        self.request("PUT", "/v1/handlers/copy-orders", copy)

    def request(self, method: str, path: str, body: object) -> None:
        resp = requests.request(method, f"{self.url}{path}", json=body, headers=self.headers, timeout=10)
        assert resp.status_code < 300, f"{method} {path}: {resp.status_code} {resp.text}"


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzServer]:
    root = tmp_path_factory.mktemp("fuzz")
    config = root / "capella.toml"
    config.write_text(SERVER_TOML)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("CAPELLA_FUZZ_ADMIN_PASSWORD", ADMIN_PASSWORD)
        process = ServerProcess(root / "data", config=config)
    try:
        process.wait_ready()
        credentials = base64.b64encode(f"fuzz-admin:{ADMIN_PASSWORD}".encode()).decode()
        server = FuzzServer(process, free_port(), headers={"Authorization": f"Basic {credentials}"})
        served = requests.get(f"{server.url}/v1/openapi.json", timeout=10).json()
        assert served == orjson.loads(orjson.dumps(DOCUMENT)), "the served document is not the one fuzzed"
        server.put_objects()
        yield server
    finally:
        process.stop()


def assert_error_shape(response: schemathesis.Response) -> None:
    body = response.json()
    assert isinstance(body, dict) and set(body) == {"error"}, response.text
    error = body["error"]
    assert isinstance(error.get("code"), str) and error["code"], response.text
    assert isinstance(error.get("message"), str) and error["message"], response.text


@schema.parametrize()
@settings(deadline=None, database=None)
def test_generated_requests(case: schemathesis.Case, fuzz_server: FuzzServer) -> None:
    response = fuzz_server.call(case)
    case.validate_response(response, checks=CHECKS)
    if 400 <= response.status_code < 500:
        assert_error_shape(response)


@schema.exclude(operation_id=PUBLIC_OPERATIONS).parametrize()
@settings(deadline=None, database=None, max_examples=3)
def test_every_non_public_operation_needs_credentials(
    case: schemathesis.Case, fuzz_server: FuzzServer
) -> None:
    # Generated Basic credentials would each cost a slow hash for the same 401: send none.
    case.headers = {k: v for k, v in (case.headers or {}).items() if k.lower() != "authorization"}
    response = fuzz_server.call(case, headers={})
    assert response.status_code == 401, (case.operation.label, response.status_code, response.text)
    assert_error_shape(response)
    assert response.json()["error"]["code"] == "unauthorized"
    challenge = {name.lower(): value for name, value in response.headers.items()}["www-authenticate"]
    assert "Basic" in str(challenge)


def test_the_run_made_its_requests_and_the_server_outlived_them(fuzz_server: FuzzServer) -> None:
    """Runs after test_generated_requests (file order) and checks what it did."""
    if not fuzz_server.calls:
        pytest.skip("checks what test_generated_requests did: run the whole module")
    total = sum(fuzz_server.calls.values())
    assert total >= MIN_REQUESTS, fuzz_server.calls
    operations = {result.ok().label for result in schema.get_all_operations()}
    assert set(fuzz_server.calls) == operations
    # Both sides were reached: requests that did something, and requests that were refused.
    answered = {kind: sum(n for s, n in fuzz_server.statuses.items() if s // 100 == kind) for kind in (2, 4)}
    assert answered[2] >= MIN_REQUESTS // 10 and answered[4] >= MIN_REQUESTS // 10, fuzz_server.statuses
    fuzz_server.process.wait_ready(timeout=5)
    log = fuzz_server.process.log()
    assert "Traceback" not in log, log[max(0, log.index("Traceback") - 300) :][:3000]


# Issue 34's seeds and one more. Every check but the authorization ones, which need users.
AGREEMENT_SEEDS = (20261123, 4242, 424242)
AGREEMENT_ARGS = [
    "--checks=all",
    "--exclude-checks=ignored_auth,object_level_authorization",
    "--phases=coverage,fuzzing",
    "--max-examples=40",
    # A handler's "run now" answers when its pass ends: at most 5 s (PASS_SECONDS).
    "--request-timeout=10",
    "--no-color",
]
# The relay's 502 unreachable and 504 gateway_timeout are its documented answers when the far
# cluster cannot be reached or does not answer, and the clusters a run makes point at hosts
# that are not there ("http://0"). (schemathesis counts any 5xx a server error, documented or not.)
AGREEMENT_CONFIG = r"""
[[operations]]
include-path-regex = '^/v1/clusters/\{name\}/v1/'
checks.not_a_server_error.expected-statuses = ["2xx", "3xx", "4xx", "502", "504"]
"""


@pytest.mark.fuzz
@pytest.mark.timeout(900)
@pytest.mark.parametrize("seed", AGREEMENT_SEEDS)
def test_schemathesis_finds_no_disagreement(seed: int, tmp_path: Path) -> None:
    config = tmp_path / "capella.toml"
    config.write_text(OPEN_SERVER_TOML)
    settings = tmp_path / "schemathesis.toml"
    settings.write_text(AGREEMENT_CONFIG)
    process = ServerProcess(tmp_path / "data", config=config)
    try:
        process.wait_ready()
        for queue in (fuzz_rules.QUEUE, fuzz_rules.OTHER_QUEUE):
            requests.put(f"{process.url}/v1/queues/{queue}", json={}, timeout=10).raise_for_status()
        command = [str(Path(sys.executable).parent / "schemathesis"), "--config-file", str(settings), "run"]
        command += [f"{process.url}/v1/openapi.json", f"--seed={seed}", *AGREEMENT_ARGS]
        # The rules the document states in words: fuzz_rules.py, beside this file.
        here = Path(__file__).parent
        env = {**os.environ, "SCHEMATHESIS_HOOKS": "fuzz_rules"}
        env["PYTHONPATH"] = os.pathsep.join([str(here), *filter(None, [env.get("PYTHONPATH")])])
        run = subprocess.run(
            command, capture_output=True, text=True, timeout=840, cwd=tmp_path, env=env, check=False
        )
        report = run.stdout[run.stdout.find("FAILURES") :] if "FAILURES" in run.stdout else run.stdout
        assert run.returncode == 0, report[-30_000:] + run.stderr[-2000:]
        log = process.log()
        assert "Traceback" not in log, log[max(0, log.index("Traceback") - 300) :][:3000]
    finally:
        process.stop()
