"""Fixtures shared by the test suite, one section per part of Capella; the helpers are in ``support/``."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import msgspec
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from support.cli import Run
from support.clock import Clock
from support.configs import api_config
from support.faults import FaultProxy
from support.pg import PgServer
from support.servers import S3Server, ServerProcess, running
from support.storage import STORAGE_KINDS, make_storage
from support.supervisor import launched

from capella.api import create_app
from capella.cli import main
from capella.client import AsyncClient, Client
from capella.config import Config, ServerSettings
from capella.core.cluster import Cluster
from capella.handlers.supervisor import Supervisor
from capella.storage import Storage

# --- time ------------------------------------------------------------------------------
# Core code takes its clock as a parameter; tests move this one by hand instead of sleeping.


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "hand_clock: the module's cluster runs on the hand-moved clock")


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture(autouse=True)
def no_saved_contexts(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI sees no saved context: never the developer's own (a test that saves some sets its own)."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.getbasetemp() / "config-home"))
    monkeypatch.delenv("CAPELLA_CONTEXT", raising=False)


# --- storage -----------------------------------------------------------------------------


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
    """The fault-injecting proxy (tests/support/faults.py) in front of the moto server."""
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


@pytest.fixture
def cluster_config(tmp_path: Path) -> Config:
    """What ``cluster`` opens: a memory mount, for the app. A module overrides it (files, limits)."""
    return api_config(tmp_path)


@pytest.fixture
def cluster_clock(request: pytest.FixtureRequest) -> Callable[[], float]:
    """The clock ``cluster`` runs on: the real one, or ``clock`` in a module marked ``hand_clock``."""
    if request.node.get_closest_marker("hand_clock") is not None:
        clock: Clock = request.getfixturevalue("clock")
        return clock
    return time.time


@pytest.fixture
def cluster_mounts() -> dict[str, Storage] | None:
    """Mounts to open ``cluster`` on instead of the configured ones (a module's faulty storage)."""
    return None


@pytest.fixture
async def cluster(
    cluster_config: Config,
    cluster_clock: Callable[[], float],
    cluster_mounts: dict[str, Storage] | None,
    request: pytest.FixtureRequest,
) -> AsyncIterator[Cluster]:
    """The cluster under test, started; every module's comes from here, shaped by the three above.

    In a test with an app (one that uses ``api_settings``), its ``[server]`` settings are the
    app's unless the module's config sets its own, as one configuration gives both in a real
    server: the queue checks messages against the limits the app was built with.
    """
    if "api_settings" in request.fixturenames and cluster_config.server == ServerSettings():
        api_settings: ServerSettings = request.getfixturevalue("api_settings")
        cluster_config = msgspec.structs.replace(cluster_config, server=api_settings)
    if cluster_mounts is None:
        opened = Cluster.create(cluster_config, cluster_clock)
    else:
        opened = Cluster(cluster_config, cluster_mounts, cluster_clock)
    await opened.start()
    yield opened
    await opened.close()


@pytest.fixture
async def supervisor(cluster: Cluster) -> AsyncIterator[Supervisor]:
    """The cluster's handler supervisor, started (it loads the persisted handlers)."""
    started = await launched(cluster)
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


# --- client and cli ----------------------------------------------------------------------
# A real `python -m capella serve` process on a free loopback port, for the sync client and
# the command line. Every wait is bounded; the process is stopped with SIGTERM, then killed.


@pytest.fixture(scope="module")
def server_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One running server per test module; tests use their own queue names."""
    yield from running(ServerProcess(tmp_path_factory.mktemp("server") / "data"))


# --- the command line against the module's server ---------------------------------------


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
def blocking_client(server_process: ServerProcess) -> Iterator[Client]:
    """A blocking client of the module's server process."""
    with Client(server_process.url, timeout=10.0) as c:
        yield c


@pytest.fixture
async def async_client(
    aiohttp_server: Callable[[web.Application], Awaitable[TestServer]],
    cluster: Cluster,
    supervisor: Supervisor,
) -> AsyncIterator[AsyncClient]:
    """An async client of the real app served in this process on loopback."""
    server = await aiohttp_server(create_app(cluster, ServerSettings(max_wait=5.0), supervisor))
    async with AsyncClient(f"http://127.0.0.1:{server.port}", timeout=10.0) as c:
        yield c


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """One throwaway PostgreSQL cluster for the session (tests/support/pg.py); each test its database."""
    server = PgServer()
    try:
        yield server
    finally:
        server.close()
