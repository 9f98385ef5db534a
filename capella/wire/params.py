"""What every handler type's params share: the ``Params`` base, the one way a definition's
``params`` decode into it (``decode_params``), and the field types several types use.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, TypeVar, get_args

import msgspec
from msgspec import Meta

from capella.config import DECLARED_NAME
from capella.errors import InvalidRequest
from capella.wire.decode import Finding, whole_numbers
from capella.wire.fields import INT64_MAX, NAME, QUEUE_REF, Int64, SaveModeText, decode_hook, schema
from capella.wire.struct import Struct


class Params(Struct, forbid_unknown_fields=True):
    """What every type's params share: how a definition's ``params`` object decodes into them.

    ``decode_params`` is the one way in; ``null`` for a field means its default. A subclass
    checks its cross-field rules in ``__post_init__`` (raising ``InvalidRequest`` that names
    the field), and lists the params it no longer takes in ``replaced`` (old → new).
    """

    __schema_base__: ClassVar[bool] = True
    replaced: ClassVar[dict[str, str]] = {}
    # Fields the answers show and a definition may not give (the server fills them in).
    shown_only: ClassVar[tuple[str, ...]] = ()


P = TypeVar("P", bound=Params)


def decode_params(kind: type[P], raw: object) -> P:
    """``raw`` (a definition's ``params``: an object, or null for none) as ``kind``.

    Every error is ``InvalidRequest`` naming the field as ``params.<path>``.
    """
    try:
        params = msgspec.convert(whole_numbers(given(kind, raw)), kind, dec_hook=decode_hook)
    except msgspec.ValidationError as exc:
        raise params_error(exc) from None
    plain(params)
    return params


def given(kind: type[Params], raw: object) -> dict[str, Any]:
    """``raw`` to decode as ``kind``: an object without nulls (null is the default)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise InvalidRequest("params must be an object", field="params")
    for old, new in kind.replaced.items():
        if old in raw:
            raise InvalidRequest(
                f"params.{old} is no longer accepted: a definition may not name the server's "
                f"environment variables. Ask the operator to declare the secret "
                f'([secrets.NAME] env = "VAR" in the configuration) and give params.{new} = "NAME"',
                field=f"params.{old}",
            )
    for name in kind.shown_only:
        if name in raw:
            raise InvalidRequest(f"params.{name}: unknown parameter", field=f"params.{name}")
    return {name: value for name, value in raw.items() if value is not None}


def plain(struct: msgspec.Struct) -> None:
    """Durations and sizes as plain numbers, as msgspec renders them (``Seconds`` → float)."""
    for name in struct.__struct_fields__:
        value = getattr(struct, name)
        if isinstance(value, float) and type(value) is not float:
            setattr(struct, name, float(value))
        elif isinstance(value, int) and type(value) not in (int, bool):
            setattr(struct, name, int(value))
        elif isinstance(value, msgspec.Struct):
            plain(value)
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, msgspec.Struct):
                    plain(item)


def params_error(error: msgspec.ValidationError | str) -> InvalidRequest:
    """A msgspec finding at ``$.x[0].y`` as ``InvalidRequest`` naming ``params.x[0].y``."""
    found = Finding.of(error)
    where = f"params{'.' if found.path else ''}{found.path}{found.rest}"
    problem = found.problem
    if found.unknown is not None or found.missing is not None:
        where = f"{where}.{found.unknown if found.unknown is not None else found.missing}"
        problem = "unknown parameter" if found.unknown is not None else "required"
    return InvalidRequest(f"{where}: {problem[:1].lower()}{problem[1:]}", field=where)


Batch = Annotated[int, Meta(ge=1, le=INT64_MAX)]
# Inclusive [lo, hi] pairs; none: every segment.
# Segments are 64-bit, as a message's segment is (a larger pair was schema-valid and refused).
Segments = Annotated[list[tuple[Int64, Int64]], Meta(min_length=1)]
# As [secrets.NAME] in the configuration allows.
SecretName = Annotated[str, Meta(pattern=f"^{DECLARED_NAME}$")]


def check_segments(segments: list[tuple[int, int]] | None) -> None:
    for lo, hi in segments or ():
        if lo > hi:
            raise InvalidRequest(
                f"params.segments: {[lo, hi]!r} is not a [lo, hi] pair", field="params.segments"
            )


# A save mode by name or number, read by the handler's build (an unknown one is
# invalid_save_mode, as everywhere); answers show the name.
SaveModeName = (
    Annotated[str, schema(enum=list(get_args(SaveModeText)))] | Annotated[int, schema(minimum=0, maximum=4)]
)
# A queue, or cluster/queue for one on an external cluster.
QueueRef = Annotated[str, Meta(pattern=f"^(?:{NAME}/)?{QUEUE_REF}$")]
