"""Messages between Python values and the wire shape of docs/api.md.

A message to produce is a wire dict (``data`` or ``data_b64`` plus optional metadata), a
``str`` (sent as ``data``) or ``bytes`` (sent as ``data_b64``). A message read back is the
``capella.wire.messages.StoredMessage`` struct, whose ``payload`` property is the payload as
``bytes``, so a caller never has to look at which of ``data`` and ``data_b64`` the server chose.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping
from typing import Any, TypeAlias

from capella.errors import InvalidMessage

MessageLike: TypeAlias = Mapping[str, Any] | str | bytes
"""What ``produce`` accepts for one message."""

Segments: TypeAlias = str | Iterable[int | tuple[int, int]]
"""A segment filter: ``"0-9,20-29"``, or ints and inclusive ``(lo, hi)`` ranges."""


def to_wire(message: MessageLike) -> dict[str, Any]:
    """The wire dict for one message to produce."""
    if isinstance(message, str):
        return {"data": message}
    if isinstance(message, bytes | bytearray | memoryview):
        return {"data_b64": base64.b64encode(message).decode("ascii")}
    if isinstance(message, Mapping):
        return dict(message)
    raise InvalidMessage(f"a message is a dict, str or bytes, not {type(message).__name__}")


def segments_param(segments: Segments) -> str:
    """The ``segments=`` query value: ``"0-9,20-29"``."""
    if isinstance(segments, str):
        return segments
    parts = []
    for item in segments:
        if isinstance(item, tuple):
            low, high = item
            parts.append(f"{int(low)}-{int(high)}")
        else:
            parts.append(str(int(item)))
    return ",".join(parts)
