"""Bytes under keys: the Storage protocol and the registry of providers.

A key is a ``/``-separated relative path such as ``queues/orders/blocks/00000001.blk``.
Every ``put`` is atomic and durable when it returns (write to a temporary name, fsync,
rename, fsync the directory). A ``Journal`` is an append-only value used for the open
block; providers that cannot append (object stores) raise ``Unsupported`` from ``journal``.

Providers are imported only when a mount uses them, so an edge device that never mounts
S3 never imports boto3.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable
from typing import Any, Protocol

from capella.errors import CorruptData, InvalidConfig, InvalidRequest

PROVIDERS = {
    "memory": "capella.storage.memory:MemoryStorage",
    "file": "capella.storage.file:FileStorage",
    "s3": "capella.storage.s3:S3Storage",  # needs the [s3] extra (boto3)
}


class Journal(Protocol):
    """An append-only value. ``append`` buffers; ``sync`` makes everything appended durable."""

    @property
    def size(self) -> int:
        """Bytes appended so far (durable or not)."""
        ...

    async def append(self, data: bytes) -> None: ...

    async def sync(self) -> None: ...

    def append_and_sync(self, data: bytes) -> Awaitable[None]:
        """Append and fsync in one step (one thread hop on disk providers).

        The bytes take their place when the call is made; the caller may call again before
        awaiting, and the bytes land in call order. The awaitable completes once these bytes
        and those of every earlier call are durable, and fails if any earlier call failed.
        """
        ...

    async def close(self) -> None: ...


class Storage(Protocol):
    """Where blocks and metadata live. Errors are translated to ``capella.errors``."""

    async def get(self, key: str) -> bytes:
        """The value at ``key``; ``KeyNotFound`` if there is none."""
        ...

    async def get_range(self, key: str, start: int, length: int) -> bytes:
        """The bytes ``start`` to ``start + length`` of the value at ``key`` (S3's ranged GET).

        A range that runs past the end answers the bytes that exist, so fewer than ``length``;
        a ``start`` at or past the end (also of an empty value) raises ``CorruptData``: the
        caller took the range from an index that the value does not match. ``KeyNotFound`` if
        there is no value; ``InvalidRequest`` for a negative ``start`` or a ``length`` below 1.
        """
        ...

    async def put(self, key: str, value: bytes) -> None:
        """Store ``value`` atomically and durably."""
        ...

    async def delete(self, key: str) -> None:
        """Remove ``key``; no error if it is already gone."""
        ...

    async def list(self, prefix: str) -> list[str]:
        """Every key that starts with ``prefix``, sorted."""
        ...

    async def journal(self, key: str, *, truncate_to: int | None = None) -> Journal:
        """Open (creating if needed) an append-only value at ``key``.

        ``truncate_to`` cuts the existing value to that many bytes first (used by recovery
        to drop a torn tail). Creating the value fsyncs its directory.
        """
        ...

    async def close(self) -> None: ...


def check_range(provider: str, key: str, start: int, length: int) -> None:
    """Refuse a range no value can have (``get_range``'s arguments), the same in every provider."""
    if start < 0 or length < 1:
        raise InvalidRequest(f"{provider}: bad range of {key!r}: start {start}, length {length}")


def past_the_end(provider: str, key: str, start: int, size: int) -> CorruptData:
    """The error for a range that starts at or past the end of a value of ``size`` bytes."""
    return CorruptData(f"{provider}: range of {key!r} starts at byte {start}, but the value has {size} bytes")


def open_storage(provider: str, options: dict[str, Any]) -> Storage:
    """Build the provider named in a mount's config, importing it only now."""
    options = dict(options)
    compression = options.pop("compression", None)
    level = int(options.pop("level", 3))
    try:
        target = PROVIDERS[provider]
    except KeyError:
        known = ", ".join(sorted(PROVIDERS))
        raise InvalidConfig(f"unknown storage provider {provider!r} (known: {known})") from None
    module_name, _, class_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            raise
        raise InvalidConfig(
            f"storage provider {provider!r} needs the {exc.name} package: pip install 'capella[{provider}]'"
        ) from None
    cls = getattr(module, class_name)
    try:
        store: Storage = cls(**options)
    except TypeError as exc:
        raise InvalidConfig(f"bad options for storage provider {provider!r}: {exc}") from None
    if compression in (None, "", "none"):
        return store
    if compression != "zstd":
        raise InvalidConfig(f"unknown compression {compression!r} (known: zstd)")
    from capella.storage.zstd import ZstdStorage

    return ZstdStorage(store, level=level)
