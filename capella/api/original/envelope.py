"""The original protocol's envelope: reading a request (gzip, JSON, clock) and writing its answer.

A request is ``{"auth_type", "user_name", "auth_info", "wait", "current_time",
"prefer_content_type", "replace_name_force", "request": {"name", "user", "action", "body",
"object_name"}}``, gzipped when the ``Compress-Type`` header says so; an answer is
``{"start", "finish", "responce": {"body", "error"}}`` (``responce`` spelled so on the wire),
gzipped when the envelope's ``prefer_content_type`` asks, with ``Compress-Type`` always set.
"""

from __future__ import annotations

import gzip
import itertools
import re
import time
import zlib
from typing import Any

import msgspec
import orjson

from capella.api.request import nesting, shallow_enough

# ``Compress-Type`` values the original accepts for gzip (its level is the sender's business).
GZIP = frozenset({"gzip", "gzip1", "gzip9"})
CONTENT_TYPE = "text/plain; charset=utf-8"


class Failure(Exception):
    """An error in the original's shape: ``{"code", "msg", "iet", "ie"}``, raised before or
    during an action; ``body`` is what the answer carries beside it (``0`` or ``[]`` for some)."""

    def __init__(
        self, code: int, msg: str, *, iet: str = "", inner: Failure | None = None, body: object = None
    ) -> None:
        super().__init__(msg)
        self.code = code
        self.msg = msg
        self.iet = iet
        self.inner = inner
        self.body = body

    @classmethod
    def of(cls, error: dict[str, Any], body: object = None) -> Failure:
        """An error object another server answered, passed on as it is."""
        inner = error.get("ie")
        return cls(
            int(error.get("code") or 0),
            str(error.get("msg", "")),
            iet=str(error.get("iet") or ""),
            inner=cls.of(inner) if isinstance(inner, dict) else None,
            body=body,
        )

    def shown(self) -> ErrorBody:
        return ErrorBody(self.code, self.msg, self.iet, None if self.inner is None else self.inner.shown())


class ErrorBody(msgspec.Struct, omit_defaults=True):
    """The original's error object as answered: ``iet`` and ``ie`` only when there are any."""

    code: int
    msg: str
    iet: str = ""
    ie: ErrorBody | None = None


class Request(msgspec.Struct):
    """What to do: ``action`` on ``object_name`` with ``body``, as ``user`` (empty: the sender)."""

    name: str = ""
    user: str = ""
    action: str = ""
    body: msgspec.Raw = msgspec.Raw(b"null")
    object_name: str = ""


class Envelope(msgspec.Struct):
    """The request with its sender's credentials and clock; unknown fields are ignored, as Go does.

    ``hops`` is Capella's own: the clusters a nested call has passed through (an original
    server ignores it), so a loop is refused and the depth bounded.
    """

    auth_type: str = ""
    user_name: str = ""
    auth_info: str | None = None
    wait: int = 0
    current_time: int = 0
    prefer_content_type: str = ""
    replace_name_force: bool = False
    request: Request | None = None
    hops: list[str] = []


class Credentials(msgspec.Struct, frozen=True):
    """Who sends an envelope: its first fields, all that is read before the sender is signed in."""

    auth_type: str = ""
    user_name: str = ""
    auth_info: str | None = None


class Inflater:
    """An envelope's JSON text, taken from its body piece by piece as it arrives.

    Gunzipped when ``Compress-Type`` says so, in bounded steps: ``feed`` never holds more
    than ``limit + 1`` bytes of text, and input left over at the limit waits in the
    decompressor, to go on when the caller raises the limit (after sign-in) or to be dropped.
    """

    __slots__ = ("_alg", "_inflater", "raw", "text")

    def __init__(self, compress_type: str) -> None:
        if compress_type != "" and compress_type not in GZIP:
            inner = Failure(10200001, f"Generator.Restore: algorithm {compress_type} is not exists")
            raise Failure(10120102, _restore_fail("", compress_type), inner=inner)
        self._alg = compress_type
        self._inflater = zlib.decompressobj(16 + zlib.MAX_WBITS) if compress_type else None
        self.raw = 0  # body bytes fed
        self.text = bytearray()

    def feed(self, data: bytes, limit: int) -> bool:
        """Take ``data``; False once the text is longer than ``limit`` (what is left is kept)."""
        self.raw += len(data)
        inflater = self._inflater
        if inflater is None:
            self.text += data
            return len(self.text) <= limit
        if inflater.eof:
            return True  # bytes after the gzip stream are ignored, as before
        # max_length is at least 1 (0 would mean no limit): a stream whose text is exactly
        # `limit` long still reads its trailer.
        room = max(limit - len(self.text), 0) + 1
        try:
            self.text += inflater.decompress(inflater.unconsumed_tail + data, room)
        except zlib.error as exc:
            raise self._broken(exc) from None
        return len(self.text) <= limit

    def more(self, limit: int) -> bool:
        """Go on with input kept at the last limit; False once the text is longer than ``limit``."""
        inflater = self._inflater
        if inflater is None or not inflater.unconsumed_tail:
            return len(self.text) <= limit
        return self.feed(b"", limit)

    def too_long(self, limit: int, setting: str) -> Failure:
        """The error for a body longer than ``limit``, or one whose text is (named ``setting``)."""
        if self._inflater is None or len(self.text) <= limit:
            return Failure(
                10120102, f"ClusterServiceJsonCreate.Unmarshal: the request body is larger than {limit} bytes"
            )
        inner = Failure(10201000, f"GZipRestore: the body expands past {limit} bytes ({setting})")
        return Failure(10120102, _restore_fail("gzip", self._alg), inner=inner)

    def finish(self) -> bytes:
        """The whole text, once the body has ended within its limit."""
        if self._inflater is not None and not self._inflater.eof:
            raise self._broken(zlib.error("the gzip stream is cut short"))
        return bytes(self.text)

    def _broken(self, exc: zlib.error) -> Failure:
        inner = Failure(10201000, "GZipRestore: gzip reader not created with error", iet=str(exc))
        return Failure(10120102, _restore_fail("gzip", self._alg), inner=inner)


# The key after the credentials, at the top level of an envelope (each match is checked by decoding).
_REQUEST_KEY = re.compile(rb'"request"\s*:')
# How many "request" keys the head is cut at before giving up: each try decodes the head once.
HEAD_TRIES = 8


def credentials(text: bytes, max_depth: int, limit: int) -> Credentials:
    """The credentials at the head of ``text``: the fields before its top-level ``"request"``.

    The original's clients (and Capella's nested calls) write them first, as Go writes a
    struct's fields in order, so a large envelope's sender can be signed in from its first
    bytes. A ``"request"`` inside a string or a nested value leaves a head that does not
    decode, and the next one is tried.
    """
    for found in itertools.islice(_REQUEST_KEY.finditer(text), HEAD_TRIES):
        head = text[: found.start()].rstrip()
        if head.endswith(b","):
            head = head[:-1]
        elif not head.lstrip().endswith(b"{"):
            continue
        if not shallow_enough(head, max_depth):
            break
        try:
            found_head = msgspec.json.decode(head + b"}", type=Credentials)
        except msgspec.DecodeError:
            continue
        if found_head.auth_info is not None:
            return found_head
        break  # the top-level request comes before any credentials
    raise Failure(
        10120103,
        "ClusterServiceJsonCreate.Unmarshal: unmarshal fail. ct: , au: ",
        iet=f"the envelope is longer than {limit} bytes ([compat] max_read_before_sign_in) "
        "and its credentials do not come before its request",
    )


def _restore_fail(alg: str, alg_set: str) -> str:
    return f"ClusterServiceJsonCreate.Unmarshal: restore fail alg: {alg} alg_set: {alg_set}"


def parse(text: bytes, max_depth: int) -> Envelope:
    """The envelope in ``text``; anything that is not one is the original's 10120103."""
    try:
        if not shallow_enough(text, max_depth) and nesting(orjson.loads(text), max_depth) > max_depth:
            raise ValueError(f"the envelope nests deeper than {max_depth} levels (server.max_json_depth)")
        return msgspec.json.decode(text, type=Envelope)
    except (orjson.JSONDecodeError, msgspec.DecodeError, ValueError) as exc:
        raise Failure(
            10120103, "ClusterServiceJsonCreate.Unmarshal: unmarshal fail. ct: , au: ", iet=str(exc)
        ) from None


def check_clock(envelope: Envelope, now: int) -> None:
    """The original's checks: the sender's clock may not be ahead, and ``wait`` must not have run out."""
    if envelope.current_time > now:
        raise Failure(
            10120000,
            "ClusterService.Call: Current server time less then client time. "
            f"Server:{now} client:{envelope.current_time}",
        )
    if envelope.current_time + envelope.wait < now:
        raise Failure(
            10120001,
            "ClusterService.Call: Current server time more then client time + duration. "
            f"server:{now} client:{envelope.current_time} duration:{envelope.wait / 1e9:g}s",
        )


def answer(start: int, body: object, error: Failure | None, prefer: str) -> tuple[bytes, str]:
    """The answer's bytes and its ``Compress-Type``: gzip when ``prefer`` names it, else plain."""
    text = orjson.dumps(
        {
            "start": start,
            "finish": time.time_ns(),
            "responce": {"body": body, "error": None if error is None else error.shown()},
        },
        # An action's answer may be a struct (the original's shapes, shapes.py).
        default=msgspec.to_builtins,
    )
    if prefer in GZIP:
        return gzip.compress(text, compresslevel=5), "gzip"
    return text, ""
