"""Attacks by a limited user on a real server: the fixtures they share.

``secured`` starts ``capella serve`` with ``[auth]`` on, a bootstrap admin whose password is in
the server's environment (``CAPELLA_ADMIN_PASSWORD``, the secret the attacks try to steal),
and a user ``dev`` whose only rules are the narrow ones of issue 20. ``receiver`` is an HTTP
server on loopback that records every request it is sent, to show what left the broker.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.receiver import Receiver, listening
from support.servers import ServerProcess, running

ADMIN_PASSWORD = "admin-password-that-must-not-leak"
DEV_PASSWORD = "dev-password"
DEV_RULES = ["allow:handler:*:dev-*", "allow:queue:*:dev-*", "allow:subscription:*:dev-*/*"]


@dataclass
class Answer:
    status: int
    body: Any
    headers: dict[str, str]


@dataclass
class Secured:
    """A running server with auth on; ``call`` sends a request as ``admin`` or ``dev``."""

    server: ServerProcess
    url: str

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        user: str | None = "dev",
        headers: dict[str, str] | None = None,
        data: bytes | None = None,
        timeout: float = 30.0,
    ) -> Answer:
        sent = dict(headers or {})
        if user is not None:
            password = ADMIN_PASSWORD if user == "admin" else DEV_PASSWORD
            sent["Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        if body is not None:
            data = json.dumps(body).encode()
            sent.setdefault("Content-Type", "application/json")
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=sent)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as resp:
                raw, status, got = resp.read(), resp.status, dict(resp.headers)
        except urllib.error.HTTPError as exc:
            raw, status, got = exc.read(), exc.code, dict(exc.headers)
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = raw
        return Answer(status, parsed, got)


def write_config(directory: Path, extra: str = "") -> Path:
    """A configuration with auth on and a bootstrap admin, plus ``extra`` TOML."""
    config = directory / "capella.toml"
    config.write_text(
        '[cluster]\nname = "secured"\n\n'
        '[auth]\nenabled = true\nbootstrap_user = "admin"\n'
        'bootstrap_password_env = "CAPELLA_ADMIN_PASSWORD"\n\n' + extra
    )
    return config


StartSecured = Callable[..., Secured]


@pytest.fixture
def start_secured(tmp_path: Path) -> Iterator[StartSecured]:
    """``start_secured(extra_toml, env={...})``: a secured server with the user ``dev``; stopped after."""
    stops: list[Iterator[ServerProcess]] = []

    def start(extra: str = "", env: dict[str, str] | None = None) -> Secured:
        directory = tmp_path / f"secured-{len(stops)}"
        directory.mkdir()
        config = write_config(directory, extra)
        process = ServerProcess(
            directory / "data", config=config, env={"CAPELLA_ADMIN_PASSWORD": ADMIN_PASSWORD, **(env or {})}
        )
        lifetime = running(process)
        stops.append(lifetime)
        secured = Secured(next(lifetime), process.url)
        made = secured.call(
            "PUT", "/v1/users/dev", {"password": DEV_PASSWORD, "rules": DEV_RULES}, user="admin"
        )
        assert made.status == 201, made.body
        return secured

    yield start
    for lifetime in stops:
        for _ in lifetime:  # runs the clean-up after the yield
            pass


@pytest.fixture
def secured(start_secured: StartSecured) -> Secured:
    """A secured server with the default configuration and no extra environment."""
    return start_secured()


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    """An HTTP server on 127.0.0.1 that answers ``status`` and records what it was sent."""
    found = Receiver()
    async with listening(found.handle) as port:
        found.url = f"http://127.0.0.1:{port}"
        yield found
