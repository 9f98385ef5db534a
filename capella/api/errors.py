"""The only place that knows which HTTP status each Capella error gets."""

from __future__ import annotations

from capella.errors import (
    AlreadyExists,
    CapellaError,
    Conflict,
    CorruptData,
    Forbidden,
    GatewayTimeout,
    HeadersTooLarge,
    InvalidConfig,
    InvalidRequest,
    MethodNotAllowed,
    NotAcceptable,
    NotFound,
    NotReady,
    PayloadTooLarge,
    RateLimited,
    RequestTimeout,
    ShuttingDown,
    StorageUnavailable,
    TooManyConnections,
    Unauthorized,
    Unreachable,
    error_classes,
)

# Subclasses come before their bases only for reading; status_for walks the MRO.
STATUS: dict[type[CapellaError], int] = {
    InvalidRequest: 400,
    InvalidConfig: 400,
    Unauthorized: 401,
    Forbidden: 403,
    RequestTimeout: 408,
    PayloadTooLarge: 413,
    RateLimited: 429,
    HeadersTooLarge: 431,
    NotAcceptable: 406,
    MethodNotAllowed: 405,
    NotFound: 404,
    AlreadyExists: 409,
    Conflict: 409,
    StorageUnavailable: 503,
    ShuttingDown: 503,
    NotReady: 503,
    TooManyConnections: 503,
    CorruptData: 503,
    Unreachable: 502,
    GatewayTimeout: 504,
}


def status_for(exc: CapellaError | type[CapellaError]) -> int:
    """The HTTP status for ``exc`` (or its class): its nearest class in ``STATUS``, else 500."""
    kind = exc if isinstance(exc, type) else type(exc)
    return next((STATUS[c] for c in kind.__mro__ if c in STATUS), 500)


def answered() -> dict[int, list[type[CapellaError]]]:
    """Every error class the server may answer with, by status, the most general first; one
    class per code (``UnknownField`` is an ``invalid_request``). The OpenAPI document lists
    them, and an error aiohttp raises itself gets the code of its status's first."""
    found: dict[int, list[type[CapellaError]]] = {}
    codes: set[str] = set()
    for kind in error_classes():
        if not kind.client_only and kind.code not in codes:
            codes.add(kind.code)
            found.setdefault(status_for(kind), []).append(kind)
    return dict(sorted(found.items()))
