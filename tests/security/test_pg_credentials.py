"""No ambient PostgreSQL credentials, and stored ciphertexts that cannot be moved.

A fake PostgreSQL server on loopback asks every client for a cleartext password and records
what it is sent. The broker runs with ``PGPASSWORD``, ``PGPASSFILE`` and ``PGSERVICEFILE``
set to known values; a limited user's ``pg_inbox`` whose DSN has no password must never
send any of them there.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.wait import until_blocking

from security.conftest import Secured, StartSecured
from security.fake_pg import FakePostgres, serving

LOOPBACK = '[egress]\nallow = ["127.0.0.0/8", "::1/128"]\n\n'
AMBIENT = "ambient-pg-password"
PASSFILE_PASSWORD = "passfile-pg-password"
SERVICE_PASSWORD = "servicefile-pg-password"


@pytest.fixture
def fake_pg() -> Iterator[FakePostgres]:
    yield from serving()


def ambient_env(tmp_path: Path, port: int) -> dict[str, str]:
    """PG* variables, a pass file and a service file that all name the fake server."""
    passfile = tmp_path / "pgpass"
    passfile.write_text(f"*:*:*:*:{PASSFILE_PASSWORD}\n")
    passfile.chmod(0o600)
    service = tmp_path / "pg_service.conf"
    service.write_text(f"[svc]\nhost=127.0.0.1\nport={port}\nuser=dev\npassword={SERVICE_PASSWORD}\n")
    return {
        "PGPASSWORD": AMBIENT,
        "PGPASSFILE": str(passfile),
        "PGSERVICEFILE": str(service),
        "PGSERVICE": "svc",
        "PGUSER": "broker",
        "HOME": str(tmp_path),
    }


def run_until_failed(secured: Secured, handler: str, within: float = 15.0) -> dict[str, object]:
    status: dict[str, object] = {}

    def failed() -> bool:
        nonlocal status
        status = dict(secured.call("POST", f"/v1/handlers/{handler}/run", user="admin").body["status"])
        return bool(status.get("last_error"))

    until_blocking(failed, within, f"a failed run of {handler}")
    return status


def test_a_dsn_without_password_never_gets_the_brokers_ambient_credentials(
    start_secured: StartSecured, fake_pg: FakePostgres, tmp_path: Path
) -> None:
    secured = start_secured(LOOPBACK, env=ambient_env(tmp_path, fake_pg.port))
    assert secured.call("PUT", "/v1/queues/dev-q", {}).status == 201
    dsn = f"postgresql://dev@127.0.0.1:{fake_pg.port}/db"
    defined = secured.call(
        "PUT", "/v1/handlers/dev-in", {"type": "pg_inbox", "queue": "dev-q", "params": {"dsn": dsn}}
    )
    assert defined.status == 201, defined.body
    status = run_until_failed(secured, "dev-in")
    assert fake_pg.connections >= 1, status
    assert all(p == "" for p in fake_pg.passwords), fake_pg.passwords
    shown = json.dumps(status)
    for value in (AMBIENT, PASSFILE_PASSWORD, SERVICE_PASSWORD):
        assert value not in shown


@pytest.mark.parametrize(
    ("dsn", "named"),
    [
        ("postgresql://dev@127.0.0.1:1/db?passfile=/tmp/x", "passfile"),
        ("postgresql://dev@127.0.0.1:1/db?service=svc", "service"),
        ("postgresql://dev@127.0.0.1:1/db?host=/var/run/postgresql", "host"),
        ("postgresql://dev@127.0.0.1:1/db?options=-csearch_path%3Dx", "options"),
        ("postgresql://dev@127.0.0.1:1/db?sslpassword=p", "sslpassword_secret"),
        ("postgresql://dev@127.0.0.1:1/db?sslcert=/etc/capella/client.crt", "admin"),
        ("postgresql://127.0.0.1:1/db", "user"),
    ],
)
def test_dsn_parameters_are_an_allow_list(start_secured: StartSecured, dsn: str, named: str) -> None:
    secured = start_secured(LOOPBACK)
    assert secured.call("PUT", "/v1/queues/dev-q", {}).status == 201
    answer = secured.call(
        "PUT", "/v1/handlers/dev-in", {"type": "pg_inbox", "queue": "dev-q", "params": {"dsn": dsn}}
    )
    assert answer.status == 400, answer.body
    assert named in answer.body["error"]["message"]


def test_dsn_env_and_ciphertexts_are_refused_from_the_api(start_secured: StartSecured) -> None:
    secured = start_secured(LOOPBACK)
    assert secured.call("PUT", "/v1/queues/dev-q", {}).status == 201
    old = secured.call(
        "PUT",
        "/v1/handlers/dev-in",
        {"type": "pg_inbox", "queue": "dev-q", "params": {"dsn_env": "PGPASSWORD"}},
    )
    assert old.status == 400 and "dsn_secret" in old.body["error"]["message"]
    params = {"dsn": "postgresql://dev@127.0.0.1:1/db", "dsn_password_encrypted": "v2:AAAA"}
    replayed = secured.call(
        "PUT", "/v1/handlers/dev-in", {"type": "pg_inbox", "queue": "dev-q", "params": params}
    )
    assert replayed.status == 400 and replayed.body["error"]["field"] == "params.dsn_password_encrypted"
