"""Web pages against the broker: cross-site requests and DNS rebinding, on real servers on loopback.

A page on any site can make the browser of someone who runs Capella on their laptop send a
``POST`` with a ``text/plain`` or form body (no preflight) to ``127.0.0.1:8676``; the browser
marks it with ``Sec-Fetch-Site`` and ``Origin``. A page on a name the attacker re-points at
127.0.0.1 (DNS rebinding) is same-origin to the browser; only its ``Host`` gives it away. Each
request below is sent as such a browser sends it, with ``http.client`` so every header is the
test's, and the same request from curl (no browser headers) still works.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from support.servers import ServerProcess, running

from capella.api import create_app
from capella.api.browser import KNOWN_HOSTS
from capella.config import CorsSettings, ServerSettings, parse_config
from capella.core.cluster import Cluster
from capella.errors import InvalidConfig
from capella.handlers.supervisor import Supervisor
from security.conftest import Secured

EVIL = "https://evil.example"
FLUSH = {"type": "flush", "queues": ["flushed"], "started": False}


def send(
    port: int, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    """One request with exactly these headers (plus Content-Length); (status, parsed body)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        connection.request(method, path, body=data, headers=headers or {})
        resp = connection.getresponse()
        raw = resp.read()
    finally:
        connection.close()
    try:
        return resp.status, json.loads(raw) if raw else None
    except ValueError:
        return resp.status, raw


def code(answer: tuple[int, Any]) -> tuple[int, str | None]:
    status, body = answer
    return status, body["error"]["code"] if isinstance(body, dict) and "error" in body else None


def curl(url: str, method: str, body: str) -> Any:
    done = subprocess.run(
        ["curl", "-s", "-X", method, url, "-d", body], capture_output=True, text=True, timeout=30, check=True
    )
    return json.loads(done.stdout)


# What a browser adds to a request a page on another site makes it send without a preflight.
CROSS_SITE = {"Origin": EVIL, "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"}
# An older browser (no Sec-Fetch-*) marks it with the Origin alone.
OLD_BROWSER = {"Origin": EVIL}


@pytest.fixture(autouse=True)
def flushed(request: pytest.FixtureRequest) -> None:
    """The queue ``FLUSH`` handlers name, on the module's server when the test uses it."""
    if "server_process" in request.fixturenames:
        port = request.getfixturevalue("server_process").port
        assert send(port, "PUT", "/v1/queues/flushed", {})[0] in (200, 201)


@pytest.fixture
def work_queue(server_process: ServerProcess) -> str:
    """An ack-mode subscription with five pending messages; its path."""
    queue = f"jobs-{uuid.uuid4().hex[:8]}"
    port = server_process.port
    assert send(port, "PUT", f"/v1/queues/{queue}", {})[0] == 201
    assert send(port, "PUT", f"/v1/queues/{queue}/subscriptions/workers", {"mode": "ack"})[0] == 201
    messages = {"messages": [{"data": f"job {i}"} for i in range(5)]}
    assert send(port, "POST", f"/v1/queues/{queue}/messages", messages)[0] == 200
    return f"/v1/queues/{queue}/subscriptions/workers"


def pending(port: int, subscription: str) -> list[int]:
    status, body = send(port, "GET", f"{subscription}/work?status=pending")
    assert status == 200, body
    return [m["id"] for m in body["messages"]]


@pytest.mark.parametrize(
    ("marks", "content_type"),
    [
        (CROSS_SITE, "text/plain;charset=UTF-8"),
        (CROSS_SITE, "application/x-www-form-urlencoded"),
        ({**CROSS_SITE, "Sec-Fetch-Site": "same-site"}, "text/plain"),
        (OLD_BROWSER, "text/plain"),
        ({"Origin": "null"}, "text/plain"),  # a sandboxed frame, a file:// page
    ],
    ids=["cross-site", "form", "same-site", "origin-only", "origin-null"],
)
def test_a_cross_site_post_deletes_nothing_while_curl_still_can(
    server_process: ServerProcess, work_queue: str, marks: dict[str, str], content_type: str
) -> None:
    port = server_process.port
    body = b'{"status": ["pending"]}'

    refused = send(port, "POST", f"{work_queue}/work/delete", body, {**marks, "Content-Type": content_type})

    assert code(refused) == (403, "cross_site_request")
    assert "server.cors" in refused[1]["error"]["message"]
    assert pending(port, work_queue) == [1, 2, 3, 4, 5]

    done = curl(f"{server_process.url}{work_queue}/work/delete", "POST", body.decode())
    assert done["deleted"] == [1, 2, 3, 4, 5]
    assert pending(port, work_queue) == []


@pytest.mark.parametrize("method", ["PUT", "DELETE", "PATCH", "POST"])
def test_every_state_changing_method_from_another_site_is_refused(
    server_process: ServerProcess, method: str
) -> None:
    port = server_process.port
    name = f"cross-{method.lower()}"
    if method != "PUT":
        assert send(port, "PUT", f"/v1/handlers/{name}", FLUSH)[0] == 201

    answer = send(port, method, f"/v1/handlers/{name}", FLUSH, {**CROSS_SITE, "Content-Type": "text/plain"})

    assert code(answer) == (403, "cross_site_request")
    status, _ = send(port, "GET", f"/v1/handlers/{name}")
    assert status == (404 if method == "PUT" else 200), "nothing created, nothing dropped"


@pytest.mark.parametrize(
    "marks",
    [
        {"Sec-Fetch-Site": "same-origin"},  # the console, served by the broker itself
        {"Sec-Fetch-Site": "none"},  # typed into the address bar, a bookmark
        {},  # curl, the SDKs, the CLI
        {"Origin": "http://127.0.0.1:{port}"},  # an older browser, on the server's own origin
    ],
    ids=["same-origin", "none", "no-browser", "own-origin"],
)
def test_requests_from_the_same_origin_or_from_no_browser_pass(
    server_process: ServerProcess, marks: dict[str, str]
) -> None:
    port = server_process.port
    headers = {k: v.format(port=port) for k, v in marks.items()}
    name = f"same-{uuid.uuid4().hex[:8]}"

    assert send(port, "PUT", f"/v1/handlers/{name}", FLUSH, headers)[0] == 201
    assert send(port, "DELETE", f"/v1/handlers/{name}", None, headers)[0] == 204


def test_reads_from_another_site_are_not_refused(server_process: ServerProcess) -> None:
    # Without CORS headers the browser keeps the answer from the page; nothing changes.
    status, _ = send(server_process.port, "GET", "/v1/queues", None, CROSS_SITE)
    assert status == 200


async def test_an_origin_listed_in_cors_passes_even_marked_cross_site(
    aiohttp_client: Any, cluster: Cluster, supervisor: Supervisor
) -> None:
    page = "https://console.example.com"
    settings = ServerSettings(cors=CorsSettings(origins=(page,)))
    client: TestClient[Any, Any] = await aiohttp_client(create_app(cluster, settings, supervisor))
    marked = {"Sec-Fetch-Site": "cross-site", "Content-Type": "text/plain"}

    resp = await client.put("/v1/queues/listed", data=b"{}", headers={**marked, "Origin": page})
    assert resp.status == 201
    resp = await client.put("/v1/queues/other", data=b"{}", headers={**marked, "Origin": EVIL})
    assert resp.status == 403 and (await resp.json())["error"]["code"] == "cross_site_request"


def test_with_auth_on_a_cross_site_request_is_refused_before_the_login(secured: Secured) -> None:
    made = secured.call("PUT", "/v1/handlers/dev-x", FLUSH, headers=CROSS_SITE)
    assert (made.status, made.body["error"]["code"]) == (403, "cross_site_request")
    assert secured.call("GET", "/v1/handlers/dev-x").status == 404
    # Refused before the credentials are looked at: no password check for a refused page.
    wrong = secured.call("PUT", "/v1/handlers/dev-x", FLUSH, user=None, headers=CROSS_SITE)
    assert (wrong.status, wrong.body["error"]["code"]) == (403, "cross_site_request")
    # With auth on the Host is not checked: credentials protect the API.
    other_host = secured.call("GET", "/v1/me", headers={"Host": "broker.example.com"})
    assert other_host.status == 200, other_host.body


# --- DNS rebinding ------------------------------------------------------------------------


def test_a_rebinding_host_is_refused_and_creates_nothing(server_process: ServerProcess) -> None:
    port = server_process.port
    rebinding = {"Host": f"rebind.attacker.example:{port}", "Content-Type": "application/json"}

    refused = send(port, "PUT", "/v1/handlers/rebound", FLUSH, rebinding)

    assert code(refused) == (403, "host_not_allowed")
    assert "server.allowed_hosts" in refused[1]["error"]["message"]
    assert refused[1]["error"]["host"] == f"rebind.attacker.example:{port}"
    # Reads too: the attacker's page must not read the queues either.
    assert code(send(port, "GET", "/v1/queues", None, rebinding)) == (403, "host_not_allowed")
    assert code(send(port, "GET", "/ui/", None, rebinding)) == (403, "host_not_allowed")
    assert send(port, "GET", "/v1/handlers/rebound")[0] == 404

    assert send(port, "PUT", "/v1/handlers/rebound", FLUSH, {"Host": f"127.0.0.1:{port}"})[0] == 201


@pytest.mark.parametrize(
    "host",
    ["127.0.0.1:{port}", "127.0.0.1", "localhost:{port}", "LocalHost", "127.8.9.10:{port}", "[::1]:{port}"],
)
def test_loopback_hosts_are_served(server_process: ServerProcess, host: str) -> None:
    port = server_process.port
    assert send(port, "GET", "/v1/queues", None, {"Host": host.format(port=port)})[0] == 200


@pytest.mark.parametrize(
    "host",
    ["rebind.attacker.example", "localhost.attacker.example", "127.0.0.1.nip.io", "[::2]:{port}", "0.0.0.0"],
)
def test_names_that_merely_look_local_are_refused(server_process: ServerProcess, host: str) -> None:
    port = server_process.port
    assert code(send(port, "GET", "/v1/queues", None, {"Host": host.format(port=port)})) == (
        403,
        "host_not_allowed",
    )


def test_a_flood_of_host_names_changes_no_verdict(server_process: ServerProcess) -> None:
    # The server remembers the verdicts of the last few Host headers; a stranger sending
    # hundreds of names (loopback ones among them) neither grows that memory without bound
    # nor turns a refusal into a pass.
    port = server_process.port
    for n in range(3 * KNOWN_HOSTS):
        local = send(port, "GET", "/v1/queues", None, {"Host": f"127.0.{n // 256}.{n % 256}:{port}"})
        assert local[0] == 200
        foreign = send(port, "GET", "/v1/queues", None, {"Host": f"n{n}.attacker.example"})
        assert code(foreign) == (403, "host_not_allowed")
    assert code(send(port, "GET", "/v1/queues", None, {"Host": "n0.attacker.example"})) == (
        403,
        "host_not_allowed",
    )
    assert send(port, "GET", "/v1/queues", None, {"Host": f"localhost:{port}"})[0] == 200


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
def test_probes_answer_whatever_the_host(server_process: ServerProcess, path: str) -> None:
    assert send(server_process.port, "GET", path, None, {"Host": "probe.internal"})[0] == 200


@pytest.fixture
def listed_host(tmp_path: Path) -> Iterator[ServerProcess]:
    config = tmp_path / "capella.toml"
    config.write_text('[server]\nallowed_hosts = ["capella.internal", "[fd00::7]"]\n')
    yield from running(ServerProcess(tmp_path / "data", config=config))


def test_a_host_in_allowed_hosts_is_served(listed_host: ServerProcess) -> None:
    port = listed_host.port
    for host in ("capella.internal", f"Capella.Internal:{port}", f"[fd00::7]:{port}"):
        assert send(port, "PUT", "/v1/queues/allowed", {}, {"Host": host})[0] in (200, 201), host
    assert code(send(port, "GET", "/v1/queues", None, {"Host": "other.internal"})) == (
        403,
        "host_not_allowed",
    )


@pytest.mark.parametrize(
    ("hosts", "words"),
    [
        ('"capella.internal"', "a list of host names"),
        ('["https://capella.internal"]', "no scheme, no port"),
        ('["capella.internal:8676"]', "no scheme, no port"),
        ('["a/b"]', "no scheme, no port"),
    ],
)
def test_bad_allowed_hosts_stop_the_start(hosts: str, words: str) -> None:
    with pytest.raises(InvalidConfig) as caught:
        parse_config(tomllib.loads(f"[server]\nallowed_hosts = {hosts}\n"), {}, Path("."), "capella.toml")
    assert "server.allowed_hosts" in caught.value.message and words in caught.value.message
