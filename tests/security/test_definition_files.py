"""Files named in definitions: a narrow user can neither hang the broker nor probe its paths.

Issue 33: a PostgreSQL handler's ``sslrootcert=/dev/stdin`` (a pipe, as Docker gives a service)
or a FIFO was read on the event loop and blocked it forever, again at every start; and
``sslrootcert`` and an external cluster's ``ca_file`` told a narrow user whether any path
exists on the server. Now a user who is not an admin names only regular files under
``[files] allow``, every file is read off the loop without blocking, and every failure gets
one answer.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from support.servers import ServerProcess, free_port
from support.wait import until_blocking

from security.conftest import ADMIN_PASSWORD, DEV_PASSWORD, DEV_RULES, Secured, write_config

LOOPBACK = '[egress]\nallow = ["127.0.0.0/8", "::1/128"]\n\n'
RULES = [*DEV_RULES, "allow:external_cluster:admin:dev-*"]


def ca_pem() -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Capella Test CA")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM)


class Broker:
    """A secured ``capella serve`` that can be stopped and started again on its data directory."""

    def __init__(self, directory: Path, ca_dir: Path) -> None:
        self.directory = directory
        directory.mkdir()
        self.config = write_config(directory, LOOPBACK + f'[files]\nallow = ["{ca_dir}"]\n\n')
        self.process: ServerProcess | None = None
        self.port = free_port()

    def start(self) -> Secured:
        # stdin is a pipe nobody writes to: reading /dev/stdin would wait forever.
        self.process = ServerProcess(
            self.directory / "data",
            port=self.port,
            config=self.config,
            env={"CAPELLA_ADMIN_PASSWORD": ADMIN_PASSWORD},
            stdin=subprocess.PIPE,
        )
        self.process.wait_ready()
        return Secured(self.process, self.process.url)

    def stop(self) -> int:
        assert self.process is not None
        return self.process.stop()


@pytest.fixture
def ca_dir(tmp_path: Path) -> Path:
    found = tmp_path / "ca"
    found.mkdir()
    (found / "ca.pem").write_bytes(ca_pem())
    return found


@pytest.fixture
def broker(tmp_path: Path, ca_dir: Path) -> Iterator[tuple[Broker, Secured]]:
    made = Broker(tmp_path / "broker", ca_dir)
    secured = made.start()
    answer = secured.call("PUT", "/v1/users/dev", {"password": DEV_PASSWORD, "rules": RULES}, user="admin")
    assert answer.status == 201, answer.body
    assert secured.call("PUT", "/v1/queues/dev-q", {}).status == 201
    try:
        yield made, secured
    finally:
        made.stop()


@pytest.fixture
def secured(broker: tuple[Broker, Secured]) -> Secured:
    """The broker's client, for a test that does not restart it."""
    return broker[1]


def healthy(secured: Secured) -> bool:
    """Whether /healthz answers within a second: the event loop is not held."""
    with urllib.request.urlopen(f"{secured.url}/healthz", timeout=1.0) as resp:
        return bool(resp.status == 200)


def outbox(path: str, **extra: object) -> dict[str, object]:
    # Nothing listens on port 1: the TLS context is built before the connect would fail.
    dsn = f"postgresql://app@127.0.0.1:1/db?sslmode=verify-full&sslrootcert={path}"
    return {"type": "pg_outbox", "params": {"to": "dev-q", "dsn": dsn}, **extra}


@pytest.mark.parametrize(
    ("user", "name"),
    [("dev", "fifo"), ("dev", "/dev/stdin"), ("admin", "fifo"), ("admin", "/dev/stdin")],
)
def test_a_fifo_or_stdin_as_sslrootcert_is_refused_and_holds_nothing(
    secured: Secured, ca_dir: Path, user: str, name: str
) -> None:
    path = name
    if name == "fifo":
        path = str(ca_dir / "pipe.pem")
        os.mkfifo(path)
    answer = secured.call("PUT", "/v1/handlers/dev-out", outbox(path), user=user, timeout=5.0)
    assert healthy(secured)
    assert answer.status == 400, answer.body
    assert answer.body["error"]["code"] == "file_unavailable"
    assert answer.body["error"]["field"] == "params.dsn"
    if user == "admin":  # an admin is told why
        assert "not a regular file" in answer.body["error"]["message"] or "No such file" in json.dumps(
            answer.body
        )
    assert secured.call("GET", "/v1/handlers/dev-out", user="admin").status == 404


def test_a_file_that_becomes_a_fifo_fails_the_pass_the_restart_holds_nothing_and_it_can_be_dropped(
    broker: tuple[Broker, Secured], ca_dir: Path
) -> None:
    made, secured = broker
    path = ca_dir / "swapped.pem"
    path.write_bytes(ca_pem())
    defined = secured.call("PUT", "/v1/handlers/dev-out", outbox(str(path)))
    assert defined.status == 201, defined.body
    # The file becomes a FIFO that nobody writes to: the next connection reads it again.
    path.unlink()
    os.mkfifo(path)
    ran = secured.call("POST", "/v1/handlers/dev-out/run", timeout=10.0)
    assert healthy(secured)
    assert ran.status == 200, ran.body
    assert "cannot be used" in ran.body["pass"]["error"], ran.body

    # SIGTERM stops it (a held loop ignored it), and a start with the handler started holds nothing.
    assert made.stop() == 0
    secured = made.start()
    assert healthy(secured)

    def failed() -> bool:
        error = secured.call("GET", "/v1/handlers/dev-out", user="admin").body["status"]["last_error"]
        return bool(error) and error["code"] == "file_unavailable"

    until_blocking(failed, 15.0, "the restarted handler's pass to fail on the FIFO")
    assert healthy(secured)
    dropped = secured.call("DELETE", "/v1/handlers/dev-out", user="admin", timeout=5.0)
    assert dropped.status in (200, 204), dropped.body
    assert made.stop() == 0


def test_a_path_outside_the_listed_directories_gets_one_answer_whether_it_exists_or_not(
    secured: Secured, tmp_path: Path
) -> None:
    outside = tmp_path / "outside.pem"
    outside.write_bytes(ca_pem())
    directory = tmp_path / "a-directory"
    directory.mkdir()
    paths = [str(outside), str(tmp_path / "missing.pem"), str(directory), "/etc/passwd", "/dev/stdin"]
    for what, define in (
        ("sslrootcert", lambda p: secured.call("PUT", "/v1/handlers/dev-out", outbox(p), timeout=5.0)),
        (
            "ca_file",
            lambda p: secured.call(
                "PUT", "/v1/clusters/dev-far", {"url": "https://127.0.0.1:1", "ca_file": p}, timeout=5.0
            ),
        ),
    ):
        bodies = set()
        for path in paths:
            answer = define(path)
            assert answer.status == 400, (what, path, answer.body)
            assert answer.body["error"]["code"] == "file_unavailable", answer.body
            bodies.add(json.dumps(answer.body, sort_keys=True).replace(path, "PATH"))
        assert len(bodies) == 1, (what, bodies)
    assert secured.call("GET", "/v1/clusters/dev-far", user="admin").status == 404


def test_a_file_under_a_listed_directory_is_taken_and_an_oversized_one_is_refused(
    secured: Secured, ca_dir: Path
) -> None:
    good = str(ca_dir / "ca.pem")
    assert secured.call("PUT", "/v1/handlers/dev-out", outbox(good, started=False)).status == 201
    cluster = secured.call("PUT", "/v1/clusters/dev-far", {"url": "https://127.0.0.1:1", "ca_file": good})
    assert cluster.status == 201, cluster.body

    big = ca_dir / "big.pem"
    big.write_bytes(ca_pem() + b"#" * (1024 * 1024))
    refused = secured.call("PUT", "/v1/handlers/dev-big", outbox(str(big), started=False))
    assert refused.status == 400 and refused.body["error"]["code"] == "file_unavailable", refused.body
    refused = secured.call("PUT", "/v1/clusters/dev-big", {"url": "https://127.0.0.1:1", "ca_file": str(big)})
    assert refused.status == 400 and refused.body["error"]["code"] == "file_unavailable", refused.body
    # An admin is told why.
    told = secured.call(
        "PUT", "/v1/clusters/dev-big", {"url": "https://127.0.0.1:1", "ca_file": str(big)}, user="admin"
    )
    assert told.status == 400 and "larger than 1024 KiB" in told.body["error"]["message"], told.body


def test_an_admin_may_name_a_regular_file_anywhere(secured: Secured, tmp_path: Path) -> None:
    outside = tmp_path / "outside.pem"
    outside.write_bytes(ca_pem())
    answer = secured.call(
        "PUT", "/v1/clusters/dev-far", {"url": "https://127.0.0.1:1", "ca_file": str(outside)}, user="admin"
    )
    assert answer.status == 201, answer.body
    # A handler the admin defines to run as dev reads files as dev.
    as_dev = outbox(str(outside), started=False) | {"user": "dev"}
    refused = secured.call("PUT", "/v1/handlers/dev-out", as_dev, user="admin")
    assert refused.status == 400 and refused.body["error"]["code"] == "file_unavailable", refused.body
