"""Server-Sent Events as the client reads them: bytes in, events and messages out."""

from __future__ import annotations

from capella.client.answers import decode_answer, error_from_answer
from capella.wire.messages import StoredMessage


class EventParser:
    """Server-Sent Events from bytes as they arrive; lines may be split across chunks."""

    def __init__(self) -> None:
        self._pending = b""
        self._fields: dict[str, str] = {}
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[dict[str, str]]:
        """The events completed by ``chunk``, each as ``{"id", "event", "data"}`` (when given)."""
        events = []
        lines = (self._pending + chunk).split(b"\n")
        self._pending = lines.pop()
        for raw in lines:
            line = raw.rstrip(b"\r").decode("utf-8", errors="replace")
            if not line:
                if self._data or self._fields:
                    event = dict(self._fields)
                    if self._data:
                        event["data"] = "\n".join(self._data)
                    events.append(event)
                self._fields = {}
                self._data = []
                continue
            if line.startswith(":"):
                continue  # a keep-alive comment
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "data":
                self._data.append(value)
            elif name in ("id", "event", "retry"):
                self._fields[name] = value
        return events


def message_event(event: dict[str, str]) -> tuple[int, StoredMessage] | None:
    """``(id, message)`` of a message event; ``None`` for any other event."""
    kind = event.get("event", "message")
    if kind == "error":
        raise error_from_answer(500, event.get("data", "").encode())
    if kind != "message" or "data" not in event:
        return None
    message = decode_answer(StoredMessage, event["data"].encode())
    event_id = event.get("id", "")
    return (int(event_id) if event_id.isdigit() else message.id), message
