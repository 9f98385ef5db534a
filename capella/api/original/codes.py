"""The original's numeric error codes: which one each Capella error gets, per action.

The original gives one code per place an error is raised (10104002: a queue added twice;
10108001: a queue dropped that does not exist), and the tools print it as ``[code] msg``. Where
the captures show the original's code for an error, Capella answers it; errors the original
has no code for get codes of Capella's own, from 10990000 up (docs/compat.md lists them).
"""

from __future__ import annotations

from capella.api.original.envelope import Failure
from capella.errors import (
    AlreadyExists,
    CallLoop,
    CapellaError,
    ClusterNotFound,
    Conflict,
    Forbidden,
    HandlerNotFound,
    HandlerUserNotCovered,
    HandlerUserUnavailable,
    InvalidMessage,
    InvalidRequest,
    InvalidSaveMode,
    NotFound,
    QueueNotFound,
    RateLimited,
    TooManyHops,
    Unauthorized,
    UnknownAction,
    Unreachable,
    UserNotFound,
)

# The original's codes the tools show.
UNKNOWN_ACTION = 10107100
QUEUE_NOT_FOUND = 10107101
CLUSTER_NOT_FOUND = 10107102
HANDLER_NOT_FOUND = 10107103
PERMISSION_DENIED = 10110000
BAD_LOGIN = 10300903  # one code for unknown user, disabled user and wrong password
BAD_AUTH_INFO = 10300902
REQUEST_NULL = 10300906
SAVE_MODE = 10010010
SEGMENT = 10010009
NO_EXTERNAL_ID = 10029000
PING_DENIED = 10101010
HANDLER_NOT_DROPPED = 10117102  # drop_h of a handler that does not exist
CLUSTER_NOT_DROPPED = 10113001  # drop_ec of an external cluster that does not exist
# A queue path (``ec/queue``) whose external cluster does not exist (the original's GetQueue).
PATH_CLUSTER_NOT_FOUND = 10111002
# A queue the handler's user may not touch (the inner error of h_last_error, wire/046).
PASS_PERMISSION_DENIED = 10111000

# Capella's own, for what the original had no code for.
INTERNAL = 10990000
TOO_MANY_HOPS = 10990001
CALL_LOOP = 10990002
UNREACHABLE = 10990003
RATE_LIMITED = 10990004
INVALID = 10990006
CONFLICT = 10990007
UNAVAILABLE = 10990008

# Codes that depend on the action: (action, Capella error class) -> code.
BY_ACTION: dict[tuple[str, type[CapellaError]], int] = {
    ("add_q", AlreadyExists): 10104002,
    ("add_q", Forbidden): 10104000,
    ("add_q", InvalidRequest): 10104001,
    ("drop_q", QueueNotFound): 10108001,
    ("ping", Forbidden): PING_DENIED,
    ("drop_h", HandlerNotFound): HANDLER_NOT_DROPPED,
    ("drop_ec", ClusterNotFound): CLUSTER_NOT_DROPPED,
    # ``place`` of a queue path: the first name is no external cluster here.
    ("queue_path", ClusterNotFound): PATH_CLUSTER_NOT_FOUND,
    ("add_h", InvalidRequest): 10117502,
    ("add_ec", InvalidRequest): 10190302,
    ("SecurityATCB_add_use_cluster", AlreadyExists): 10300100,
}

# The rest, by the nearest class of the error (subclasses before their bases).
BY_CLASS: list[tuple[type[CapellaError], int]] = [
    (UnknownAction, UNKNOWN_ACTION),
    (QueueNotFound, QUEUE_NOT_FOUND),
    (ClusterNotFound, CLUSTER_NOT_FOUND),
    (HandlerNotFound, HANDLER_NOT_FOUND),
    (UserNotFound, 10300900),
    (NotFound, INVALID),
    (Unauthorized, BAD_LOGIN),
    (Forbidden, PERMISSION_DENIED),
    (RateLimited, RATE_LIMITED),
    (InvalidSaveMode, SAVE_MODE),
    (TooManyHops, TOO_MANY_HOPS),
    (CallLoop, CALL_LOOP),
    (InvalidMessage, INVALID),
    (InvalidRequest, INVALID),
    (AlreadyExists, CONFLICT),
    (Conflict, CONFLICT),
    (Unreachable, UNREACHABLE),
]


# The inner code of ``h_last_error`` by the code of the pass's error: the original answers a
# pass its user may not make (no rights, no such user yet) with its GetQueue permission error.
PASS_CODES: dict[str, int] = {
    code: PASS_PERMISSION_DENIED
    for code in (Forbidden.code, HandlerUserUnavailable.code, HandlerUserNotCovered.code)
}


def failure(action: str, exc: CapellaError, user: str | None, place: str = "") -> Failure:
    """``exc`` as the original's error object, for ``action`` run as ``user``; ``place``, when
    given, picks the code in ``BY_ACTION`` instead of the action (where in the call it failed)."""
    for cls in type(exc).__mro__:
        code = BY_ACTION.get((place or action, cls))
        if code is not None:
            break
    else:
        code = next((c for cls, c in BY_CLASS if isinstance(exc, cls)), None)
    if code is None:
        code = UNAVAILABLE if exc.code != "internal" else INTERNAL
    if isinstance(exc, InvalidMessage):
        code = {"segment": SEGMENT, "eid": NO_EXTERNAL_ID}.get(str(exc.details.get("field")), code)
    who = f"[user:{_quoted(user or '')}] " if isinstance(exc, Forbidden) or place else ""
    return Failure(code, f"{who}{action}: {exc.message}", body=exc.details.get("answer"))


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
