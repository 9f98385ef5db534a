"""Fixtures shared by the test suite, one section per part of Capella."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from capella.storage import Storage, open_storage

# --- storage -----------------------------------------------------------------------------

# Every provider runs the same suite. "s3" joins this list (behind an s3 marker, against a
# moto server on 127.0.0.1) when that provider lands.
STORAGE_KINDS = ["memory", "file", "file_zstd"]


async def make_storage(kind: str, tmp_path: Path) -> Storage:
    """A fresh, empty storage of ``kind``, built the way a mount builds it."""
    if kind == "memory":
        return open_storage("memory", {})
    if kind == "file":
        return open_storage("file", {"root": tmp_path / "store"})
    if kind == "file_zstd":
        return open_storage("file", {"root": tmp_path / "store", "compression": "zstd", "level": 3})
    raise ValueError(f"unknown storage kind {kind!r}")


@pytest.fixture(params=STORAGE_KINDS)
async def storage(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Storage]:
    store = await make_storage(request.param, tmp_path)
    yield store
    await store.close()
