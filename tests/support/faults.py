"""Fault injectors for tests: a misbehaving reverse proxy, and a storage that fails on purpose.

``FaultProxy(upstream)`` forwards every HTTP request to ``upstream`` unchanged until a test
flips a switch: fail the next N requests (503 SlowDown, 500 InternalError, with a proper S3
XML error body), fail every request, add latency, reset connections (TCP RST, no answer) or
blackhole them (accept, read, never answer). It runs its own event loop in a background
thread, so blocking clients (boto3 in ``asyncio.to_thread``) and async tests can both talk to
it. Every wait in here is bounded, and ``stop`` ends the thread.

``powerfs(mount)`` mounts ``tests/support/powerfs.py`` (FUSE), whose ``cut()`` is a power failure: only
what was fsync'd survives.

``FlakyStorage(inner)`` wraps any storage provider and makes chosen writes raise, for tests
of what the queue's background tasks do when a write fails in a way no real disk would show.

``injected(pid, calls, action)`` attaches ``strace --inject`` to a running server, failing or
delaying the system calls a broken or slow disk would (root only).
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from yarl import URL

from capella.storage import Journal, Storage
from support.wait import until_blocking

# The proxy holds a blackholed request at most this long (far beyond any client timeout a
# test sets), so a forgotten switch cannot hang the suite.
BLACKHOLE_LIMIT = 30.0
START_TIMEOUT = 10.0

S3_ERRORS = {
    503: ("SlowDown", "Please reduce your request rate."),
    500: ("InternalError", "We encountered an internal error. Please try again."),
}

# Hop-by-hop headers, and the ones aiohttp sets again for the body it actually sends.
_REQUEST_SKIP = {"connection", "keep-alive", "transfer-encoding", "content-length", "expect", "te", "upgrade"}
_RESPONSE_SKIP = {"connection", "keep-alive", "transfer-encoding", "content-length"}


def s3_error_body(code: str, message: str) -> bytes:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message>"
        "<RequestId>fault-proxy</RequestId></Error>"
    ).encode()


@dataclass
class _Switches:
    fail_next: int = 0
    fail_status: int = 503
    fail_all: bool = False
    reset_next: int = 0
    reset_all: bool = False
    latency: float = 0.0
    blackhole: bool = False


class FaultProxy:
    """Forwards to ``upstream`` (``http://127.0.0.1:PORT``) and misbehaves when told to."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.port = 0
        self.requests = 0  # requests received, faulty or not
        self.forwarded = 0  # requests that reached the upstream
        # Requests received by kind: PUT, GET, "GET range", LIST, DELETE, HEAD, POST (S3's calls).
        self.calls: Counter[str] = Counter()
        # The same by bucket: the proxy is the session's, and a module's servers elsewhere on
        # this worker may still be polling through it while another test counts its own calls.
        self.bucket_calls: dict[str, Counter[str]] = {}
        self._switches = _Switches()
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)
        self._stopping: asyncio.Event | None = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # --- switches (call from any thread) ---

    def fail_next(self, count: int, status: int = 503) -> None:
        """Answer the next ``count`` requests with ``status`` and an S3 error body."""
        with self._lock:
            self._switches.fail_next, self._switches.fail_status = count, status

    def fail_all(self, status: int = 503) -> None:
        with self._lock:
            self._switches.fail_all, self._switches.fail_status = True, status

    def reset_next(self, count: int) -> None:
        """Reset (TCP RST) the connection of the next ``count`` requests without answering."""
        with self._lock:
            self._switches.reset_next = count

    def reset_all(self) -> None:
        with self._lock:
            self._switches.reset_all = True

    def add_latency(self, seconds: float) -> None:
        """Hold every request this long before forwarding it."""
        with self._lock:
            self._switches.latency = seconds

    def blackhole(self) -> None:
        """Read every request and never answer (until ``heal`` or ``BLACKHOLE_LIMIT``)."""
        with self._lock:
            self._switches.blackhole = True

    def heal(self) -> None:
        """Back to a plain proxy, with the counters at zero."""
        with self._lock:
            self._switches = _Switches()
            self.requests = self.forwarded = 0
            self.calls = Counter()
            self.bucket_calls = {}

    @contextmanager
    def faulty(self) -> Iterator[FaultProxy]:
        """The proxy, healed again on the way out however the block ends."""
        try:
            yield self
        finally:
            self.heal()

    # --- lifecycle ---

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(START_TIMEOUT)

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        try:
            asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(START_TIMEOUT)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(START_TIMEOUT)
            self._loop.close()

    async def _start(self) -> None:
        self._stopping = asyncio.Event()
        # No decompression and no cookie jar: the client must see the upstream's bytes as sent.
        self._session = aiohttp.ClientSession(auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar())
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        sockets = site._server.sockets if site._server else []  # type: ignore[union-attr]
        self.port = int(sockets[0].getsockname()[1])

    async def _stop(self) -> None:
        if self._stopping is not None:
            self._stopping.set()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    # --- the proxy ---

    def _next_fault(self, kind: str, bucket: str = "") -> tuple[str, float, int]:
        with self._lock:
            s = self._switches
            self.requests += 1
            self.calls[kind] += 1
            self.bucket_calls.setdefault(bucket, Counter())[kind] += 1
            if s.blackhole:
                return "blackhole", s.latency, 0
            if s.reset_all or s.reset_next > 0:
                s.reset_next = max(0, s.reset_next - 1)
                return "reset", s.latency, 0
            if s.fail_all or s.fail_next > 0:
                s.fail_next = max(0, s.fail_next - 1)
                return "fail", s.latency, s.fail_status
            return "forward", s.latency, 0

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        bucket = request.path.lstrip("/").partition("/")[0]
        fault, latency, status = self._next_fault(_kind(request), bucket)
        assert self._stopping is not None and self._session is not None
        if latency:
            await asyncio.sleep(latency)
        if fault == "blackhole":
            await request.read()
            await _wait(self._stopping, BLACKHOLE_LIMIT)
            raise web.HTTPServiceUnavailable()
        if fault == "reset":
            _reset(request)
            # The connection is gone; nothing is sent. Raising stops aiohttp from trying.
            raise asyncio.CancelledError
        if fault == "fail":
            code, message = S3_ERRORS.get(status, ("InternalError", "Injected failure."))
            return web.Response(
                status=status, body=s3_error_body(code, message), content_type="application/xml"
            )
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _REQUEST_SKIP}
        url = URL(self.upstream + request.raw_path, encoded=True)
        async with self._session.request(
            request.method,
            url,
            headers=headers,
            data=body,
            allow_redirects=False,
            skip_auto_headers={"User-Agent", "Accept", "Accept-Encoding", "Content-Type"},
        ) as upstream:
            data = await upstream.read()
            with self._lock:
                self.forwarded += 1
            response_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _RESPONSE_SKIP}
            if request.method == "HEAD":
                response = web.Response(status=upstream.status, headers=response_headers)
                if "Content-Length" in upstream.headers:
                    response.headers["Content-Length"] = upstream.headers["Content-Length"]
                return response
            return web.Response(status=upstream.status, body=data, headers=response_headers)


def _kind(request: web.Request) -> str:
    """What an S3 request (path style: /bucket/key) does, for ``FaultProxy.calls``."""
    _, _, key = request.path.lstrip("/").partition("/")
    if request.method == "GET" and not key:
        return "LIST"
    if request.method == "GET" and "Range" in request.headers:
        return "GET range"
    return request.method


def _reset(request: web.Request) -> None:
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        # Linger 0: close() sends RST instead of FIN, as a crashed peer or a middlebox would.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


async def _wait(event: asyncio.Event, limit: float) -> None:
    with suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), limit)


class FlakyStorage:
    """Any Storage that fails on purpose: the next ``times`` writes of a key containing ``match``
    (put, delete, or a journal's sync) raise ``error``. Reads and listings always pass."""

    def __init__(self, inner: Storage) -> None:
        self._inner = inner
        self._rules: list[list[Any]] = []

    def fail(self, match: str, error: BaseException, times: int = 1) -> None:
        self._rules.append([match, error, times])

    def heal(self) -> None:
        self._rules.clear()

    def check(self, key: str) -> None:
        for rule in self._rules:
            if rule[0] in key and rule[2] > 0:
                rule[2] -= 1
                raise rule[1]

    async def get(self, key: str) -> bytes:
        return await self._inner.get(key)

    async def get_range(self, key: str, start: int, length: int) -> bytes:
        return await self._inner.get_range(key, start, length)

    async def put(self, key: str, value: bytes) -> None:
        self.check(key)
        await self._inner.put(key, value)

    async def delete(self, key: str) -> None:
        self.check(key)
        await self._inner.delete(key)

    async def list(self, prefix: str) -> list[str]:
        return await self._inner.list(prefix)

    async def journal(self, key: str, *, truncate_to: int | None = None) -> FlakyJournal:
        return FlakyJournal(self, key, await self._inner.journal(key, truncate_to=truncate_to))

    async def close(self) -> None:
        await self._inner.close()


class FlakyJournal:
    def __init__(self, storage: FlakyStorage, key: str, inner: Journal) -> None:
        self._storage = storage
        self._key = key
        self._inner = inner

    @property
    def size(self) -> int:
        return self._inner.size

    async def append(self, data: bytes) -> None:
        await self._inner.append(data)

    async def sync(self) -> None:
        self._storage.check(self._key)
        await self._inner.sync()

    def append_and_sync(self, data: bytes) -> Awaitable[None]:
        self._storage.check(self._key)
        return self._inner.append_and_sync(data)

    async def close(self) -> None:
        await self._inner.close()


# --- a filesystem that loses what was not fsync'd ------------------------------------------

POWERFS = Path(__file__).with_name("powerfs.py")


class PowerFs:
    """``powerfs.py`` mounted at ``mount`` in a process of its own."""

    def __init__(self, mount: Path, capacity: int = 0) -> None:
        self.mount = mount
        mount.mkdir()
        self.process = subprocess.Popen(
            [sys.executable, str(POWERFS), str(mount), str(capacity)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

        def mounted() -> bool:
            assert self.process.poll() is None, "powerfs exited"
            return os.path.ismount(mount)

        until_blocking(mounted, 10.0, "powerfs to mount", every=0.05)

    def cut(self) -> None:
        """The power goes out and comes back: only what was fsync'd is left."""
        (self.mount / ".power-cut").write_bytes(b"cut")

    def resize(self, capacity: int) -> None:
        (self.mount / ".power-cut").write_bytes(f"size {capacity}".encode())

    def close(self) -> None:
        subprocess.run(["umount", "-l", str(self.mount)], check=False)
        with suppress(subprocess.TimeoutExpired):
            self.process.wait(10.0)
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10.0)


@contextmanager
def powerfs(mount: Path, capacity: int = 0) -> Iterator[PowerFs]:
    fs = PowerFs(mount, capacity)
    try:
        yield fs
    finally:
        fs.close()


# --- system calls failed or delayed with strace -------------------------------------------


@contextmanager
def injected(pid: int, calls: str, action: str) -> Iterator[None]:
    """``strace`` attached to every thread of ``pid``, failing or delaying ``calls``."""
    tracer = subprocess.Popen(
        ["strace", "-f", "-qq", "-p", str(pid), "-e", f"trace={calls}", "-e", f"inject={calls}:{action}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        until_blocking(
            lambda: all(_tracer_of(pid, task) == tracer.pid for task in os.listdir(f"/proc/{pid}/task")),
            within=10.0,
            every=0.05,
            what="strace to attach",
        )
        yield
    finally:
        tracer.terminate()
        tracer.wait(10.0)


def _tracer_of(pid: int, task: str) -> int:
    try:
        with open(f"/proc/{pid}/task/{task}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("TracerPid:"))
    except (FileNotFoundError, ProcessLookupError):
        return -1
