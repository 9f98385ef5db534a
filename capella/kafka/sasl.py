"""SASL/PLAIN sign-in (SaslHandshake, then SaslAuthenticate or, after a v0 handshake, the bare
token) through the HTTP API's users.

PLAIN carries ``authzid NUL authcid NUL password`` (RFC 4616). The password is checked by the
same ``Authenticator`` as HTTP Basic, with its failed-login budgets and hashing bounds; an
authorization id naming someone else is refused (nobody signs in *as* another user). A
refusal is answered with SASL_AUTHENTICATION_FAILED and the connection is closed, as Kafka does.
"""

from __future__ import annotations

import logging
from typing import Any

from capella.errors import CapellaError, RateLimited
from capella.kafka import errors
from capella.kafka.session import Session

log = logging.getLogger(__name__)

MECHANISMS = ["PLAIN"]


async def handshake(session: Session, request: Any, version: int) -> dict[str, Any]:
    if session.broker.authenticator is None:
        # Authentication is off: there is nothing to sign in to.
        return {"error_code": errors.UNSUPPORTED_SASL_MECHANISM, "mechanisms": []}
    if session.signed_in:
        # No re-authentication (the session lifetime answered is 0): a second sign-in is refused.
        session.closing = True
        return {"error_code": errors.ILLEGAL_SASL_STATE, "mechanisms": MECHANISMS}
    if request.mechanism not in MECHANISMS:
        return {"error_code": errors.UNSUPPORTED_SASL_MECHANISM, "mechanisms": MECHANISMS}
    session.mechanism = request.mechanism
    # v0 (KIP-43): the token follows as a bare frame, not in a SaslAuthenticate. librdkafka
    # before 2.10 signs in only with a broker that serves v0, though it then sends v1.
    session.raw_token = version == 0
    return {"error_code": errors.NONE, "mechanisms": MECHANISMS}


async def authenticate(session: Session, request: Any, version: int) -> dict[str, Any]:
    code, message = await sign_in(session, bytes(request.auth_bytes or b""))
    if code != errors.NONE:
        return _refused(code, message)
    return {"error_code": errors.NONE, "error_message": None, "auth_bytes": b"", "session_lifetime_ms": 0}


async def raw_token(session: Session, token: bytes) -> bytes | None:
    """The answer to the bare token that follows a SaslHandshake v0: an empty token (framed)
    once signed in, None when refused (v0 has no error answer: the connection is closed)."""
    session.raw_token = False
    code, _ = await sign_in(session, token)
    return b"\0\0\0\0" if code == errors.NONE else None


async def sign_in(session: Session, token: bytes) -> tuple[int, str]:
    """Sign the session in with a PLAIN token; the Kafka error code and why. A refusal also
    marks the session for closing."""
    authenticator = session.broker.authenticator
    if authenticator is None or session.mechanism is None or session.signed_in:
        session.closing = True
        return errors.ILLEGAL_SASL_STATE, "SaslAuthenticate without a SaslHandshake for PLAIN"
    session.mechanism = None
    parts = token.split(b"\0")
    if len(parts) != 3:
        session.closing = True
        return errors.SASL_AUTHENTICATION_FAILED, "PLAIN expects authzid NUL user NUL password"
    try:
        authzid, name, password = (part.decode("utf-8") for part in parts)
    except UnicodeDecodeError:
        session.closing = True
        return errors.SASL_AUTHENTICATION_FAILED, "PLAIN's fields are UTF-8"
    if authzid and authzid != name:
        session.closing = True
        return errors.SASL_AUTHENTICATION_FAILED, "signing in as another user is not allowed"
    try:
        identity = await authenticator.basic(name, password, session.address)
    except RateLimited as exc:
        session.closing = True
        return errors.SASL_AUTHENTICATION_FAILED, exc.message
    except CapellaError:
        session.closing = True
        # repr, cut short: a stranger's name cannot add lines to the log (as authenticator.py).
        log.info("kafka sign-in refused address=%s user=%.64r", session.address, name)
        return errors.SASL_AUTHENTICATION_FAILED, "wrong user name or password"
    session.identity = identity
    session.signed_in = True
    return errors.NONE, ""


def _refused(code: int, message: str) -> dict[str, Any]:
    return {"error_code": code, "error_message": message, "auth_bytes": b"", "session_lifetime_ms": 0}
