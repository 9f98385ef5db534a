"""A JSON value into its wire struct, with an error that names the bad field.

``decode(value, kind, at="")`` is how a body, a stored definition or a ``params`` object
becomes its struct: msgspec checks the JSON types, the ranges its ``Meta`` enforces and the
fields (every request struct refuses unknown ones), and the struct's ``__post_init__`` checks
what ties its fields together. A problem is ``InvalidRequest`` naming the field by its dotted
path, below ``at`` when the value sits inside another (``"params"``).

``unknown_field`` is the one error for a field a body may not hold: the struct's own refusal
comes through it, and so do rules that allow a field only in some cases (``"at"`` only for a
retry). The server, the handlers and the configuration's ``[queue_defaults]`` all refuse an
unknown field this way; the configuration words it as its own "unknown key".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec
from msgspec import inspect

from capella.config import closest
from capella.errors import InvalidRequest, UnknownField

S = TypeVar("S")

_JSON_TYPES = {"int": "an integer", "float": "a number", "str": "a string", "bool": "a boolean"}
_JSON_TYPES |= {"array": "an array", "object": "an object", "null": "null"}
# How msgspec words the two findings that name a field: "Object contains unknown field `x`",
# "Object missing required field `x`".
_UNKNOWN = "unknown field `"
_MISSING = "missing required field `"


@dataclass(frozen=True, slots=True)
class Finding:
    """What msgspec found and where, read once from its words (it gives nothing else):
    "Expected `int`, got `str` - at `$.policy.lease[0]`" is the problem, the dotted path
    ``policy.lease`` and the rest ``[0]``; an unknown or missing field is named."""

    problem: str
    path: str  # the object fields down to the bad value, dotted ("policy.lease"); "" at the top
    rest: str  # what follows them ("[0]", "[0].x"), or ""
    located: bool  # whether msgspec said where (" - at `$...`")
    unknown: str | None = None
    missing: str | None = None

    @classmethod
    def of(cls, error: msgspec.ValidationError | str) -> Finding:
        problem, at, where = str(error).partition(" - at `$")
        where = where.removesuffix("`")
        end = 0
        while end < len(where) and where[end] == ".":
            name = end + 1
            while name < len(where) and (where[name].isalnum() or where[name] == "_"):
                name += 1
            if name == end + 1:
                break
            end = name
        return cls(
            problem,
            where[:end].lstrip("."),
            where[end:],
            bool(at),
            unknown=_quoted_after(problem, _UNKNOWN),
            missing=_quoted_after(problem, _MISSING),
        )

    @property
    def where(self) -> str:
        """The whole location below the top: ``policy.lease[0]``."""
        return f"{self.path}{self.rest}".lstrip(".")

    @property
    def location(self) -> str:
        """The location as msgspec wrote it after ``$``: ``.policy.lease[0]``."""
        return f".{self.path}{self.rest}" if self.path else self.rest

    @property
    def got(self) -> str | None:
        """The JSON type msgspec says it got ("got `str`": ``str``), if it says one."""
        start = self.problem.find("got `")
        end = self.problem.find("`", start + 5)
        word = self.problem[start + 5 : end] if start >= 0 and end >= 0 else ""
        return word if word and all(c.isalnum() or c == "_" for c in word) else None

    def in_words(self) -> str:
        """The problem with msgspec's type names as JSON's: "expected an integer, got a string"."""
        parts = self.problem.split("`")
        # An unpaired backtick stays as it was.
        tail = "" if len(parts) % 2 else "`" + parts.pop()
        text = "".join(_in_words(part) if i % 2 else part for i, part in enumerate(parts)) + tail
        return f"{text[:1].lower()}{text[1:]}"


def _in_words(types: str) -> str:
    """``int | null`` → "an integer or null"."""
    return " or ".join(_JSON_TYPES.get(t, t) for t in types.split(" | "))


def _quoted_after(problem: str, marker: str) -> str | None:
    """The name in backticks after ``marker``, up to the last backtick; None without it."""
    start = problem.find(marker)
    if start < 0:
        return None
    start += len(marker)
    end = problem.rfind("`")
    return problem[start:end] if end >= start else None


def decode(value: object, kind: type[S], *, at: str = "") -> S:
    """``value`` (parsed JSON or TOML) as the struct ``kind``; ``InvalidRequest`` names the field."""
    try:
        return msgspec.convert(whole_numbers(value), kind)
    except msgspec.ValidationError as exc:
        raise field_error(str(exc), kind, at) from None


class WholeFloat(int):
    """A whole float (``5.0``) taken as an integer: msgspec's int takes it as any int, and a
    duration still reads it as seconds (only a JSON integer may be the original's nanoseconds)."""


def whole_numbers(value: object) -> object:
    """``value`` with every whole float (``5.0``) as an int (``WholeFloat``), at any depth.

    JSON has one number type, and JSON Schema's integer takes ``5.0``; msgspec's int does not.
    A float field still takes the int.
    """
    if type(value) is float:
        # Only where a float is exact: past 2**53 it may be a rounded integer out of range.
        return WholeFloat(value) if value.is_integer() and abs(value) < 2**53 else value
    if type(value) is dict:
        return {k: whole_numbers(v) for k, v in value.items()}
    if type(value) is list:
        return [whole_numbers(v) for v in value]
    return value


def unknown_field(field: str, known: Iterable[str] = ()) -> UnknownField:
    """``unknown field 'block.max_mesages' (did you mean 'block.max_messages'?)``.

    ``known`` is what the object holding the field takes; the hint is the closest of them.
    """
    parent, _, key = field.rpartition(".")
    names = tuple(known)
    close = closest(key, names)
    hint = f" (did you mean {(f'{parent}.' if parent else '') + close!r}?)" if close else ""
    return UnknownField(f"unknown field {field!r}{hint}", field=field, known=names)


def field_error(text: str, kind: object = None, at: str = "") -> InvalidRequest:
    """``InvalidRequest`` for a msgspec validation message, in the API's words; with ``kind``,
    an unknown field gets the closest known one as a hint."""
    found = Finding.of(text)
    parent = ".".join(p for p in (at, found.path) if p)
    if found.unknown is not None:
        field = f"{parent}.{found.unknown}" if parent else found.unknown
        path = found.path.split(".") if found.path else []
        known = _fields_at(kind, path) if kind is not None and not found.rest else ()
        return unknown_field(field, known)
    if found.missing is not None:
        field = f"{parent}.{found.missing}" if parent else found.missing
        return InvalidRequest(f"{field} is required", field=field)
    if not parent:
        return InvalidRequest("the body must be a JSON object")
    if not found.path:
        return InvalidRequest(f"{parent} must be an object", field=parent)
    return InvalidRequest(f"{parent}{found.rest}: {found.in_words()}", field=parent)


def _fields_at(kind: object, path: list[str]) -> tuple[str, ...]:
    """The field names of the struct found at ``path`` inside ``kind`` (none if there is none)."""
    info: Any = inspect.type_info(kind)
    for name in path:
        struct = _struct(info)
        field = next((f for f in struct.fields if f.encode_name == name), None) if struct else None
        if field is None:
            return ()
        info = field.type
    struct = _struct(info)
    return tuple(f.encode_name for f in struct.fields) if struct else ()


def _struct(info: inspect.Type) -> inspect.StructType | None:
    """The struct a type is, or holds as one of its options (``Limits | None``)."""
    if isinstance(info, inspect.StructType):
        return info
    if isinstance(info, inspect.Metadata):
        return _struct(info.type)
    if isinstance(info, inspect.UnionType):
        return next((s for t in info.types if (s := _struct(t)) is not None), None)
    return None
