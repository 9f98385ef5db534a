"""Secrets kept at rest: sealed with the data directory's key, bound to what they are for.

A link's stored password or token and a pg handler's DSN password are kept only sealed, with
a key in the data directory (``<data_dir>/keys/links.key``, a file name kept from before,
mode 0600; needs the ``cryptography`` package, imported only then). Each ciphertext is bound
to its context (whose secret it is, and for where), so one copied into another definition
does not decrypt there. Secrets the operator declares (``[secrets.NAME]``) are in
``capella/auth/secret.py``: they are read where they live, never stored.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

from capella.errors import CapellaError, CorruptData, InvalidRequest
from capella.fsync import write_atomic

# The prefix of a ciphertext bound to its context (AES-GCM); older ones are Fernet tokens.
SEALED = "v2:"


class Sealer:
    """Seals and opens stored secrets with the key in ``key_file`` (None: it has none)."""

    def __init__(self, key_file: Path | None = None) -> None:
        self._key_file = key_file

    def _key(self) -> bytes:
        """The key file's 32 bytes (a Fernet key, created on first use)."""
        if self._key_file is None:
            raise InvalidRequest("this cluster has no key file: give password_secret or token_secret instead")
        try:
            from cryptography.fernet import Fernet
        except ImportError:  # optional: only clusters with stored secrets need it
            raise InvalidRequest(
                "storing a secret needs the cryptography package (pip install 'capella[secrets]'); "
                "or give password_secret / token_secret"
            ) from None
        if not self._key_file.exists():
            # Never replaced once there (every stored secret depends on it): when two writers
            # race, the first key kept is the one both read back.
            write_atomic(self._key_file, Fernet.generate_key(), replace=False)
        return self._key_file.read_bytes().strip()

    def encrypt(self, secret: str, context: tuple[str, ...]) -> str:
        """``secret`` sealed with the key and bound to ``context``.

        AES-256-GCM with ``context`` (what the secret is, whose, and for where: e.g. a pg
        handler's name and DSN) as associated data: a ciphertext copied into another
        definition does not decrypt there, so it cannot be sent to another host.
        """
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        nonce = os.urandom(12)
        sealed = AESGCM(_aead_key(self._key())).encrypt(nonce, secret.encode(), _associated(context))
        return SEALED + base64.urlsafe_b64encode(nonce + sealed).decode("ascii")

    def decrypt(self, token: str, context: tuple[str, ...]) -> str:
        """The secret ``encrypt`` sealed for ``context``; ``CorruptData`` for any other context.

        A token without the ``v2:`` prefix is an older Fernet one, bound to nothing: it is only
        read from this server's own registries (the API refuses ``*_encrypted`` params), and
        its caller seals it again bound (``bound``).
        """
        try:
            if token.startswith(SEALED):
                from cryptography.hazmat.primitives.ciphers.aead import AESGCM

                raw = base64.urlsafe_b64decode(token[len(SEALED) :].encode("ascii"))
                plain: bytes = AESGCM(_aead_key(self._key())).decrypt(
                    raw[:12], raw[12:], _associated(context)
                )
            else:
                from cryptography.fernet import Fernet

                plain = Fernet(self._key()).decrypt(token.encode("ascii"))
        except CapellaError:
            raise
        except Exception as exc:  # InvalidTag/InvalidToken: another context, or a changed key file
            raise CorruptData(
                f"a stored secret cannot be decrypted ({type(exc).__name__}): it was stored for another "
                "definition, or the key file changed; give the secret again"
            ) from None
        return plain.decode()


def bound(token: str) -> bool:
    """Whether a stored ciphertext is bound to its context (not an older Fernet token)."""
    return token.startswith(SEALED)


def _aead_key(key_file: bytes) -> bytes:
    """The AES-256-GCM key, derived from the key file (which stays a Fernet key for old tokens)."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"capella stored secret v2")
    return hkdf.derive(base64.urlsafe_b64decode(key_file))


def _associated(context: tuple[str, ...]) -> bytes:
    # Each part's length first, so ("a", "bc") and ("ab", "c") are different contexts.
    return b"".join(len(p.encode()).to_bytes(4, "big") + p.encode() for p in context)
