"""A fresh storage of each provider kind, built the way a mount builds it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from capella.storage import Storage, open_storage
from support.servers import S3Server

# Every provider runs the same suite; "s3" runs against a moto server on 127.0.0.1 (see the
# s3 section below) and can be left out with `-m "not s3"`.
STORAGE_KINDS = ["memory", "file", "file_zstd", pytest.param("s3", marks=pytest.mark.s3)]


async def make_storage(kind: str, tmp_path: Path, request: pytest.FixtureRequest | None = None) -> Storage:
    """A fresh, empty storage of ``kind``, built the way a mount builds it.

    ``s3`` needs ``request`` to reach the moto server and gets a bucket of its own.
    """
    if kind == "memory":
        return open_storage("memory", {})
    if kind == "file":
        return open_storage("file", {"root": tmp_path / "store"})
    if kind == "file_zstd":
        return open_storage("file", {"root": tmp_path / "store", "compression": "zstd", "level": 3})
    if kind == "s3":
        if request is None:
            raise ValueError("make_storage('s3', ...) needs the pytest request")
        s3: S3Server = request.getfixturevalue("s3_server")
        bucket = await asyncio.to_thread(s3.create_bucket)
        return open_storage("s3", s3.mount_options(bucket, prefix="capella"))
    raise ValueError(f"unknown storage kind {kind!r}")
