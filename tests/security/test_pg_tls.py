"""TLS to PostgreSQL checks the certificate for the DSN's host name, not the address connected to.

``Database`` resolves the DSN's host, checks each address against the egress policy and gives
asyncpg the address; its TLS context (``_Pinned``) names the DSN's host in the handshake
instead. A fake server on 127.0.0.1 whose certificate names only ``localhost`` (a DNS name, no
IP address) or only ``other.example`` shows which sslmodes send the password, over TLS, and
which refuse the server before sending anything. Each runs on asyncio's own loop and on uvloop,
which is what ``capella serve`` runs on.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import os
import ssl
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvloop
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from support.wait import until

from capella.auth.rule import UNRESTRICTED, Identity
from capella.egress import Egress
from capella.errors import CapellaError, DatabaseRefused, DatabaseUnavailable, FileUnavailable
from capella.file_access import FileAccess
from capella.handlers.postgres import Database, Dsn
from security.fake_pg import FakePostgres, serving

PASSWORD = "the-pg-password"
LOOPBACK = Egress.of(["127.0.0.0/8"], auth_enabled=True)

Run = Callable[[Coroutine[Any, Any, CapellaError]], CapellaError]
RUNS = pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])


@dataclass(frozen=True)
class Certs:
    ca: Path
    servers: dict[str, ssl.SSLContext]  # a server context per name its certificate is for


def _certificate(
    name: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Certificate | None, issuer_key: Any
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject if issuer is None else issuer.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
    )
    if issuer is None:
        builder = builder.add_extension(
            x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
        )
    else:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False
        ).add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), critical=False
        )
    return builder.sign(issuer_key, hashes.SHA256())


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    root = tmp_path_factory.mktemp("pg-pki")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _certificate("Capella Test PG CA", ca_key, None, ca_key)
    (root / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    servers = {}
    for name in ("localhost", "other.example"):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _certificate(name, key, ca, ca_key)
        (root / f"{name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (root / f"{name}.key").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(root / f"{name}.pem", root / f"{name}.key")
        servers[name] = context
    return Certs(ca=root / "ca.pem", servers=servers)


@pytest.fixture
def fake_pg(request: pytest.FixtureRequest, certs: Certs) -> Iterator[FakePostgres]:
    """A fake server with TLS, its certificate for the name given by indirect parametrization."""
    yield from serving(certs.servers[request.param])


async def login(
    port: int, query: str, files: FileAccess | None = None, identity: Identity = UNRESTRICTED
) -> CapellaError:
    """What connecting to ``localhost:port`` as ``app`` with ``PASSWORD`` fails with."""
    before = open_sockets()
    dsn = Dsn(f"postgresql://app@localhost:{port}/db?{query}", password=PASSWORD)
    database = Database(dsn, egress=LOOPBACK, files=files)
    try:
        await database.connect(identity)
    except CapellaError as exc:
        return exc
    finally:
        await database.close()
        await closed(before)
    raise AssertionError("the fake server never lets a login succeed")


async def closed(sockets: int, within: float = 10.0) -> None:
    """Wait until this process holds no more than ``sockets`` sockets.

    asyncpg closes a connection that failed to log in without waiting, and closing TLS takes a
    round trip: the test's loop must not close before (uvloop refuses, its handle still open).
    """
    await until(lambda: open_sockets() <= sockets, within, "a connection to the fake server to close")
    await asyncio.sleep(0)  # the transport's connection_lost, scheduled as its socket closed


def open_sockets() -> int:
    """How many sockets this process holds, the fake server's included (Linux)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(FileNotFoundError):  # closed since it was listed
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
    return count


@RUNS
@pytest.mark.parametrize(
    ("query", "fake_pg"),
    [
        ("sslmode=verify-full&sslrootcert={ca}", "localhost"),
        ("sslmode=verify-ca&sslrootcert={ca}", "other.example"),  # the CA is checked, the name not
        ("sslmode=require", "other.example"),  # nothing is checked
    ],
    indirect=["fake_pg"],
)
def test_the_password_goes_over_tls_to_a_server_the_sslmode_accepts(
    run: Run, query: str, certs: Certs, fake_pg: FakePostgres
) -> None:
    error = run(login(fake_pg.port, query.format(ca=certs.ca)))
    assert isinstance(error, DatabaseRefused) and "authentication failed" in error.message, error
    assert fake_pg.passwords == [PASSWORD]
    assert fake_pg.over_tls == [True]


@RUNS
@pytest.mark.parametrize("fake_pg", ["other.example"], indirect=True)
def test_verify_full_refuses_a_certificate_for_another_name_before_the_password(
    run: Run, certs: Certs, fake_pg: FakePostgres
) -> None:
    error = run(login(fake_pg.port, f"sslmode=verify-full&sslrootcert={certs.ca}"))
    assert isinstance(error, DatabaseUnavailable), error
    assert "certificate verify failed" in error.message and "'localhost'" in error.message, error
    assert fake_pg.connections == 1
    assert fake_pg.passwords == []


@RUNS
@pytest.mark.parametrize("fake_pg", ["localhost"], indirect=True)
def test_a_user_who_is_not_an_admin_verifies_with_a_ca_only_under_a_listed_directory(
    run: Run, certs: Certs, fake_pg: FakePostgres
) -> None:
    dev = Identity("dev")
    query = f"sslmode=verify-full&sslrootcert={certs.ca}"
    listed = run(login(fake_pg.port, query, FileAccess.of([certs.ca.parent]), dev))
    assert isinstance(listed, DatabaseRefused) and "authentication failed" in listed.message, listed
    assert fake_pg.passwords == [PASSWORD] and fake_pg.over_tls == [True]
    # The same file, its directory not listed: refused before connecting, in words that do not
    # say whether it exists.
    unlisted = run(login(fake_pg.port, query, FileAccess(), dev))
    assert isinstance(unlisted, FileUnavailable), unlisted
    assert "[files] allow" in unlisted.message and "No such" not in unlisted.message
    assert fake_pg.connections == 1
