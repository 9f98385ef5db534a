"""Authentication in a real ``capella serve`` process: refusing to listen beyond loopback
without it, the first admin from the configuration, and users that survive a restart."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from support.servers import ServerProcess, free_port

from capella.config import is_loopback, parse_config
from capella.errors import InvalidConfig

AUTH_CONFIG = """
[auth]
enabled = true
bootstrap_user = "admin"
bootstrap_password_env = "TEST_CAPELLA_ADMIN_PASSWORD"
"""


def get(url: str, user: str | None = None, password: str | None = None) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(url)
    if user is not None:
        request.add_header(
            "Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        )
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.parametrize("host", ["127.0.0.1", "127.3.4.5", "::1", "localhost"])
def test_loopback_addresses_need_no_auth(tmp_path: Path, host: str) -> None:
    assert is_loopback(host)
    listen = f"[{host}]:8676" if ":" in host else f"{host}:8676"
    assert parse_config({"server": {"listen": listen}}, {}, base=tmp_path).auth.enabled is False


@pytest.mark.parametrize("listen", ["0.0.0.0:8676", "[::]:8676", "10.1.2.3:8676", "broker.example:8676"])
def test_listening_beyond_loopback_without_auth_is_refused(tmp_path: Path, listen: str) -> None:
    with pytest.raises(InvalidConfig, match=r"refusing to listen on .* without authentication"):
        parse_config({"server": {"listen": listen}}, {}, base=tmp_path)
    config = parse_config({"server": {"listen": listen}, "auth": {"enabled": True}}, {}, base=tmp_path)
    assert config.auth.enabled


@pytest.mark.parametrize(
    "auth",
    [
        {"enabled": "yes"},
        {"colour": "blue"},
        {"bootstrap_user": "admin"},
        {"bootstrap_user": "", "bootstrap_password_env": "X"},
        {"token_ttl": "2d", "token_max_ttl": "1d"},
        {"cache_ttl": "soon"},
    ],
)
def test_a_bad_auth_section_is_refused(tmp_path: Path, auth: dict[str, object]) -> None:
    with pytest.raises(InvalidConfig):
        parse_config({"auth": auth}, {}, base=tmp_path)


def serve(*args: str) -> subprocess.CompletedProcess[str]:
    """``capella serve`` with ``args``, run to its end (a refusal ends it at once)."""
    return subprocess.run(
        [sys.executable, "-m", "capella", "serve", *args], capture_output=True, text=True, timeout=30
    )


def test_the_server_process_refuses_to_start_beyond_loopback_without_auth(tmp_path: Path) -> None:
    done = serve("--data-dir", str(tmp_path), "--listen", f"0.0.0.0:{free_port()}")

    assert done.returncode == 2
    assert "without authentication" in done.stderr and "[auth] enabled = true" in done.stderr
    assert "capella user add" in done.stderr


def test_auth_on_without_any_user_says_how_to_make_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TEST_CAPELLA_ADMIN_PASSWORD", raising=False)
    config = tmp_path / "capella.toml"
    config.write_text(AUTH_CONFIG)
    done = serve(
        "--config", str(config), "--data-dir", str(tmp_path / "data"), "--listen", f"127.0.0.1:{free_port()}"
    )

    assert done.returncode == 2
    assert "no user yet" in done.stderr and "TEST_CAPELLA_ADMIN_PASSWORD" in done.stderr


def test_the_first_admin_comes_from_the_environment_and_users_survive_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_CAPELLA_ADMIN_PASSWORD", "first-admin-password")
    config = tmp_path / "capella.toml"
    config.write_text(AUTH_CONFIG)
    server = ServerProcess(tmp_path / "data", config=config)
    try:
        server.wait_ready()
        assert get(f"{server.url}/v1/queues")[0] == 401
        status, me = get(f"{server.url}/v1/me", "admin", "first-admin-password")
        assert status == 200 and me["admin"] is True
        assert "first-admin-password" not in server.log()
    finally:
        assert server.stop() == 0

    # The bootstrap only applies to an empty user list: a changed variable changes nothing.
    monkeypatch.setenv("TEST_CAPELLA_ADMIN_PASSWORD", "another-password")
    again = ServerProcess(tmp_path / "data", port=server.port, config=config)
    try:
        again.wait_ready()
        assert get(f"{again.url}/v1/me", "admin", "first-admin-password")[0] == 200
        assert get(f"{again.url}/v1/me", "admin", "another-password")[0] == 401
    finally:
        assert again.stop() == 0
