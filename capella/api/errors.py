"""The only place that knows which HTTP status each Capella error gets."""

from __future__ import annotations

from capella.errors import (
    AlreadyExists,
    CapellaError,
    Conflict,
    CorruptData,
    Forbidden,
    HeadersTooLarge,
    InvalidConfig,
    InvalidRequest,
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
    NotFound: 404,
    AlreadyExists: 409,
    Conflict: 409,
    StorageUnavailable: 503,
    ShuttingDown: 503,
    NotReady: 503,
    TooManyConnections: 503,
    CorruptData: 503,
    Unreachable: 502,
}


def status_for(exc: CapellaError) -> int:
    """The HTTP status for ``exc``: its nearest class in ``STATUS``, else 500."""
    return next((STATUS[c] for c in type(exc).__mro__ if c in STATUS), 500)
