"""Values as objects in an S3 bucket (AWS, MinIO or any S3-compatible endpoint), via boto3.

A key ``queues/orders/blocks/00000001.blk`` is the object ``<prefix>/queues/orders/blocks/
00000001.blk``, so ``aws s3 ls s3://BUCKET/PREFIX/queues/orders/blocks/`` lists a queue's
blocks. Every ``put`` is one ``PutObject``, which S3 applies whole or not at all: a reader
sees the old object or the new one, never a part, and a failed upload leaves nothing behind.
No temporary name or rename is needed (S3 has no rename), and over plain HTTP botocore signs
the payload's SHA-256, so a body damaged on the way is refused by the server.

``get_range`` is one ``GetObject`` with ``Range: bytes=start-end``; S3 answers a range that
runs past the end with what exists and one that starts past it with 416 ``InvalidRange``, which
leaves here as ``CorruptData`` (the rule every provider follows, ``Storage.get_range``).

Object stores cannot append, so ``journal`` raises ``Unsupported``: a queue keeps its
metadata and open block on a file (or memory) mount and only sealed blocks move here.

boto3 is blocking, so every call runs in a thread: of the mount's own pool (``THREADS``, as many
as botocore keeps connections), not the event loop's default one. An endpoint that accepts and
never answers holds each call's thread until the mount's timeouts end it; in a pool of its own
that stalls only this mount, never the file mounts, logins and block encoding that share the
default pool. Its threads are daemons, so a process stopping while S3 is silent exits at once
instead of joining them (nothing waits for their answers any more). The client is built on
first use, in
that thread, so opening a mount (and parsing a config that names one) needs neither a
reachable endpoint nor credentials. botocore retries throttling, 5xx answers, timeouts and
dropped connections itself ("standard" mode, ``max_attempts`` tries); whatever error is
left after that leaves this module as ``StorageUnavailable`` naming the bucket, the key and
the error code, so nothing above storage ever sees a botocore exception.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import boto3
from botocore.config import Config as BotoConfig
from botocore.exceptions import BotoCoreError, ClientError

from capella.backoff import backoff
from capella.errors import (
    CorruptData,
    InvalidConfig,
    InvalidRequest,
    KeyNotFound,
    StorageUnavailable,
    Unsupported,
)
from capella.storage import Journal, check_range
from capella.units import parse_duration

T = TypeVar("T")
# Threads of a mount's own pool: botocore's connection pool holds 10 (max_pool_connections).
THREADS = 10

_MISSING_KEY = {"NoSuchKey", "404", "NotFound"}
_MISSING_BUCKET = "NoSuchBucket"
_ADDRESSING_STYLES = ("auto", "path", "virtual")


class _RangeNotSatisfiable(Exception):
    """(Inside this module.) A ranged GET whose start is past the object's end (HTTP 416)."""

    def __init__(self, size: str) -> None:
        super().__init__(size)
        self.size = size


class S3Storage:
    """Values as objects under one prefix of a bucket; every put is atomic."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        endpoint_url: str | None = None,
        region: str | None = None,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        session_token: str | None = None,
        storage_class: str | None = None,
        connect_timeout: float | str = 5,
        read_timeout: float | str = 30,
        max_attempts: int = 5,
        addressing_style: str | None = None,
    ) -> None:
        if not isinstance(bucket, str) or not bucket:
            raise InvalidConfig("s3: 'bucket' is required")
        if not isinstance(prefix, str):
            raise InvalidConfig(f"s3: prefix must be a string, got {prefix!r}")
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise InvalidConfig(f"s3: max_attempts must be a positive integer, got {max_attempts!r}")
        if (access_key_id is None) != (secret_access_key is None):
            raise InvalidConfig("s3: give both access_key_id and secret_access_key, or neither")
        # MinIO and most S3-compatible servers want the bucket in the path, not the host name.
        style = addressing_style or ("path" if endpoint_url else "auto")
        if style not in _ADDRESSING_STYLES:
            raise InvalidConfig(f"s3: addressing_style must be one of {', '.join(_ADDRESSING_STYLES)}")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self._base = f"{self.prefix}/" if self.prefix else ""
        self._endpoint_url = endpoint_url
        self._region = region
        self._credentials = {
            "aws_access_key_id": access_key_id,
            "aws_secret_access_key": secret_access_key,
            "aws_session_token": session_token,
        }
        self._storage_class = storage_class
        self._max_attempts = max_attempts
        timeouts: dict[str, float] = {}
        for name, value in (("connect_timeout", connect_timeout), ("read_timeout", read_timeout)):
            try:
                timeouts[name] = parse_duration(value)
            except ValueError as exc:
                raise InvalidConfig(f"s3: {name}: {exc}") from None
        self._config = BotoConfig(
            **timeouts,
            # total_max_attempts counts the first try too (botocore's max_attempts would not).
            retries={"mode": "standard", "total_max_attempts": max_attempts},
            s3={"addressing_style": style},
        )
        self._client: Any = None
        self._client_lock = threading.Lock()
        self._threads: DaemonThreads | None = None  # made on the first call

    async def get(self, key: str) -> bytes:
        name = self._name(key)

        def read() -> bytes:
            # botocore retries a request until its headers arrive; a connection lost while the
            # body streams in is retried here, with the same budget of attempts.
            for attempt in range(1, self._max_attempts + 1):
                response = self._s3().get_object(Bucket=self.bucket, Key=name)
                try:
                    return bytes(response["Body"].read())
                except BotoCoreError:
                    if attempt == self._max_attempts:
                        raise
                    time.sleep(backoff(attempt, 0.1, 2.0))
            raise AssertionError("unreachable")

        return await self._call("read", key, read, missing_key_is_not_found=True)

    async def get_range(self, key: str, start: int, length: int) -> bytes:
        check_range("s3", key, start, length)
        name = self._name(key)
        wanted = f"bytes={start}-{start + length - 1}"

        def read() -> bytes:
            for attempt in range(1, self._max_attempts + 1):
                response = self._s3().get_object(Bucket=self.bucket, Key=name, Range=wanted)
                try:
                    body = bytes(response["Body"].read())
                except BotoCoreError:
                    if attempt == self._max_attempts:
                        raise
                    time.sleep(backoff(attempt, 0.1, 2.0))
                    continue
                if response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 200:
                    # A server that ignores Range answers the whole object (200, not 206).
                    return body[start : start + length]
                return body
            raise AssertionError("unreachable")

        try:
            return await self._call("read", key, read, missing_key_is_not_found=True, ranged=True)
        except _RangeNotSatisfiable as exc:
            raise CorruptData(
                f"s3: range of {key!r} starts at byte {start}, but the value has {exc.size} bytes"
            ) from None

    async def put(self, key: str, value: bytes) -> None:
        name = self._name(key)
        extra = {"StorageClass": self._storage_class} if self._storage_class else {}

        def write() -> None:
            self._s3().put_object(Bucket=self.bucket, Key=name, Body=value, **extra)

        await self._call("write", key, write)

    async def delete(self, key: str) -> None:
        name = self._name(key)

        def remove() -> None:
            # DeleteObject succeeds for a key that is not there, so a repeated delete is fine.
            self._s3().delete_object(Bucket=self.bucket, Key=name)

        await self._call("delete", key, remove)

    async def list(self, prefix: str) -> list[str]:
        if prefix.startswith("/"):
            raise InvalidRequest(f"s3: bad prefix {prefix!r}")
        full = self._base + prefix
        cut = len(self._base)

        def walk() -> list[str]:
            pages = self._s3().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=full)
            return [item["Key"][cut:] for page in pages for item in page.get("Contents", [])]

        return sorted(await self._call("list", prefix, walk))

    async def journal(self, key: str, *, truncate_to: int | None = None) -> Journal:
        raise Unsupported(f"s3 cannot append ({key!r}); keep journals on a file mount (mounts.meta)")

    async def close(self) -> None:
        with self._client_lock:
            client, self._client = self._client, None
        if client is not None:
            await asyncio.to_thread(client.close)
        threads, self._threads = self._threads, None
        if threads is not None:
            # Calls still hanging on a silent endpoint end by their own timeouts; nobody waits.
            threads.stop()

    def _name(self, key: str) -> str:
        parts = key.split("/")
        if not key or any(part in ("", ".", "..") for part in parts):
            raise InvalidRequest(f"s3: bad key {key!r}")
        return self._base + key

    def _s3(self) -> Any:
        """The boto3 client, built on first use (in a worker thread: it loads JSON models)."""
        with self._client_lock:
            if self._client is None:
                # A session of our own: the options given here (or, where absent, boto3's usual
                # chain of environment, profile and instance role) and nobody else's defaults.
                session = boto3.session.Session(region_name=self._region, **self._credentials)
                self._client = session.client("s3", endpoint_url=self._endpoint_url, config=self._config)
            return self._client

    async def _call(
        self,
        action: str,
        key: str,
        fn: Callable[[], T],
        *,
        missing_key_is_not_found: bool = False,
        ranged: bool = False,
    ) -> T:
        if self._threads is None:
            self._threads = DaemonThreads(THREADS, "s3")
        try:
            return await self._threads.run(fn)
        except ClientError as exc:
            error = exc.response.get("Error", {})
            code = str(error.get("Code") or "Unknown")
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            where = f"s3://{self.bucket}/{self._base}{key}"
            if code == _MISSING_BUCKET:
                raise StorageUnavailable(
                    f"s3: cannot {action} {key!r}: bucket {self.bucket!r} does not exist (NoSuchBucket)"
                ) from None
            if ranged and (code == "InvalidRange" or status == 416):
                # Only a ranged GET can get this: its start is at or past the end.
                raise _RangeNotSatisfiable(str(error.get("ActualObjectSize", "fewer"))) from None
            if missing_key_is_not_found and (code in _MISSING_KEY or status == 404):
                raise KeyNotFound(f"s3: no value at {key!r} ({where})") from None
            detail = f"{code} (HTTP {status}) {error.get('Message') or ''}".rstrip()
            raise StorageUnavailable(
                f"s3: cannot {action} {key!r} in bucket {self.bucket!r}: {detail}"
            ) from exc
        except BotoCoreError as exc:
            raise StorageUnavailable(
                f"s3: cannot {action} {key!r} in bucket {self.bucket!r}: {type(exc).__name__}: {exc}"
            ) from exc


class DaemonThreads:
    """Up to ``size`` daemon threads that run blocking calls for the event loop, started as
    calls come. Unlike ``ThreadPoolExecutor``'s, the interpreter does not join them at exit."""

    def __init__(self, size: int, name: str) -> None:
        self._size = size
        self._name = name
        self._work: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._busy = 0  # calls handed over and not finished
        self._lock = threading.Lock()

    async def run(self, fn: Callable[[], T]) -> T:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        with self._lock:
            self._busy += 1
            if self._busy > len(self._threads) and len(self._threads) < self._size:
                name = f"{self._name}-{len(self._threads)}"
                thread = threading.Thread(target=self._serve, name=name, daemon=True)
                self._threads.append(thread)
                thread.start()
        self._work.put((fn, future, loop))
        return await future

    def stop(self) -> None:
        for _ in self._threads:
            self._work.put(None)

    def _serve(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            fn, future, loop = item
            result: Any = None
            error: BaseException | None = None
            try:
                result = fn()
            except BaseException as exc:  # handed to the caller, whatever it is
                error = exc
            with self._lock:
                self._busy -= 1
            # A closed loop (the process stops): nobody waits for this answer.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_settle, future, result, error)


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
