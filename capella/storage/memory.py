"""Values in a dict, for tests and for queues that never need to survive a restart.

Nothing here is ever durable: ``put`` and ``Journal.sync`` return at once and everything is
lost when the process ends. A journal appends to a ``bytearray`` stored under its own key,
so ``get`` of a journal key returns every byte appended so far, synced or not.
"""

from __future__ import annotations

import asyncio

from capella.errors import InvalidRequest, KeyNotFound, StorageUnavailable
from capella.storage import check_range, past_the_end


class MemoryStorage:
    """Values in a dict; fast, and gone when the process ends."""

    def __init__(self) -> None:
        # A journal's bytearray lives here too, so the dict is the one place values are kept.
        self._values: dict[str, bytes | bytearray] = {}

    async def get(self, key: str) -> bytes:
        try:
            return bytes(self._values[key])
        except KeyError:
            raise KeyNotFound(f"memory: no value at {key!r}") from None

    async def get_range(self, key: str, start: int, length: int) -> bytes:
        check_range("memory", key, start, length)
        try:
            value = self._values[key]
        except KeyError:
            raise KeyNotFound(f"memory: no value at {key!r}") from None
        if start >= len(value):
            raise past_the_end("memory", key, start, len(value))
        return bytes(value[start : start + length])

    async def put(self, key: str, value: bytes) -> None:
        # A put replaces the journal's buffer rather than writing into it, like a rename over
        # an open file: a journal still open on this key keeps appending to the old value.
        self._values[key] = bytes(value)

    async def delete(self, key: str) -> None:
        self._values.pop(key, None)

    async def list(self, prefix: str) -> list[str]:
        return sorted(key for key in self._values if key.startswith(prefix))

    async def journal(self, key: str, *, truncate_to: int | None = None) -> MemoryJournal:
        value = self._values.get(key)
        if isinstance(value, bytearray):
            buffer = value
        else:
            buffer = bytearray(value or b"")
            self._values[key] = buffer
        if truncate_to is not None:
            if not 0 <= truncate_to <= len(buffer):
                raise InvalidRequest(
                    f"memory: cannot truncate {key!r} to {truncate_to} bytes (it has {len(buffer)})"
                )
            del buffer[truncate_to:]
        return MemoryJournal(key, buffer)

    async def close(self) -> None:
        pass


class MemoryJournal:
    """Appends to a bytearray that the storage also serves from ``get``."""

    def __init__(self, key: str, buffer: bytearray) -> None:
        self._key = key
        self._buffer = buffer
        self._closed = False

    @property
    def size(self) -> int:
        return len(self._buffer)

    async def append(self, data: bytes) -> None:
        self._check_open()
        self._buffer.extend(data)

    async def sync(self) -> None:
        self._check_open()

    def append_and_sync(self, data: bytes) -> asyncio.Future[None]:
        self._check_open()
        self._buffer.extend(data)
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    async def close(self) -> None:
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise StorageUnavailable(f"memory: journal {self._key!r} is closed")
