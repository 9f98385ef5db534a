"""External clusters over HTTP: register, describe, list, drop, ping, and every error.

An external cluster here is a second real Capella app on loopback (``aiohttp_server``); it
records each request's ``Authorization`` and ``Content-Encoding`` headers, so the tests see
what the cluster's client actually sent. No answer and no log line may hold a secret.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from support.configs import api_config
from support.http import only_error_of
from support.servers import free_port
from support.supervisor import launched

from capella.api import SUPERVISOR, create_app
from capella.auth.secret import Secrets
from capella.client import AsyncClient
from capella.config import SecretSettings, ServerSettings, parse_config
from capella.core.cluster import Cluster
from capella.handlers.supervisor import Supervisor
from capella.links.registry import Links
from capella.storage.keys import CLUSTERS as REGISTRY_KEY

C = "/v1/clusters"
PASSWORD = "pa55-w0rd-never-shown"
TOKEN = "t0ken-never-shown"

ClientFactory = Callable[[web.Application], Awaitable[TestClient[web.Request, web.Application]]]
ServerFactory = Callable[[web.Application], Awaitable[TestServer]]


async def put(api: TestClient, name: str, body: Any, status: int) -> dict[str, Any]:
    resp = await api.put(f"{C}/{name}", json=body)
    assert resp.status == status, await resp.text()
    return dict(await resp.json())


async def ping(api: TestClient, name: str) -> dict[str, Any]:
    resp = await api.post(f"{C}/{name}/ping")
    assert resp.status == 200, await resp.text()
    return dict(await resp.json())


@dataclass
class Remote:
    """A second Capella server on loopback, and the headers of each request it received."""

    url: str
    authorization: list[str | None] = field(default_factory=list)
    encodings: list[str | None] = field(default_factory=list)


@pytest.fixture
async def remote(aiohttp_server: ServerFactory, tmp_path: Path) -> AsyncIterator[Remote]:
    # Another name: an external cluster named like this one ("test") is refused.
    far = await Cluster.open(api_config(tmp_path / "remote", name="remote"))
    supervisor = await launched(far)
    app = create_app(far, ServerSettings(), supervisor)
    seen = Remote("")

    async def record(request: web.Request, response: web.StreamResponse) -> None:
        seen.authorization.append(request.headers.get("Authorization"))
        seen.encodings.append(request.headers.get("Content-Encoding"))

    app.on_response_prepare.append(record)
    server = await aiohttp_server(app)
    seen.url = str(server.make_url("")).rstrip("/")
    yield seen
    await supervisor.close()
    await far.close()


# Declared as an operator would in [secrets.NAME]; clusters name them.
DECLARED = {
    "dc2-password": SecretSettings(env="CAPELLA_TEST_DC2_PASSWORD"),
    "dc2-token": SecretSettings(env="CAPELLA_TEST_DC2_TOKEN"),
}


@pytest.fixture
async def supervisor(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Supervisor]:
    """The supervisor with two declared secrets that hold values."""
    monkeypatch.setenv("CAPELLA_TEST_DC2_PASSWORD", PASSWORD)
    monkeypatch.setenv("CAPELLA_TEST_DC2_TOKEN", TOKEN)
    secrets = Secrets(DECLARED)
    started = await launched(cluster, links=Links(cluster, secrets=secrets), secrets=secrets)
    yield started
    await started.close()


@pytest.fixture
async def keyed(
    aiohttp_client: ClientFactory, cluster: Cluster, api_settings: ServerSettings, tmp_path: Path
) -> AsyncIterator[TestClient[web.Request, web.Application]]:
    """The api with a key file, so clusters may store a literal password or token."""
    supervisor = await launched(cluster, links=Links(cluster, key_file=tmp_path / "keys" / "links.key"))
    yield await aiohttp_client(create_app(cluster, api_settings, supervisor))
    await supervisor.close()


# --- register, describe, list, drop ------------------------------------------------------


async def test_put_creates_then_replaces_and_get_shows_it(api: TestClient) -> None:
    body = {
        "url": "https://dc2.example.com:8676/",
        "username": "copier",
        "password_secret": "dc2-password",
        "connect_timeout": "2s",
        "timeout": 45,
        "compression": "gzip",
    }
    info = await put(api, "dc2", body, 201)

    # dc2.example.com cannot be reached: the cluster is kept, its name unchecked.
    assert info.pop("name_check")["checked"] is False
    assert info == {
        "name": "dc2",
        "url": "https://dc2.example.com:8676",
        "credentials": {"kind": "password", "username": "copier", "source": "secret:dc2-password"},
        "tls": {"verify": True, "ca_file": None},
        "timeouts": {"connect": 2.0, "request": 45.0},
        "compression": "gzip",
        "error": None,
    }
    assert await (await api.get(f"{C}/dc2")).json() == info

    replaced = await put(api, "dc2", {"url": "http://10.0.0.2:8676", "token_secret": "dc2-token"}, 200)
    assert replaced["url"] == "http://10.0.0.2:8676"
    assert replaced["credentials"] == {"kind": "token", "username": None, "source": "secret:dc2-token"}
    assert replaced["timeouts"] == {"connect": 5.0, "request": 30.0}
    assert replaced["compression"] == "none"


async def test_a_cluster_without_credentials_shows_none(api: TestClient) -> None:
    info = await put(api, "open", {"url": "http://127.0.0.1:1", "verify_tls": False}, 201)

    assert info["credentials"] is None
    assert info["tls"] == {"verify": False, "ca_file": None}


async def test_list_is_sorted_by_name_and_drop_forgets(api: TestClient) -> None:
    for name in ("dc3", "dc1", "dc2"):
        await put(api, name, {"url": f"http://{name}.example.com"}, 201)

    listed = await (await api.get(C)).json()
    assert [c["name"] for c in listed["clusters"]] == ["dc1", "dc2", "dc3"]

    assert (await api.delete(f"{C}/dc2")).status == 204
    assert (await only_error_of(await api.get(f"{C}/dc2"), 404))["code"] == "cluster_not_found"
    assert [c["name"] for c in (await (await api.get(C)).json())["clusters"]] == ["dc1", "dc3"]


async def test_an_empty_registry_lists_nothing(api: TestClient) -> None:
    assert await (await api.get(C)).json() == {"clusters": []}


async def test_a_ca_file_that_exists_is_kept(api: TestClient, tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not checked until the cluster is used\n")

    info = await put(api, "tls", {"url": "https://dc2.example.com", "ca_file": str(ca)}, 201)

    assert info["tls"] == {"verify": True, "ca_file": str(ca)}


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({}, "url", "url"),
        ({"url": "dc2.example.com:8676"}, "url", "http"),
        ({"url": "ftp://dc2.example.com"}, "url", "http"),
        ({"url": 8676}, "url", "http"),
        ({"url": "http://copier:secret@dc2.example.com"}, "url", "credentials"),
        ({"url": "http://a", "token": "x", "password_secret": "P", "username": "u"}, "token", "only one"),
        ({"url": "http://a", "token_secret": "T", "password_secret": "P"}, "token_secret", "only one"),
        ({"url": "http://a", "password_secret": "P"}, "username", "username"),
        ({"url": "http://a", "username": "", "token_secret": "T"}, "username", "username"),
        ({"url": "http://a", "token_secret": "NOT A NAME"}, "token_secret", "declared"),
        ({"url": "http://a", "token_env": "T"}, "token_env", 'token_secret = "NAME"'),
        ({"url": "http://a", "username": "u", "password_env": "P"}, "password_env", "password_secret"),
        ({"url": "http://a", "token": ""}, "token", "non-empty"),
        ({"url": "http://a", "region": "eu"}, "region", "unknown field"),
        ({"url": "http://a", "compression": "brotli"}, "compression", "gzip"),
        ({"url": "http://a", "verify_tls": "no"}, "verify_tls", "true or false"),
        ({"url": "http://a", "ca_file": 7}, "ca_file", "a file path"),
        ({"url": "http://a", "timeout": "soon"}, "timeout", "timeout"),
        # Found by test_fuzz.py: an inf timeout was shown as null and made every ping a 500.
        ({"url": "http://a", "timeout": "9" * 400}, "timeout", "finite"),
        ({"url": "http://a", "connect_timeout": 0}, "connect_timeout", "greater than 0"),
    ],
)
async def test_a_bad_definition_is_400_naming_the_field(
    api: TestClient, body: dict[str, Any], field: str, words: str
) -> None:
    error = await only_error_of(await api.put(f"{C}/dc2", json=body), 400)

    assert error["code"] == "invalid_request"
    assert error["field"] == field
    assert words in error["message"]
    assert (await api.get(f"{C}/dc2")).status == 404


@pytest.mark.parametrize(
    ("ca_file", "words"),
    [
        ("/no/such/ca.pem", "No such file"),
        # Found by test_fuzz.py: a name too long for the OS raised OSError, a 500.
        ("/" + "c" * 5000, "too long"),
        ("ca\u0000.pem", "expected a file path"),
        ("ca.pem", "absolute"),
        ("/dev/null", "not a regular file"),
    ],
)
async def test_a_ca_file_that_cannot_be_used_is_400_file_unavailable(
    api: TestClient, ca_file: str, words: str
) -> None:
    # The test app defines clusters as an admin: the answer says why.
    error = await only_error_of(await api.put(f"{C}/dc2", json={"url": "http://a", "ca_file": ca_file}), 400)

    assert error["code"] == "file_unavailable"
    assert error["field"] == "ca_file"
    assert "cannot be used" in error["message"] and words in error["message"], error
    assert (await api.get(f"{C}/dc2")).status == 404


async def test_a_bad_definition_keeps_the_old_one(api: TestClient) -> None:
    await put(api, "dc2", {"url": "http://dc2.example.com"}, 201)

    await only_error_of(await api.put(f"{C}/dc2", json={"url": "http://x", "compression": "lz4"}), 400)

    assert (await (await api.get(f"{C}/dc2")).json())["url"] == "http://dc2.example.com"


async def test_a_body_that_is_not_an_object_and_a_bad_name_are_400(api: TestClient) -> None:
    assert (await only_error_of(await api.put(f"{C}/dc2", json=["http://a"]), 400))[
        "code"
    ] == "invalid_request"
    assert (await only_error_of(await api.put(f"{C}/.hidden", json={"url": "http://a"}), 400))[
        "code"
    ] == "invalid_name"


async def test_a_literal_secret_without_a_key_file_is_refused(api: TestClient) -> None:
    body = {"url": "http://a", "username": "u", "password": PASSWORD}

    error = await only_error_of(await api.put(f"{C}/dc2", json=body), 400)

    assert "password_secret" in error["message"]
    assert PASSWORD not in error["message"]


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", f"{C}/nowhere"), ("DELETE", f"{C}/nowhere"), ("POST", f"{C}/nowhere/ping")],
)
async def test_an_unknown_cluster_is_404(api: TestClient, method: str, path: str) -> None:
    error = await only_error_of(await api.request(method, path), 404)

    assert error["code"] == "cluster_not_found"
    assert "nowhere" in error["message"]


# --- secrets -----------------------------------------------------------------------------


async def test_a_secret_is_in_no_answer_and_no_log_line(
    keyed: TestClient, remote: Remote, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG):
        created = await keyed.put(
            f"{C}/dc2", json={"url": remote.url, "username": "copier", "password": PASSWORD}
        )
        token = await keyed.put(f"{C}/dc3", json={"url": remote.url, "token": TOKEN})
        bodies = [
            await created.read(),
            await token.read(),
            await (await keyed.get(f"{C}/dc2")).read(),
            await (await keyed.get(C)).read(),
            await (await keyed.post(f"{C}/dc2/ping")).read(),
            await (await keyed.post(f"{C}/dc3/ping")).read(),
            await (await keyed.get("/v1/openapi.json")).read(),
        ]

    assert (created.status, token.status) == (201, 201)
    for body in bodies:
        assert PASSWORD.encode() not in body
        assert TOKEN.encode() not in body
    assert orjson.loads(bodies[2])["credentials"] == {
        "kind": "password",
        "username": "copier",
        "source": "stored encrypted",
    }
    assert "cluster link added link=dc2" in caplog.text
    assert PASSWORD not in caplog.text and TOKEN not in caplog.text


async def test_a_stored_secret_is_encrypted_on_disk_and_comes_back_with_the_key(
    aiohttp_client: ClientFactory, remote: Remote, tmp_path: Path
) -> None:
    config = parse_config({"cluster": {"name": "local", "data_dir": str(tmp_path / "data")}}, {}, tmp_path)
    key_file = tmp_path / "data" / "keys" / "links.key"
    registry = Path(config.mounts[config.default_mount].options["root"]) / REGISTRY_KEY
    cluster = await Cluster.open(config)
    supervisor = await launched(cluster, links=Links(cluster, key_file=key_file))
    api = await aiohttp_client(create_app(cluster, ServerSettings(), supervisor))
    await put(api, "dc2", {"url": remote.url, "username": "copier", "password": PASSWORD}, 201)
    await api.close()
    await supervisor.close()
    await cluster.close()

    on_disk = registry.read_bytes()
    assert PASSWORD.encode() not in on_disk
    stored = orjson.loads(on_disk)["clusters"]["dc2"]["credentials"]
    assert stored["kind"] == "password" and stored["encrypted"]
    assert key_file.stat().st_mode & 0o777 == 0o600

    # A new registry over the same data and key file decrypts it, and its client uses it.
    cluster = await Cluster.open(config)
    links = Links(cluster, key_file=key_file)
    await links.start()
    try:
        result = await links.ping("dc2")
    finally:
        await links.close()
        await cluster.close()
    assert result.ok is True
    basic = "Basic " + base64.b64encode(f"copier:{PASSWORD}".encode()).decode()
    assert remote.authorization[-1] == basic


async def test_a_secret_under_another_key_is_not_loaded_but_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = await Cluster.open(api_config(tmp_path))
    try:
        links = Links(cluster, key_file=tmp_path / "a.key")
        await links.start()
        await links.put("dc2", {"url": "http://a", "token": TOKEN})

        other = Links(cluster, key_file=tmp_path / "b.key")
        with caplog.at_level(logging.ERROR):
            await other.start()
        # Listed with its error, not hidden; it cannot be used.
        [shown] = other.links()
        assert shown.name == "dc2" and shown.error is not None and "cannot be decrypted" in shown.error
        assert "cluster link cannot be loaded link=dc2" in caplog.text
        # A later save keeps the entry it could not read, so the right key still finds it.
        await other.put("dc3", {"url": "http://b"})
        again = Links(cluster, key_file=tmp_path / "a.key")
        await again.start()
        assert [external.name for external in again.links()] == ["dc2", "dc3"]
        assert again.link("dc2").secret == TOKEN
    finally:
        await cluster.close()


async def test_a_token_from_a_declared_secret_is_sent_as_a_bearer(api: TestClient, remote: Remote) -> None:
    await put(api, "dc2", {"url": remote.url, "token_secret": "dc2-token"}, 201)

    assert (await ping(api, "dc2"))["ok"] is True

    assert remote.authorization[-1] == f"Bearer {TOKEN}"


# --- ping --------------------------------------------------------------------------------


async def test_ping_reaches_a_real_server(api: TestClient, remote: Remote) -> None:
    await put(api, "dc2", {"url": remote.url}, 201)

    result = await ping(api, "dc2")

    assert result["ok"] is True
    assert result["ready"] is True
    assert result["error"] is None
    assert result["latency_ms"] > 0
    assert len(remote.authorization) >= 2  # /readyz, then an authenticated call


async def test_ping_of_a_closed_port_is_ok_false_and_unreachable(api: TestClient) -> None:
    port = free_port()  # bound and released: nothing listens there now
    await put(api, "gone", {"url": f"http://127.0.0.1:{port}", "connect_timeout": "1s"}, 201)

    result = await ping(api, "gone")

    assert result["ok"] is False
    assert result["error"]["code"] == "unreachable"
    assert f"127.0.0.1:{port}" in result["error"]["message"]


async def test_ping_with_a_secret_whose_variable_went_away_says_which(
    api: TestClient, remote: Remote, monkeypatch: pytest.MonkeyPatch
) -> None:
    await put(api, "dc2", {"url": remote.url, "username": "u", "password_secret": "dc2-password"}, 201)
    remote.authorization.clear()  # adding the cluster asked the far side its name
    monkeypatch.delenv("CAPELLA_TEST_DC2_PASSWORD")

    result = await ping(api, "dc2")

    assert result["ok"] is False
    assert result["error"]["code"] == "secret_unavailable"
    assert "'dc2-password' cannot be used" in result["error"]["message"]
    assert remote.authorization == []  # nothing was sent without the secret

    # Set later, it is read on the next ping: no restart needed.
    monkeypatch.setenv("CAPELLA_TEST_DC2_PASSWORD", PASSWORD)
    assert (await ping(api, "dc2"))["ok"] is True


async def test_ping_with_a_ca_file_that_is_no_certificate_is_ok_false(
    api: TestClient, tmp_path: Path
) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not a certificate\n")
    await put(api, "tls", {"url": "https://127.0.0.1:1", "ca_file": str(ca)}, 201)

    result = await ping(api, "tls")

    assert result["ok"] is False
    assert result["error"]["code"] == "invalid_config"
    assert "ca_file" in result["error"]["message"]


async def test_a_replaced_cluster_pings_its_new_url(api: TestClient, remote: Remote) -> None:
    await put(api, "dc2", {"url": f"http://127.0.0.1:{free_port()}", "connect_timeout": "1s"}, 201)
    assert (await ping(api, "dc2"))["ok"] is False

    await put(api, "dc2", {"url": remote.url}, 200)

    assert (await ping(api, "dc2"))["ok"] is True


# --- compression -------------------------------------------------------------------------


@pytest.mark.parametrize("compression", ["gzip", "zstd"])
async def test_a_compressed_batch_arrives_intact(api: TestClient, remote: Remote, compression: str) -> None:
    await put(api, "dc2", {"url": remote.url, "compression": compression}, 201)
    far = await api.app[SUPERVISOR].links.client("dc2")
    texts = [f"order {i:05d} " + "x" * (i % 200) for i in range(2000)]

    await far.put_queue("orders")
    results = await far.produce("orders", texts)

    assert [r.duplicate for r in results] == [False] * len(texts)
    assert compression in remote.encodings
    async with AsyncClient(remote.url) as plain:
        read = await plain.read("orders", limit=len(texts))
    assert [m.data for m in read.messages] == texts


async def test_a_small_body_is_sent_uncompressed(api: TestClient, remote: Remote) -> None:
    await put(api, "dc2", {"url": remote.url, "compression": "zstd"}, 201)
    far = await api.app[SUPERVISOR].links.client("dc2")

    await far.put_queue("orders")
    await far.produce("orders", ["small"])

    assert "zstd" not in remote.encodings
