"""What a server's error answer means on the client: the ``capella.errors`` class of its code.

Callers catch the same classes the server raises (``QueueNotFound``, ``InvalidMessage``...).
"""

from __future__ import annotations

import orjson

from capella.errors import CapellaError


def error_codes() -> dict[str, type[CapellaError]]:
    """Every ``code`` → the most general ``CapellaError`` class that carries it."""
    table: dict[str, type[CapellaError]] = {}
    pending: list[type[CapellaError]] = [CapellaError]
    while pending:
        cls = pending.pop(0)
        table.setdefault(cls.code, cls)
        pending.extend(cls.__subclasses__())
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
