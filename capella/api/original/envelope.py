"""The original protocol's envelope: reading a request (gzip, JSON, clock) and writing its answer.

A request is ``{"auth_type", "user_name", "auth_info", "wait", "current_time",
"prefer_content_type", "replace_name_force", "request": {"name", "user", "action", "body",
"object_name"}}``, gzipped when the ``Compress-Type`` header says so; an answer is
``{"start", "finish", "responce": {"body", "error"}}`` (``responce`` spelled so on the wire),
gzipped when the envelope's ``prefer_content_type`` asks, with ``Compress-Type`` always set.
"""

from __future__ import annotations

import gzip
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

    def to_dict(self) -> dict[str, Any]:
        shown: dict[str, Any] = {"code": self.code, "msg": self.msg}
        if self.iet:
            shown["iet"] = self.iet
        if self.inner is not None:
            shown["ie"] = self.inner.to_dict()
        return shown


class Request(msgspec.Struct):
    """What to do: ``action`` on ``object_name`` with ``body``, as ``user`` (empty: the sender)."""

    action: str = ""
    name: str = ""
    user: str = ""
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


def decompress(body: bytes, compress_type: str, limit: int) -> bytes:
    """The envelope's JSON text: ``body`` gunzipped (at most ``limit`` bytes) when the header says gzip."""
    if compress_type == "":
        return body
    if compress_type not in GZIP:
        inner = Failure(10200001, f"Generator.Restore: algorithm {compress_type} is not exists")
        raise Failure(10120102, _restore_fail("", compress_type), inner=inner)
    # A gzip bomb stops at the limit: the output is produced in bounded steps, never all at once.
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        text = inflater.decompress(body, limit + 1)
        if len(text) > limit:
            raise Failure(
                10120102,
                _restore_fail("gzip", compress_type),
                inner=Failure(
                    10201000, f"GZipRestore: the body expands past {limit} bytes (server.max_body_size)"
                ),
            )
        if not inflater.eof:
            raise zlib.error("the gzip stream is cut short")
    except zlib.error as exc:
        inner = Failure(10201000, "GZipRestore: gzip reader not created with error", iet=str(exc))
        raise Failure(10120102, _restore_fail("gzip", compress_type), inner=inner) from None
    return text


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
            "responce": {"body": body, "error": None if error is None else error.to_dict()},
        }
    )
    if prefer in GZIP:
        return gzip.compress(text, compresslevel=5), "gzip"
    return text, ""
