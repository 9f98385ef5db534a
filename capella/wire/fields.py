"""The field types every body shares: ids, times, durations, sizes, names, save modes.

Each is an ``Annotated`` type whose ``msgspec.Meta`` is its JSON Schema in the OpenAPI
document, so a pattern is written here once. Decoding checks the JSON types and the 64-bit
ranges; what a value means (a duration's unit, a name's alphabet, a time's calendar) is
checked by the code that uses it, in the words of today's error messages. ``schema(...)``
adds JSON Schema keywords that decoding does not enforce.
"""

from __future__ import annotations

from decimal import ROUND_DOWN, Decimal, localcontext
from typing import TYPE_CHECKING, Annotated, Any, Literal

from msgspec import Meta

from capella.units import BLANK, DIGIT, MAX_SIZE, parse_duration, parse_size


def schema(**keywords: Any) -> Meta:
    """JSON Schema keywords for the document only (``minimum=0``, ``pattern=...``)."""
    return Meta(extra_json_schema=keywords)


INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

# Queue, subscription, handler and cluster names become storage keys and URL parts.
NAME = r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}"
NAME_PATTERN = f"^{NAME}$"
# A partition of a topic with several partitions is a queue of its own, ``<topic>~<n>`` (n from
# 0 to 9999, no leading zero). No NAME holds ``~`` (nor does a Kafka topic name), so nothing
# else can take a partition's name; only the topic's definition creates and drops them.
PARTITION_SUFFIX = r"~(?:0|[1-9][0-9]{0,3})"
# What names a queue: a queue's own name or a topic's partition.
QUEUE_REF = f"{NAME}(?:{PARTITION_SUFFIX})?"
QUEUE_REF_PATTERN = f"^{QUEUE_REF}$"
USER_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.@\-]{0,127}$"
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
SEGMENTS_PATTERN = rf"^{BLANK}*-?{DIGIT}+(--?{DIGIT}+)?({BLANK}*,{BLANK}*-?{DIGIT}+(--?{DIGIT}+)?)*{BLANK}*$"
BASE64_PATTERN = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
# A segment of a path Capella serves (a name, a number, a fixed word): what a relayed path is
# made of (links/relay.py), each segment unencoded.
RELAY_SEGMENT = r"[A-Za-z0-9_-][A-Za-z0-9_.~-]*"
# What a URL never holds: an ASCII blank or control character (every checker reads these alike;
# \s does not: Python's takes \x1c, ECMA-262's does not).
URL_EXCLUDED = r"\x00-\x20\x7f"
# A duration or a size: a decimal number, then perhaps a unit, blanks around either.
_NUMBER = rf"{DIGIT}+(\.{DIGIT}+)?"
# The same with a digit other than 0 somewhere in the number: greater than 0.
_POSITIVE = rf"({DIGIT}*[1-9]{DIGIT}*(\.{DIGIT}+)?|{DIGIT}+\.{DIGIT}*[1-9]{DIGIT}*)"
_DURATION_UNIT = "(ns|us|ms|s|m|h|d)"
_SIZE_UNIT = "([kmgtKMGT][iI]?[bB]?|[bB])"


def _quantity(number: str, unit: str) -> str:
    return rf"^{BLANK}*{number}{BLANK}*{unit}?{BLANK}*$"


def _below(whole: str) -> str:
    """A pattern for the whole numbers below ``whole`` (decimal digits, no leading zero),
    leading zeros allowed."""
    shorter = [f"{DIGIT}{{1,{len(whole) - 1}}}"] if len(whole) > 1 else []
    same = [
        f"{whole[:k]}[0-{int(d) - 1}]{DIGIT}{{{len(whole) - k - 1}}}" for k, d in enumerate(whole) if d != "0"
    ]
    return f"0*({'|'.join(shorter + same)})"


def at_most(bound: Decimal, *, strict: bool = False) -> str:
    """A pattern for the decimal numbers (``5``, ``0.25``, leading zeros too) not above
    ``bound`` (with ``strict``, below it).

    A bound whose digits do not end (a minute's share of an hour) is cut after 12 places,
    so the pattern takes a little less than the server does, never more.
    """
    with localcontext(prec=60):
        cut = bound.quantize(Decimal("1e-12"), rounding=ROUND_DOWN)
    whole, _, fraction = f"{cut:f}".partition(".")
    fraction = fraction.rstrip("0")
    # The fractions not above .fraction: a shorter prefix, a smaller digit at some place, or
    # the fraction itself followed by zeros (not that one, when strict).
    smaller = [f"{fraction[:k]}[0-{int(d) - 1}]{DIGIT}*" for k, d in enumerate(fraction) if d != "0"]
    prefixes = [fraction[:k] for k in range(1, len(fraction))]
    below = f"{_below(whole)}(\\.{DIGIT}+)?" if whole != "0" else ""
    if fraction:
        tails = [*smaller, *prefixes, *([] if strict else [f"{fraction}0*"])]
        equal = f"0*{whole}(\\.({'|'.join(tails)}))?"
    else:
        equal = "" if strict else f"0*{whole}(\\.0+)?"
    return f"({'|'.join(filter(None, [below, equal]))})"


_UNIT_SECONDS = {"ns": Decimal("1e-9"), "us": Decimal("1e-6"), "ms": Decimal("1e-3"), "s": Decimal(1)}
_UNIT_SECONDS |= {"m": Decimal(60), "h": Decimal(3600), "d": Decimal(86400)}


def duration_at_most(seconds: float, *, positive: bool = False) -> str:
    """The pattern of a duration in text (``DURATION_PATTERN``) of at most ``seconds``; with
    ``positive``, greater than 0 too."""
    limit = Decimal(seconds)
    with localcontext(prec=60):
        bounds = {unit: limit / factor for unit, factor in _UNIT_SECONDS.items()}
    per_unit = [
        f"{at_most(bounds[unit])}{BLANK}*{unit}{'?' if unit == 's' else ''}" for unit in _UNIT_SECONDS
    ]
    nonzero = "(?=[^1-9]*[1-9])" if positive else ""
    return rf"^{BLANK}*{nonzero}({'|'.join(per_unit)}){BLANK}*$"


# Bytes per size unit, in any case, "b" after it or not: k is 1000, ki 1024, and so on.
_SIZE_UNITS = {"([bB])?": Decimal(1)} | {
    f"[{c.lower()}{c}]{'[iI]' if binary else ''}[bB]?": Decimal(1024 if binary else 1000) ** (power + 1)
    for power, c in enumerate("KMGT")
    for binary in (False, True)
}


def size_between(low: int, high: int) -> dict[str, Any]:
    """The schema of a size in text (``SIZE_PATTERN``) from ``low`` to ``high`` bytes."""

    def within(bound: int, *, strict: bool) -> str:
        per_unit = [
            f"{at_most(bound / factor, strict=strict)}{BLANK}*{unit}" for unit, factor in _SIZE_UNITS.items()
        ]
        return rf"^{BLANK}*({'|'.join(per_unit)}){BLANK}*$"

    with localcontext(prec=60):
        return {"pattern": within(high, strict=False), "not": {"pattern": within(low, strict=True)}}


DURATION_PATTERN = _quantity(_NUMBER, _DURATION_UNIT)
POSITIVE_DURATION_PATTERN = _quantity(_POSITIVE, _DURATION_UNIT)
SIZE_PATTERN = _quantity(_NUMBER, _SIZE_UNIT)
# A positive size under one byte is one byte.
POSITIVE_SIZE_PATTERN = _quantity(_POSITIVE, _SIZE_UNIT)

Int64 = Annotated[int, Meta(ge=INT64_MIN, le=INT64_MAX, extra_json_schema={"format": "int64"})]
# A whole number written as a float (5.0), which JSON Schema's integer takes: exact up to 2**53.
WholeFloat = Annotated[float, Meta(ge=-(2**53), le=2**53, multiple_of=1)]
MessageId = Annotated[int, Meta(ge=0, le=INT64_MAX, extra_json_schema={"format": "int64"})]
# An id that names a stored message: ids are handed out from 1. The reader refuses 0 and below
# in its own words (msgspec's ge would also write minimum 0 into the document).
StoredId = Annotated[int, Meta(le=INT64_MAX, extra_json_schema={"format": "int64", "minimum": 1})]
Time = Annotated[float, Meta(description="UNIX seconds")]
# RFC 3339 as wire.parse_time reads it, each part in its range: years from 1, no February 29
# (the reader takes it in a leap year only).
_DATE = (
    r"(000[1-9]|00[1-9]\d|0[1-9]\d\d|[1-9]\d{3})-"
    r"((0[1-9]|1[0-2])-(0[1-9]|1\d|2[0-8])|(0[13-9]|1[0-2])-(29|30)|(0[13578]|1[02])-31)"
)
RFC3339 = _DATE + r"[Tt ]([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d+)?([Zz]|[+-]([01]\d|2[0-3]):[0-5]\d)"
DateTime = Annotated[str, schema(format="date-time", pattern=f"^{RFC3339}$")]
# The last second RFC 3339 text can name (9999-12-31T23:59:59Z): a time given as a number is
# no later either.
MAX_TIME = 253_402_300_799
# A time a client gives: UNIX seconds or RFC 3339 text (wire.parse_time reads both).
TimeInput = Annotated[float, schema(maximum=MAX_TIME)] | DateTime
Base64 = Annotated[str, schema(contentEncoding="base64", pattern=BASE64_PATTERN)]
Base64Out = Annotated[str, schema(contentEncoding="base64")]
Headers = dict[str, str]

DurationText = Annotated[str, schema(pattern=DURATION_PATTERN)]
# Seconds, or text such as "250ms", "30s", "10m", "2d".
Duration = Annotated[float, schema(minimum=0)] | DurationText
PositiveDuration = (
    Annotated[float, schema(exclusiveMinimum=0)] | Annotated[str, schema(pattern=POSITIVE_DURATION_PATTERN)]
)
PositiveDurationText = Annotated[str, schema(pattern=POSITIVE_DURATION_PATTERN)]
# A lease: more than 0 and at most 12 h (a text one over 12 h is refused too).
MAX_LEASE = 12 * 3600
Lease = (
    Annotated[float, schema(exclusiveMinimum=0, maximum=MAX_LEASE)]
    | Annotated[str, schema(pattern=duration_at_most(MAX_LEASE, positive=True))]
)
# A message's source: at most this many bytes of UTF-8. The one declaration: the model checks
# it (capella.core.limits), the client and the document read it.
MAX_SOURCE_BYTES = 255
# How long to hold something back: at most ten years (a text one over that is refused too).
MAX_DELAY = 10 * 365 * 86_400
Delay = (
    Annotated[float, schema(minimum=0, maximum=MAX_DELAY)]
    | Annotated[str, schema(pattern=duration_at_most(MAX_DELAY))]
)
# Bytes, or text such as "512k", "8MB", "16MiB".
SizeText = Annotated[str, schema(pattern=SIZE_PATTERN)]
Size = Annotated[int, schema(minimum=0)] | SizeText

Name = Annotated[str, schema(pattern=NAME_PATTERN)]
QueueReference = Annotated[str, schema(pattern=QUEUE_REF_PATTERN)]
# A name, or "" for the default one (the field's description says which).
NameOrDefault = Annotated[str, schema(pattern=f"^({NAME})?$")]
UserName = Annotated[str, schema(pattern=USER_NAME_PATTERN)]
EnvName = Annotated[str, schema(pattern=ENV_NAME_PATTERN)]
SegmentsText = Annotated[str, schema(pattern=SEGMENTS_PATTERN)]
NonEmpty = Annotated[str, schema(minLength=1)]


def exactly_one(*names: str) -> dict[str, Any]:
    """JSON Schema for "exactly one of these fields, not null" (null counts as not given)."""
    return {"oneOf": [{"required": [n], "properties": {n: {"not": {"type": "null"}}}} for n in names]}


SaveModeText = Literal["none", "immediate", "mark", "wait", "default", "0", "1", "2", "3", "4"]
# A queue's own modes: "default" (and 4) would point back at the definition itself.
DefinitionSaveMode = Literal["none", "immediate", "mark", "wait", "0", "1", "2", "3"]


# Handler params decode straight into their structs (``wire.params.decode_params``), so a
# duration or a size is turned into seconds or bytes while it is decoded. msgspec hands a
# value to ``decode_hook`` only for a type it does not know: at run time these are classes of
# their own, while to the type checker, and in every decoded struct, they are plain numbers.
# The shortest period a handler param may name (an interval, a long poll, a retry delay):
# a handler woken more often does little but wake (docs/handlers.md measures one at the floor).
MIN_PERIOD = 0.01

# A push request's timeout (docs/push.md: a receiver that needs longer answers 202).
MAX_REQUEST_SECONDS = 60.0

if TYPE_CHECKING:
    Seconds = float
    PositiveSeconds = float
    RequestSeconds = float
    Interval = float
    RetryInterval = float
    IntervalOrZero = float
    Bytes = int
else:

    class Seconds(float):
        """A duration: ``"30s"``, a number of seconds, or the original's nanoseconds (>= 1e12)."""

    class PositiveSeconds(Seconds):
        """A duration greater than 0."""

    class RequestSeconds(Seconds):
        """A duration greater than 0 and at most ``MAX_REQUEST_SECONDS``."""

    class Interval(Seconds):
        """A handler's period: at least ``MIN_PERIOD``."""

    class RetryInterval(Seconds):
        """A retry delay: at least ``MIN_PERIOD``, at most ``MAX_DELAY``."""

    class IntervalOrZero(Seconds):
        """A handler's period, or 0 where 0 means none (continuous, woken by work)."""

    class Bytes(int):
        """A size greater than 0: ``"8MiB"``, ``"512k"`` or a number of bytes."""


# The original API took durations in nanoseconds; no sane interval is 31,700 years of seconds.
NANOSECOND_THRESHOLD = 10**12


def seconds(value: object, *, positive: bool) -> float:
    """Seconds from a duration as the handler params take it; ``ValueError`` says why not."""
    # A JSON integer only: not a bool, nor a whole float (decode.WholeFloat) that was seconds.
    if type(value) is int and value >= NANOSECOND_THRESHOLD:
        result = value / 1e9
    else:
        result = parse_duration(value)
    if positive and result <= 0:
        raise ValueError("must be greater than 0")
    return result


def decode_hook(kind: type, value: object) -> object:
    """``msgspec.convert``'s ``dec_hook`` for ``Seconds``, ``PositiveSeconds``,
    ``RequestSeconds``, ``Interval``, ``RetryInterval``, ``IntervalOrZero`` and ``Bytes``."""
    # msgspec checks that the hook gave an instance of ``kind``; decode_params makes it plain.
    if kind is PositiveSeconds or kind is Seconds:
        return kind(seconds(value, positive=kind is PositiveSeconds))
    if kind is RequestSeconds:
        found = seconds(value, positive=True)
        if found > MAX_REQUEST_SECONDS:
            raise ValueError(f"must be at most {MAX_REQUEST_SECONDS:g} seconds")
        return kind(found)
    if kind is RetryInterval:
        found = seconds(value, positive=False)
        if not MIN_PERIOD <= found <= MAX_DELAY:
            raise ValueError(
                f"must be at least {MIN_PERIOD:g} seconds, the floor of a handler's periods, "
                "and at most ten years"
            )
        return kind(found)
    if kind is Interval or kind is IntervalOrZero:
        found = seconds(value, positive=False)
        if found < MIN_PERIOD and not (kind is IntervalOrZero and found == 0):
            zero = " (or 0)" if kind is IntervalOrZero else ""
            raise ValueError(
                f"must be at least {MIN_PERIOD:g} seconds{zero}, the floor of a handler's periods"
            )
        return kind(found)
    if kind is Bytes:
        size = parse_size(value)
        if size <= 0:
            raise ValueError("must be greater than 0")
        return kind(size)
    # msgspec's hook protocol: NotImplementedError says "not a type this hook knows".
    raise NotImplementedError(kind)


def schema_hook(kind: type) -> dict[str, Any]:
    """The JSON Schema of ``Seconds``, ``PositiveSeconds`` and ``Bytes`` in the document."""
    if kind is PositiveSeconds:
        return {
            "anyOf": [
                {"type": "number", "exclusiveMinimum": 0},
                {"type": "string", "pattern": POSITIVE_DURATION_PATTERN},
            ]
        }
    if kind is RequestSeconds:
        return {
            "anyOf": [
                {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_REQUEST_SECONDS},
                {"type": "string", "pattern": duration_at_most(MAX_REQUEST_SECONDS, positive=True)},
            ]
        }
    if kind is RetryInterval:
        return {
            "anyOf": [
                {"type": "number", "minimum": MIN_PERIOD, "maximum": MAX_DELAY},
                {"type": "string", "pattern": duration_at_most(MAX_DELAY, positive=True)},
            ],
            "description": f"at least {MIN_PERIOD:g} s, at most ten years",
        }
    if kind is Seconds:
        return {"anyOf": [{"type": "number", "minimum": 0}, {"type": "string", "pattern": DURATION_PATTERN}]}
    if kind is Interval:
        # The text form's pattern takes any positive duration; the server refuses one below the floor.
        return {
            "anyOf": [
                {"type": "number", "minimum": MIN_PERIOD},
                {"type": "string", "pattern": POSITIVE_DURATION_PATTERN},
            ],
            "description": f"at least {MIN_PERIOD:g} s",
        }
    if kind is IntervalOrZero:
        return {
            "anyOf": [
                {"const": 0},
                {"type": "number", "minimum": MIN_PERIOD},
                {"type": "string", "pattern": DURATION_PATTERN},
            ],
            "description": f"0, or at least {MIN_PERIOD:g} s",
        }
    if kind is Bytes:
        text = {"type": "string", "pattern": POSITIVE_SIZE_PATTERN}
        return {"anyOf": [{"type": "integer", "minimum": 1, "maximum": MAX_SIZE}, text]}
    # msgspec's schema_hook protocol, as above.
    raise NotImplementedError(kind)
