"""Fixtures shared by the test suite, one section per part of Capella."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from faults import FaultProxy
from pg import PgServer

from capella.api import create_app
from capella.auth.authenticator import Authenticator
from capella.auth.store import AuthStore
from capella.cli import main
from capella.client import Client
from capella.config import AuthSettings, Config, ServerSettings, parse_config
from capella.core.cluster import Cluster
from capella.handlers.supervisor import Supervisor
from capella.storage import Storage, open_storage

# --- time ------------------------------------------------------------------------------
# Core code takes its clock as a parameter; tests move this one by hand instead of sleeping.


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture(autouse=True)
def no_saved_contexts(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI sees no saved context: never the developer's own (a test that saves some sets its own)."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.getbasetemp() / "config-home"))
    monkeypatch.delenv("CAPELLA_CONTEXT", raising=False)


def file_config(tmp_path: Path, **queue_defaults: Any) -> Config:
    """A cluster on a file mount in ``tmp_path``, for tests that reopen it and move a ``Clock``.

    The periodic flush is an hour away, so only what a test saves is on disk.
    """
    return parse_config(
        {
            "cluster": {"name": "edge", "data_dir": str(tmp_path / "data")},
            "storage": {"flush_interval": "1h"},
            "queue_defaults": queue_defaults,
        },
        {},
        base=tmp_path,
    )


# --- storage -----------------------------------------------------------------------------

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


@pytest.fixture(params=STORAGE_KINDS)
async def storage(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Storage]:
    store = await make_storage(request.param, tmp_path, request)
    yield store
    await store.close()


# --- s3 ----------------------------------------------------------------------------------
# moto's S3 server (`python -m moto.server`) in a subprocess on a free loopback port, one per
# test session, so the broker's event loop never shares a process with it. Each test gets a
# bucket with a unique name. Credentials are dummies passed as mount options, never through
# the environment, so nothing leaks into other tests and boto3 never looks further for any.

S3_START_TIMEOUT = 20.0
S3_STOP_TIMEOUT = 10.0
S3_ACCESS_KEY = "capella-test"
S3_SECRET_KEY = "capella-test-secret"
S3_REGION = "us-east-1"


class S3Server:
    """A moto server process on 127.0.0.1 and how to reach it."""

    def __init__(self, log_path: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log = log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout: float = S3_START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"moto server exited with {self.process.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(f"{self.url}/moto-api/", timeout=1.0) as resp:
                    if resp.status == 200:
                        return
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.05)
        raise RuntimeError(f"moto server not ready after {timeout}s:\n{self.log()}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(S3_STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(S3_STOP_TIMEOUT)
        self._log.close()

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def mount_options(self, bucket: str, **options: object) -> dict[str, object]:
        """A mount's options for ``bucket`` on this server (``endpoint_url`` may be overridden)."""
        return {
            "bucket": bucket,
            "endpoint_url": self.url,
            "region": S3_REGION,
            "access_key_id": S3_ACCESS_KEY,
            "secret_access_key": S3_SECRET_KEY,
            "connect_timeout": 2,
            "read_timeout": 5,
            "max_attempts": 3,
            **options,
        }

    def client(self) -> Any:
        """A plain boto3 client, to look at buckets the way an operator's tools would."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.url,
            region_name=S3_REGION,
            aws_access_key_id=S3_ACCESS_KEY,
            aws_secret_access_key=S3_SECRET_KEY,
        )

    def create_bucket(self) -> str:
        bucket = f"capella-{uuid.uuid4().hex[:16]}"
        client = self.client()
        try:
            client.create_bucket(Bucket=bucket)
        finally:
            client.close()
        return bucket


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    server = S3Server(tmp_path_factory.mktemp("s3") / "moto.log")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def proxy(s3_server: S3Server) -> Iterator[FaultProxy]:
    """The fault-injecting proxy (tests/faults.py) in front of the moto server."""
    started = FaultProxy(s3_server.url)
    started.start()
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def s3_bucket(s3_server: S3Server) -> str:
    """An empty bucket of this test's own on the moto server."""
    return s3_server.create_bucket()


# --- api ---------------------------------------------------------------------------------
# A real Cluster on the memory provider and the real aiohttp app in front of it.


def api_config(tmp_path: Path, name: str = "test") -> Config:
    raw = {"cluster": {"name": name}, "mounts": {"default": {"provider": "memory"}}}
    return parse_config(raw, {}, base=tmp_path)


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    opened = await Cluster.open(api_config(tmp_path))
    yield opened
    await opened.close()


@pytest.fixture
async def supervisor(cluster: Cluster) -> AsyncIterator[Supervisor]:
    """The cluster's handler supervisor, started (it loads the persisted handlers)."""
    started = Supervisor(cluster)
    await started.start()
    yield started
    await started.close()


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
    supervisor: Supervisor,
) -> TestClient[web.Request, web.Application]:
    return await aiohttp_client(create_app(cluster, api_settings, supervisor))


@contextlib.asynccontextmanager
async def signed_in_api(
    aiohttp_client: Callable[[web.Application], Awaitable[TestClient[web.Request, web.Application]]],
    cluster: Cluster,
    tmp_path: Path,
    settings: ServerSettings,
) -> AsyncIterator[TestClient[web.Request, web.Application]]:
    """The app with authentication on and one admin user, root / root-password."""
    users = AuthStore(tmp_path / "auth")
    users.add_user("root", "root-password", admin=True)
    supervisor = Supervisor(cluster, users=users)
    await supervisor.start()
    authenticator = Authenticator(users, AuthSettings(enabled=True))
    try:
        yield await aiohttp_client(create_app(cluster, settings, supervisor, authenticator=authenticator))
    finally:
        await supervisor.close()


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

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        config: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = data_dir.parent / f"{data_dir.name}.log"
        self._log = self.log_path.open("ab")
        command = [sys.executable, "-m", "capella", "serve", "--data-dir", str(data_dir)]
        if config is not None:
            command += ["--config", str(config)]
        self.process = subprocess.Popen(
            [*command, "--listen", f"127.0.0.1:{self.port}"],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=None if env is None else {**os.environ, **env},
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


def running(server: ServerProcess) -> Iterator[ServerProcess]:
    """For fixtures: ``yield from running(ServerProcess(...))`` waits for it, then stops it."""
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def server_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One running server per test module; tests use their own queue names."""
    yield from running(ServerProcess(tmp_path_factory.mktemp("server") / "data"))


# --- the command line against the module's server ---------------------------------------

Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def run(server_process: ServerProcess, capsys: pytest.CaptureFixture[str]) -> Run:
    """``run("queue", "list")`` → (exit code, stdout, stderr), against the module's server."""

    def run_main(*argv: str, url: str | None = None) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main(["--url", url or server_process.url, *argv])
        out, err = capsys.readouterr()
        return code, out, err

    return run_main


@pytest.fixture
def client(server_process: ServerProcess) -> Iterator[Client]:
    """A blocking client of the module's server (test_client*.py use their own)."""
    with Client(server_process.url, timeout=10.0) as c:
        yield c


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """One throwaway PostgreSQL cluster for the session (tests/pg.py); each test its database."""
    server = PgServer()
    try:
        yield server
    finally:
        server.close()
