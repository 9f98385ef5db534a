"""What only the s3 provider promises: its object layout, its options, and how it fails.

Everything runs against moto's S3 server on 127.0.0.1 (the ``s3_server`` fixture), and the
network faults go through ``tests/support/faults.py``, a reverse proxy in front of it that answers
503/500, adds latency, resets connections or never answers. Timeouts and attempts are set
small in the mount options so every failure shows within a few seconds.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.faults import FaultProxy
from support.servers import S3Server, free_port

from capella.config import parse_config
from capella.errors import InvalidConfig, InvalidRequest, KeyNotFound, StorageUnavailable, Unsupported
from capella.storage import Storage, open_storage

pytestmark = pytest.mark.s3


def objects_in(s3: S3Server, bucket: str) -> list[str]:
    """Every object name in ``bucket``, listed by a plain boto3 client as an operator would."""
    client = s3.client()
    try:
        response = client.list_objects_v2(Bucket=bucket)
        return sorted(item["Key"] for item in response.get("Contents", []))
    finally:
        client.close()


@pytest.fixture
async def store(s3_server: S3Server, s3_bucket: str) -> AsyncIterator[Storage]:
    opened = open_storage("s3", s3_server.mount_options(s3_bucket, prefix="prefix"))
    yield opened
    await opened.close()


# --- layout and options ------------------------------------------------------------------


async def test_keys_are_objects_under_the_mount_prefix(
    s3_server: S3Server, s3_bucket: str, store: Storage
) -> None:
    await store.put("orders/blocks/0001-0002.blk", b"block")
    await store.put("orders/meta.json", b"{}")

    assert objects_in(s3_server, s3_bucket) == [
        "prefix/orders/blocks/0001-0002.blk",
        "prefix/orders/meta.json",
    ]
    assert await store.list("orders/blocks/") == ["orders/blocks/0001-0002.blk"]
    assert await store.list("") == ["orders/blocks/0001-0002.blk", "orders/meta.json"]


async def test_two_prefixes_in_one_bucket_do_not_see_each_other(s3_server: S3Server, s3_bucket: str) -> None:
    a = open_storage("s3", s3_server.mount_options(s3_bucket, prefix="/a/"))
    b = open_storage("s3", s3_server.mount_options(s3_bucket, prefix="ab"))
    bare = open_storage("s3", s3_server.mount_options(s3_bucket))
    try:
        await a.put("k", b"from a")
        await b.put("k", b"from b")
        assert await a.list("") == ["k"]
        assert await a.get("k") == b"from a"
        assert await bare.list("") == ["a/k", "ab/k"]
        await a.delete("k")
        assert await b.get("k") == b"from b"
    finally:
        for opened in (a, b, bare):
            await opened.close()


async def test_list_follows_pagination(store: Storage) -> None:
    keys = [f"q/blocks/{n:08d}.blk" for n in range(1005)]  # ListObjectsV2 pages hold 1000
    for start in range(0, len(keys), 50):
        await asyncio.gather(*(store.put(key, b"") for key in keys[start : start + 50]))
    assert await store.list("q/blocks/") == keys


async def test_a_mount_from_config_options_works(s3_server: S3Server, s3_bucket: str, tmp_path: Path) -> None:
    raw = {
        "cluster": {"name": "test"},
        "mounts": {
            "default": {"provider": "memory"},
            "archive": {
                "provider": "s3",
                "bucket": s3_bucket,
                "prefix": "capella",
                "endpoint_url": s3_server.url,
                "region": "us-east-1",
                "access_key_id": "capella-test",
                "secret_access_key": "capella-test-secret",
                "storage_class": "STANDARD_IA",
                "connect_timeout": "2s",
                "read_timeout": "5s",
                "max_attempts": 3,
            },
        },
    }
    mount = parse_config(raw, {}, base=tmp_path).mounts["archive"]
    store = open_storage(mount.provider, mount.options)
    try:
        await store.put("orders/blocks/0001-0002.blk", b"cold")
        assert await store.get("orders/blocks/0001-0002.blk") == b"cold"
    finally:
        await store.close()
    client = s3_server.client()
    try:
        head = client.head_object(Bucket=s3_bucket, Key="capella/orders/blocks/0001-0002.blk")
    finally:
        client.close()
    assert head["StorageClass"] == "STANDARD_IA"


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({}, "bucket"),
        ({"bucket": ""}, "bucket"),
        ({"bucket": "b", "prefix": 7}, "prefix"),
        ({"bucket": "b", "max_attempts": 0}, "max_attempts"),
        ({"bucket": "b", "read_timeout": "soon"}, "read_timeout"),
        ({"bucket": "b", "access_key_id": "only-half"}, "secret_access_key"),
        ({"bucket": "b", "addressing_style": "sideways"}, "addressing_style"),
        ({"bucket": "b", "colour": "blue"}, "colour"),
    ],
)
def test_bad_mount_options_are_invalid_config(options: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidConfig, match=match):
        open_storage("s3", options)


def test_opening_a_mount_needs_no_reachable_endpoint() -> None:
    # Nothing listens there; the client is built, and the endpoint reached, on first use only.
    open_storage("s3", {"bucket": "b", "endpoint_url": f"http://127.0.0.1:{free_port()}"})


async def test_journal_is_unsupported(store: Storage) -> None:
    with pytest.raises(Unsupported, match=r"keep journals on a file mount \(mounts.meta\)"):
        await store.journal("orders/blocks/open.blk")
    assert await store.list("") == []


@pytest.mark.parametrize("key", ["", "/abs", "a//b", "a/", "a/../b", "./a"])
async def test_keys_that_are_not_plain_relative_paths_are_refused(store: Storage, key: str) -> None:
    with pytest.raises(InvalidRequest):
        await store.put(key, b"x")
    with pytest.raises(InvalidRequest):
        await store.get(key)
    with pytest.raises(InvalidRequest):
        await store.get_range(key, 0, 1)


async def test_a_missing_bucket_is_storage_unavailable(s3_server: S3Server) -> None:
    store = open_storage("s3", s3_server.mount_options("no-such-bucket-here"))
    try:
        calls = (
            store.get("k"),
            store.get_range("k", 0, 1),
            store.put("k", b"v"),
            store.list(""),
            store.delete("k"),
        )
        for call in calls:
            with pytest.raises(StorageUnavailable, match=r"bucket 'no-such-bucket-here' does not exist"):
                await call
    finally:
        await store.close()


async def test_an_endpoint_nobody_listens_on_is_storage_unavailable(s3_server: S3Server) -> None:
    options = s3_server.mount_options("b", endpoint_url=f"http://127.0.0.1:{free_port()}", max_attempts=2)
    store = open_storage("s3", options)
    try:
        with pytest.raises(
            StorageUnavailable, match=r"cannot read 'k' in bucket 'b': EndpointConnectionError"
        ):
            await store.get("k")
    finally:
        await store.close()


def test_boto3_is_imported_only_when_an_s3_mount_exists(tmp_path: Path) -> None:
    code = """
import sys
import capella.cli, capella.server
from capella.config import load_config
from capella.storage import open_storage

config = load_config()
for mount in config.mounts.values():
    open_storage(mount.provider, mount.options)
loaded = sorted(name for name in sys.modules if name.startswith(("boto3", "botocore")))
assert not loaded, loaded
open_storage("s3", {"bucket": "b"})
assert "boto3" in sys.modules
"""
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


# --- faults ------------------------------------------------------------------------------


@pytest.fixture
def faults(proxy: FaultProxy) -> Iterator[FaultProxy]:
    """The proxy, plain at the start of the test and healed at its end."""
    proxy.heal()
    with proxy.faulty():
        yield proxy


async def proxied(s3: S3Server, proxy: FaultProxy, bucket: str, **options: object) -> Storage:
    settings: dict[str, object] = {"connect_timeout": 1, "read_timeout": 1, "max_attempts": 3}
    return open_storage("s3", s3.mount_options(bucket, endpoint_url=proxy.url, **(settings | options)))


@pytest.mark.parametrize("status", [503, 500])
async def test_transient_errors_are_retried(
    s3_server: S3Server, s3_bucket: str, faults: FaultProxy, status: int
) -> None:
    store = await proxied(s3_server, faults, s3_bucket)
    try:
        faults.fail_next(2, status)
        await store.put("k", b"v")
        faults.fail_next(2, status)
        assert await store.get("k") == b"v"
        assert faults.requests == 6
    finally:
        await store.close()


@pytest.mark.parametrize(("status", "code"), [(503, "SlowDown"), (500, "InternalError")])
async def test_persistent_errors_are_storage_unavailable(
    s3_server: S3Server, s3_bucket: str, faults: FaultProxy, status: int, code: str
) -> None:
    store = await proxied(s3_server, faults, s3_bucket, max_attempts=2)
    try:
        faults.fail_all(status)
        started = time.monotonic()
        with pytest.raises(StorageUnavailable, match=rf"cannot write 'k' in bucket '{s3_bucket}': {code}"):
            await store.put("k", b"v")
        assert time.monotonic() - started < 5
        assert faults.requests == 2
    finally:
        await store.close()


async def test_ranged_reads_are_retried_and_then_storage_unavailable(
    s3_server: S3Server, s3_bucket: str, faults: FaultProxy
) -> None:
    store = await proxied(s3_server, faults, s3_bucket, max_attempts=2)
    try:
        await store.put("k", b"0123456789")
        faults.fail_next(1, 503)
        assert await store.get_range("k", 3, 4) == b"3456"
        faults.reset_next(1)
        assert await store.get_range("k", 8, 4) == b"89"
        faults.fail_all(500)
        with pytest.raises(
            StorageUnavailable, match=rf"cannot read 'k' in bucket '{s3_bucket}': InternalError"
        ):
            await store.get_range("k", 0, 1)
    finally:
        await store.close()


async def test_latency_within_the_read_timeout_still_works(
    s3_server: S3Server, s3_bucket: str, faults: FaultProxy
) -> None:
    store = await proxied(s3_server, faults, s3_bucket, read_timeout=2)
    try:
        faults.add_latency(0.3)
        started = time.monotonic()
        await store.put("k", b"v")
        assert await store.get("k") == b"v"
        assert time.monotonic() - started >= 0.6
        assert faults.requests == 2
    finally:
        await store.close()


async def test_reset_connections_are_retried(s3_server: S3Server, s3_bucket: str, faults: FaultProxy) -> None:
    store = await proxied(s3_server, faults, s3_bucket)
    try:
        faults.reset_next(2)
        await store.put("k", b"v")
        faults.reset_next(2)
        assert await store.get("k") == b"v"
        assert faults.requests == 6
        faults.reset_all()
        with pytest.raises(StorageUnavailable, match=r"cannot list 'k' in bucket .*ConnectionClosedError"):
            await store.list("k")
    finally:
        await store.close()


async def test_a_blackhole_is_storage_unavailable_after_the_read_timeout(
    s3_server: S3Server, s3_bucket: str, faults: FaultProxy
) -> None:
    store = await proxied(s3_server, faults, s3_bucket, read_timeout=0.5, max_attempts=2)
    try:
        faults.blackhole()
        started = time.monotonic()
        with pytest.raises(StorageUnavailable, match=r"cannot read 'k' in bucket .*ReadTimeoutError"):
            await store.get("k")
        elapsed = time.monotonic() - started
        assert 1.0 <= elapsed < 6, elapsed  # two attempts of 0.5 s each, plus a backoff
        assert faults.requests == 2
    finally:
        await store.close()


@pytest.mark.parametrize("fault", ["fail", "reset", "blackhole"])
async def test_a_failed_put_leaves_no_object(
    s3_server: S3Server, s3_bucket: str, faults: FaultProxy, fault: str
) -> None:
    store = await proxied(s3_server, faults, s3_bucket, read_timeout=0.5, max_attempts=2)
    try:
        await store.put("q/old.blk", b"old")
        {"fail": faults.fail_all, "reset": faults.reset_all, "blackhole": faults.blackhole}[fault]()
        with pytest.raises(StorageUnavailable, match=r"'q/new\.blk'"):
            await store.put("q/new.blk", b"new" * 100_000)
        with pytest.raises(StorageUnavailable, match=r"'q/old\.blk'"):
            await store.put("q/old.blk", b"replaced")
        faults.heal()
        with pytest.raises(KeyNotFound):
            await store.get("q/new.blk")
        assert await store.get("q/old.blk") == b"old"
        assert objects_in(s3_server, s3_bucket) == ["q/old.blk"]
    finally:
        await store.close()
