"""One push request: the body and headers sent for a batch of messages, and what an answer means.

With ``batch = 1`` the body is the payload itself and the message's metadata travels as
headers (``Capella-Id``, ``Capella-Source``, ``Capella-Segment``, ``Capella-External-Id``,
``Capella-External-Time``, ``Capella-Time``, and each message header as
``Capella-Header-<name>``, the form a raw produce request takes). A larger batch is a JSON array with
one object per message, in id order. Every request names its ids (``Capella-Ids``) and the
attempt; each message has an idempotency key ``source:external_id``, the identity Capella
deduplicates on, so a receiver can drop a message it has already processed.

Header values outside printable ASCII (and ``%``) are percent-encoded as UTF-8, so any
value can be sent and ``urllib.parse.unquote`` gives it back.
"""

from __future__ import annotations

import email.utils
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import quote

import orjson

from capella import __version__
from capella.core.message import LogMessage, stored_message
from capella.handlers.signature import HEADER as SIGNATURE_HEADER
from capella.handlers.signature import sign

# The first bytes of a refusal kept in the last error and the dead letter's headers.
ANSWER_BYTES = 256
# A Retry-After beyond this is taken as this: a receiver cannot park a message for days.
MAX_RETRY_AFTER = 3600.0
_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")
_TOKEN = re.compile(r"[!#$&'*+.^_`|~0-9A-Za-z-]+")


@dataclass(frozen=True, slots=True)
class Credentials:
    """What the handler read from the environment: the Authorization value and the HMAC secret."""

    authorization: str | None = field(default=None, repr=False)
    secret: bytes | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class Outgoing:
    """A message in a request, with the attempt this request is."""

    message: LogMessage
    attempt: int


def idempotency_key(m: LogMessage) -> str:
    return f"{m.source}:{m.external_id}"


def header_value(text: str) -> str:
    """``text`` as an HTTP header value: printable ASCII as is, anything else percent-encoded."""
    return quote(text, safe=_SAFE)


def request_parts(
    queue: str,
    batch: Sequence[Outgoing],
    *,
    single: bool,
    extra: Mapping[str, str],
    credentials: Credentials,
    now: int,
) -> tuple[bytes, dict[str, str]]:
    """The body and headers of the request that delivers ``batch`` (sorted by id)."""
    headers = dict(extra)
    headers["User-Agent"] = f"capella-push/{__version__}"
    headers["Capella-Queue"] = header_value(queue)
    headers["Capella-Ids"] = ",".join(str(o.message.id) for o in batch)
    headers["Capella-Attempt"] = str(max(o.attempt for o in batch))
    if single:
        (out,) = batch
        m = out.message
        body = m.payload
        headers.setdefault("Content-Type", m.headers.get("content-type", "application/octet-stream"))
        headers["Capella-Id"] = str(m.id)
        headers["Idempotency-Key"] = header_value(idempotency_key(m))
        headers["Capella-Source"] = header_value(m.source)
        headers["Capella-External-Id"] = str(m.external_id)
        headers["Capella-External-Time"] = repr(m.external_time)
        headers["Capella-Time"] = repr(m.time)
        headers["Capella-Segment"] = str(m.segment)
        for name, value in m.headers.items():
            if _TOKEN.fullmatch(name):
                headers[f"Capella-Header-{name}"] = header_value(value)
    else:
        body = orjson.dumps([_item(o) for o in batch])
        headers["Content-Type"] = "application/json"
    if credentials.authorization is not None:
        headers["Authorization"] = credentials.authorization
    if credentials.secret is not None:
        headers[SIGNATURE_HEADER] = sign(credentials.secret, body, now)
    return body, headers


def _item(out: Outgoing) -> dict[str, object]:
    m = out.message
    return {"idempotency_key": idempotency_key(m), "attempt": out.attempt, **stored_message(m)}


def retryable(status: int) -> bool:
    """408, 429 and 5xx: the receiver may take it later (any other non-2xx is a refusal)."""
    return status in (408, 429) or status >= 500


def retry_after(value: str | None, now: float) -> float | None:
    """Seconds from a ``Retry-After`` header (seconds or an HTTP date); ``None`` when absent or bad."""
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        return min(float(text), MAX_RETRY_AFTER)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, min(when.timestamp() - now, MAX_RETRY_AFTER))


def answer_text(status: int, reason: str, head: bytes) -> str:
    """The error kept for a refused request: status, reason and the first bytes of the answer."""
    text = head[:ANSWER_BYTES].decode("utf-8", errors="replace")
    text = " ".join(text.split())
    return f"HTTP {status} {reason}: {text}" if text else f"HTTP {status} {reason}"
