"""Throwaway certificates for TLS tests, made with ``cryptography``: a CA, a server certificate
for loopback (and any other addresses a test binds), client certificates, and a rogue CA's.

``make_pki(root)`` writes them as PEM files under ``root``; a module-scoped fixture makes them
once (``pki`` in tests/client/test_transport.py, tests/kafka_protocol/test_security.py).
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pki:
    """A throwaway CA, a server certificate for 127.0.0.1/localhost, and client certificates."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path  # CN=alice, signed by the CA
    client_key: Path
    rogue_cert: Path  # CN=mallory, signed by another CA
    rogue_key: Path
    encrypted_key: Path  # the server key, with a passphrase

    def client_context(self, *, cert: str | None = None) -> ssl.SSLContext:
        """Trusts the CA; presents ``alice``'s or ``mallory``'s certificate when asked."""
        context = ssl.create_default_context(cafile=str(self.ca))
        if cert == "alice":
            context.load_cert_chain(self.client_cert, self.client_key)
        elif cert == "mallory":
            context.load_cert_chain(self.rogue_cert, self.rogue_key)
        return context


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _issue(
    cn: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None = None,
    *,
    ca: bool = False,
    server: Sequence[str] = (),
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    issuer_name, issuer_key = issuer or (_name(cn), key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        ).add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    else:
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False).add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), critical=False
        )
    if server:
        names: list[x509.GeneralName] = [x509.IPAddress(ipaddress.ip_address(a)) for a in server]
        builder = builder.add_extension(
            x509.SubjectAlternativeName([*names, x509.DNSName("localhost")]), critical=False
        )
    return builder.sign(issuer_key, hashes.SHA256())


def _write(path: Path, cert: x509.Certificate | None = None, key: Any = None, password: bytes = b"") -> Path:
    if cert is not None:
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    else:
        encryption = (
            serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
        )
        path.write_bytes(
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
        )
    return path


def make_pki(root: Path, addresses: Sequence[str] = ("127.0.0.1",)) -> Pki:
    """A CA and certificates under ``root``; the server's is for ``addresses`` and localhost."""
    ca_key, rogue_ca_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = _issue("Capella Test CA", ca_key, ca=True)
    rogue_ca = _issue("Someone Else's CA", rogue_ca_key, ca=True)
    server_key, client_key, rogue_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
    return Pki(
        ca=_write(root / "ca.pem", ca),
        server_cert=_write(
            root / "server.pem", _issue("localhost", server_key, (ca.subject, ca_key), server=addresses)
        ),
        server_key=_write(root / "server.key", key=server_key),
        client_cert=_write(root / "alice.pem", _issue("alice", client_key, (ca.subject, ca_key))),
        client_key=_write(root / "alice.key", key=client_key),
        rogue_cert=_write(
            root / "mallory.pem", _issue("mallory", rogue_key, (rogue_ca.subject, rogue_ca_key))
        ),
        rogue_key=_write(root / "mallory.key", key=rogue_key),
        encrypted_key=_write(root / "server-encrypted.key", key=server_key, password=b"secret"),
    )
