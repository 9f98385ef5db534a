"""What a server's answer means on the client: the ``capella.wire`` struct of a 2xx answer
(with ``Saved``, whether a PUT created it), the ``capella.errors`` class of an error's code.

Callers get the typed structs of the HTTP contract, and catch the same classes the server
raises (``QueueNotFound``, ``InvalidMessage``...).
"""

# No ``from __future__ import annotations`` here: ``Saved`` is a generic NamedTuple, and its
# fields must hold the TypeVar itself, not the text "T", for the SDK reference (pdoc) to read.
from typing import Any, Generic, NamedTuple, TypeVar

import msgspec
import orjson

from capella.errors import CapellaError, error_classes

T = TypeVar("T")

# One decoder per answer type, made on first use: msgspec decodes fastest with a reused one.
_DECODERS: dict[type[Any], msgspec.json.Decoder[Any]] = {}


class Saved(NamedTuple, Generic[T]):
    """What a create-or-update (PUT) answered: the object as saved, and whether it is new.

    ``info, created = await client.save_queue("orders")``, like Django's ``update_or_create``.
    """

    value: T
    created: bool


def decode_answer(kind: type[T], body: bytes) -> T:
    """The wire struct ``kind`` decoded straight from an answer's bytes.

    An answer that does not match its type (a missing field, a wrong type) raises
    ``CapellaError`` rather than reaching the caller half right.
    """
    decoder = _DECODERS.get(kind)
    if decoder is None:
        decoder = _DECODERS[kind] = msgspec.json.Decoder(kind)
    try:
        decoded: T = decoder.decode(body)
    except msgspec.DecodeError as exc:
        raise CapellaError(f"the server's answer is not a {kind.__name__}: {exc}") from None
    return decoded


def error_codes() -> dict[str, type[CapellaError]]:
    """Every ``code`` → the most general ``CapellaError`` class that carries it."""
    table: dict[str, type[CapellaError]] = {}
    for cls in error_classes():
        table.setdefault(cls.code, cls)
    return table


def error_from_answer(status: int, body: bytes) -> CapellaError:
    """The error a non-2xx answer stands for: the class matching its JSON ``code``."""
    try:
        error = orjson.loads(body)["error"]
        code = str(error.pop("code"))
        message = str(error.pop("message", ""))
        details = {str(k): v for k, v in error.items()}
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        text = body[:200].decode("utf-8", errors="replace").strip()
        exc = CapellaError(f"HTTP {status}: {text}" if text else f"HTTP {status}", status=status)
        exc.code = "http_error"
        return exc
    cls = error_codes().get(code)
    if cls is None:
        exc = CapellaError(message, **details)
        exc.code = code
        return exc
    return cls(message, **details)
