"""Fixtures shared by the test suite, one section per part of Capella."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from capella.api import create_app
from capella.config import Config, ServerSettings, parse_config
from capella.core.cluster import Cluster
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


# --- api ---------------------------------------------------------------------------------
# A real Cluster on the memory provider and the real aiohttp app in front of it.


def api_config(tmp_path: Path) -> Config:
    raw = {"cluster": {"name": "test"}, "mounts": {"default": {"provider": "memory"}}}
    return parse_config(raw, {}, base=tmp_path)


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    opened = await Cluster.open(api_config(tmp_path))
    yield opened
    await opened.close()


@pytest.fixture
def api_settings() -> ServerSettings:
    """Small limits so the over-the-limit paths are cheap to reach."""
    return ServerSettings(
        max_body_size=256 * 1024,
        max_message_size=1024,
        max_batch=50,
        body_timeout=0.5,
        max_wait=2.0,
        max_limit=1000,
    )


@pytest.fixture
async def api(
    aiohttp_client: Callable[[web.Application], Awaitable[TestClient[web.Request, web.Application]]],
    cluster: Cluster,
    api_settings: ServerSettings,
) -> TestClient[web.Request, web.Application]:
    return await aiohttp_client(create_app(cluster, api_settings))


# --- client and cli ----------------------------------------------------------------------
# A real `python -m capella serve` process on a free loopback port, for the sync client and
# the command line. Every wait is bounded; the process is stopped with SIGTERM, then killed.

SERVER_START_TIMEOUT = 20.0
SERVER_STOP_TIMEOUT = 10.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    """``capella serve`` in a subprocess, with its data dir and log file."""

    def __init__(self, data_dir: Path, port: int | None = None) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = data_dir.parent / f"{data_dir.name}.log"
        self._log = self.log_path.open("ab")
        command = [sys.executable, "-m", "capella", "serve", "--data-dir", str(data_dir)]
        self.process = subprocess.Popen(
            [*command, "--listen", f"127.0.0.1:{self.port}"],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout: float = SERVER_START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"capella serve exited with {self.process.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(f"{self.url}/readyz", timeout=1.0) as resp:
                    if resp.status == 200:
                        return
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.05)
        raise RuntimeError(f"capella serve not ready after {timeout}s:\n{self.log()}")

    def kill(self) -> None:
        """``kill -9``: no flush, no clean-up, as in a crash."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(SERVER_STOP_TIMEOUT)
        self._log.close()

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(SERVER_STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(SERVER_STOP_TIMEOUT)
        self._log.close()
        return self.process.returncode

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")


@pytest.fixture(scope="module")
def server_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One running server per test module; tests use their own queue names."""
    server = ServerProcess(tmp_path_factory.mktemp("server") / "data")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()
