"""What every resource module shares: the app keys, the body deadline, query parsing, JSON answers."""

from __future__ import annotations

import asyncio
import re
from typing import Any, TypeVar

import msgspec
from aiohttp import web

from capella import wire
from capella.config import ServerSettings
from capella.core.cluster import Cluster
from capella.core.filter import MessageFilter, parse_path
from capella.core.message import SaveMode
from capella.errors import InvalidRequest, JsonTooDeep, PayloadTooLarge, RequestTimeout
from capella.handlers.supervisor import Supervisor
from capella.units import parse_duration
from capella.wire.decode import decode
from capella.wire.fields import SEGMENTS_PATTERN

CLUSTER = web.AppKey("cluster", Cluster)
SETTINGS = web.AppKey("settings", ServerSettings)
SUPERVISOR = web.AppKey("supervisor", Supervisor)
# Set when the server starts shutting down, so long-lived streams end cleanly.
STOPPING = web.AppKey("stopping", asyncio.Event)

# The bracket skeleton of a JSON text: '{' and '}' become '[' and ']', everything else goes.
_AS_SQUARE = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))

S = TypeVar("S", bound=msgspec.Struct)


def json_response(value: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    """A JSON answer: a wire struct encoded by msgspec, anything else by ``wire.dumps``."""
    body = msgspec.json.encode(value) if isinstance(value, msgspec.Struct) else wire.dumps(value)
    return web.Response(body=body, status=status, headers=headers, content_type=wire.JSON)


async def read_body(request: web.Request) -> bytes:
    """The whole body, within ``body_timeout`` and ``max_body_size``."""
    settings = request.app[SETTINGS]
    try:
        if request.content.is_eof():
            # Already complete (the usual case for small bodies): no deadline to arm.
            return await request.read()
        async with asyncio.timeout(settings.body_timeout):
            return await request.read()
    except TimeoutError:
        raise RequestTimeout(f"the request body did not arrive within {settings.body_timeout:g} s") from None
    except web.HTTPRequestEntityTooLarge:
        raise PayloadTooLarge(
            f"the request body is larger than {settings.max_body_size} bytes",
            limit=settings.max_body_size,
        ) from None
    except web.RequestPayloadError:
        # aiohttp decodes gzip, deflate and zstd bodies itself, and says so when one does not decode.
        encoding = request.headers.get("Content-Encoding", "identity")
        raise InvalidRequest(
            f"the request body could not be read: cut short, or not valid {encoding!r} data"
        ) from None


async def read_json(request: web.Request, *, empty: Any = None) -> Any:
    """The body parsed as JSON, nested at most ``max_json_depth``; ``empty`` when there is no body."""
    body = await read_body(request)
    if not body.strip() and empty is not None:
        return empty
    value = wire.loads(body)
    limit = request.app[SETTINGS].max_json_depth
    if not shallow_enough(body, limit) and nesting(value, limit) > limit:
        raise JsonTooDeep(f"the body nests arrays and objects deeper than {limit} levels", limit=limit)
    return value


def shallow_enough(body: bytes, limit: int) -> bool:
    """True when ``body`` surely nests no deeper than ``limit``; False means "walk it to know".

    Works on the raw bytes at C speed: each ``replace`` pass removes the innermost bracket
    pairs, one level per pass. Brackets inside strings can only make it answer False.
    """
    skeleton = body.translate(_AS_SQUARE, _NOT_BRACKETS)
    if skeleton.count(b"[") <= limit:
        return True
    for _ in range(limit):
        if not skeleton:
            return True
        skeleton = skeleton.replace(b"[]", b"")
    return not skeleton


def nesting(value: object, limit: int) -> int:
    """How deep arrays and objects nest in ``value``, counted up to ``limit + 1``, level by level."""
    depth = 0
    level = [value]
    while depth <= limit:
        containers = [item for item in level if type(item) is dict or type(item) is list]
        if not containers:
            break
        depth += 1
        level = [x for c in containers for x in (c.values() if type(c) is dict else c)]
    return depth


async def read_object(request: web.Request) -> dict[str, Any]:
    """The body as a JSON object; an empty body counts as ``{}``."""
    value = await read_json(request, empty={})
    if not isinstance(value, dict):
        raise InvalidRequest("the body must be a JSON object")
    return value


async def read_struct(request: web.Request, kind: type[S]) -> S:
    """The body decoded into the wire struct ``kind`` (no body counts as ``{}``).

    A wrong type, a missing or an unknown field is ``InvalidRequest`` naming the field by its
    dotted path (``policy.lease``, ``wire.decode``); rules the struct does not hold are the
    caller's to check.
    """
    return decode(await read_json(request, empty={}), kind)


def present(body: msgspec.Struct) -> set[str]:
    """The fields a decoded body gave (``null`` counts as given; a field left out is UNSET)."""
    return {name for name in body.__struct_fields__ if getattr(body, name) is not msgspec.UNSET}


def int_param(
    request: web.Request, name: str, default: int, *, low: int = wire.INT64_MIN, high: int = wire.INT64_MAX
) -> int:
    text = request.query.get(name)
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise InvalidRequest(f"{name}: expected an integer, got {text!r}", parameter=name) from None
    if not low <= value <= high:
        raise InvalidRequest(f"{name}: must be between {low} and {high}, got {value}", parameter=name)
    return value


def limit_param(request: web.Request, default: int = 100) -> int:
    """``limit``: at least 1, capped (not refused) at ``max_limit``."""
    limit = int_param(request, "limit", default, low=1)
    return min(limit, request.app[SETTINGS].max_limit)


def wait_param(request: web.Request, name: str = "wait", default: float = 0.0) -> float:
    """``wait`` (or ``name``): seconds or a duration such as ``"5s"``, capped at ``max_wait``."""
    text = request.query.get(name)
    if text is None or text == "":
        return min(default, request.app[SETTINGS].max_wait)
    try:
        seconds = parse_duration(float(text) if _is_number(text) else text)
    except ValueError as exc:
        raise InvalidRequest(f"{name}: {exc}", parameter=name) from None
    return min(seconds, request.app[SETTINGS].max_wait)


def save_param(request: web.Request) -> SaveMode:
    return SaveMode.parse(request.query.get("save"))


def bool_param(request: web.Request, name: str, default: bool) -> bool:
    text = request.query.get(name)
    if text is None or text == "":
        return default
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise InvalidRequest(f"{name}: expected true or false, got {text!r}", parameter=name)


_SEGMENTS = re.compile(SEGMENTS_PATTERN)


def segments_param(request: web.Request) -> list[tuple[int, int]] | None:
    """``segments=0-9,20-29,42``: inclusive ranges; a negative bound is written ``-5--1``."""
    text = request.query.get("segments")
    if not text:
        return None
    if not _SEGMENTS.fullmatch(text):
        # What the document's pattern takes (Python's reading of \s and \d, as its checkers'),
        # so a value of blanks alone is refused, not taken as no filter.
        raise InvalidRequest(f"segments: expected ranges like 0-9,20-29, got {text!r}", parameter="segments")
    ranges: list[tuple[int, int]] = []
    for part in text.split(","):
        ranges.append(parse_range(part.strip()))
    return ranges


def parse_range(part: str) -> tuple[int, int]:
    bad = InvalidRequest(f"segments: expected ranges like 0-9,20-29, got {part!r}", parameter="segments")
    # The separator is the first '-' that is not a sign: one after a digit.
    cut = next((i for i in range(1, len(part)) if part[i] == "-" and part[i - 1].isdigit()), -1)
    try:
        low = int(part if cut < 0 else part[:cut])
        high = low if cut < 0 else int(part[cut + 1 :])
    except ValueError:
        raise bad from None
    if not wire.INT64_MIN <= low <= high <= wire.INT64_MAX:
        raise bad
    return low, high


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _json_value(text: str) -> Any:
    # A query value is JSON when it parses (42, true, "42"); anything else is a plain string.
    try:
        return wire.loads(text)
    except InvalidRequest:
        return text


def message_filter_param(request: web.Request, others: set[str]) -> MessageFilter:
    """``source``, ``segments``, ``header.<name>=`` and ``json.<dotted.path>=``; any other
    parameter than these and ``others`` is refused."""
    headers = []
    fields = []
    for key, value in request.query.items():
        if key.startswith("header.") and len(key) > 7:
            headers.append((key[7:], value))
        elif key.startswith("json.") and len(key) > 5:
            fields.append((parse_path(key[5:]), _json_value(value)))
        elif key not in ("source", "segments") and key not in others:
            raise InvalidRequest(f"unknown parameter {key!r}", parameter=key)
    segments = segments_param(request)
    return MessageFilter(
        request.query.get("source"),
        None if segments is None else tuple(segments),
        tuple(headers),
        tuple(fields),
    )
