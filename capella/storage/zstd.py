"""Zstandard compression around any Storage.

Keys pass through unchanged; values are compressed on put and decompressed on get. A stored
value that does not start with the zstd frame magic was written before compression was
turned on for the mount and is returned as it is; one that starts with it but does not
decompress (its frame checksum fails, or it is cut short) raises ``CorruptData``.

Journals are never compressed: they are appended to and fsync'd once per group commit, and
compressing each small append would cost more than it saves and make a torn tail
unreadable. The block is compressed once, as a whole, when it is sealed and put.
"""

from __future__ import annotations

import asyncio

import zstandard

from capella.errors import CorruptData
from capella.storage import Journal, Storage, check_range, past_the_end

# Every zstd frame starts with 0xFD2FB528, stored little-endian.
MAGIC = b"\x28\xb5\x2f\xfd"

# Below this a value is (de)compressed on the event loop: it takes microseconds, less than
# a hop to a thread would.
_INLINE_LIMIT = 64 * 1024


class ZstdStorage:
    """Compresses values on their way to ``inner`` and back."""

    def __init__(self, inner: Storage, level: int = 3) -> None:
        self._inner = inner
        self._level = level
        # Used only on the event loop thread; zstandard objects must not be shared by
        # threads at the same time, so threaded work makes its own.
        self._compressor = self._new_compressor()
        self._decompressor = zstandard.ZstdDecompressor()

    async def get(self, key: str) -> bytes:
        packed = await self._inner.get(key)
        if not packed.startswith(MAGIC):
            return packed
        try:
            if len(packed) < _INLINE_LIMIT:
                return self._decompressor.decompress(packed)
            return await asyncio.to_thread(_decompress, packed)
        except zstandard.ZstdError as exc:
            raise CorruptData(f"zstd: value at {key!r} does not decompress: {exc}") from None

    async def get_range(self, key: str, start: int, length: int) -> bytes:
        """The range of the *decompressed* value: the whole value is read and decompressed,
        then sliced (a zstd frame cannot be entered in the middle), so a ranged read of a
        compressed mount costs a whole read. Shared-queue objects live on plain s3 mounts."""
        check_range("zstd", key, start, length)
        value = await self.get(key)
        if start >= len(value):
            raise past_the_end("zstd", key, start, len(value))
        return value[start : start + length]

    async def put(self, key: str, value: bytes) -> None:
        if len(value) < _INLINE_LIMIT:
            packed = self._compressor.compress(value)
        else:
            packed = await asyncio.to_thread(self._new_compressor().compress, value)
        await self._inner.put(key, packed)

    async def delete(self, key: str) -> None:
        await self._inner.delete(key)

    async def list(self, prefix: str) -> list[str]:
        return await self._inner.list(prefix)

    async def journal(self, key: str, *, truncate_to: int | None = None) -> Journal:
        return await self._inner.journal(key, truncate_to=truncate_to)

    async def close(self) -> None:
        await self._inner.close()

    def _new_compressor(self) -> zstandard.ZstdCompressor:
        # The frame checksum is what turns a flipped bit into CorruptData instead of wrong bytes.
        return zstandard.ZstdCompressor(level=self._level, write_checksum=True)


def _decompress(packed: bytes) -> bytes:
    return zstandard.ZstdDecompressor().decompress(packed)
