"""Transport security against real servers on 127.0.0.1: TLS and mutual TLS, the connection
guard (the connection cap and the request-head deadline that defeats slowloris), header
limits and the JSON nesting limit.

Servers are real ``capella serve`` processes, one per configuration and module; the one
in-process server (``listen`` from ``capella.server``) is there to reach the client
certificate from a route. Certificates are made per module (support/pki.py). Every
wait is bounded: raw sockets read with a timeout and give up after a fixed number of tries.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from aiohttp.typedefs import Handler
from support.http import RawAnswer as Answer
from support.http import read_answer as read_raw_answer
from support.pki import Pki, make_pki
from support.servers import SERVER_START_TIMEOUT, ServerProcess, running
from support.wait import eventually, until

from capella.api import create_app
from capella.api.connection import ConnectionGuard
from capella.api.request import nesting, shallow_enough
from capella.auth.authenticator import Authenticator
from capella.auth.rule import AccessRule
from capella.auth.store import AuthStore
from capella.client import AsyncClient
from capella.config import AuthSettings, ServerSettings, TlsSettings
from capella.core.cluster import Cluster
from capella.errors import (
    Forbidden,
    HeadersTooLarge,
    InvalidConfig,
    SameClusterName,
    TooManyConnections,
    Unauthorized,
    Unreachable,
)
from capella.handlers.supervisor import Supervisor
from capella.server import listen, ssl_context

pytestmark = pytest.mark.slow

HEADER_TIMEOUT = 1.5
# A loaded CI machine (2 cores, several test runs) may add this much to any deadline.
SLACK = 2.0
READ_TIMEOUT = 10.0


# --- certificates ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


# --- servers ---------------------------------------------------------------------------


def write_config(path: Path, server: str, tls: str = "") -> Path:
    tls_table = f"\n[server.tls]\n{tls}\n" if tls else ""
    path.write_text(
        f'[cluster]\nname = "transport"\n\n[server]\n{server}\n{tls_table}\n'
        '[mounts.default]\nprovider = "memory"\n'
    )
    return path


class TlsServerProcess(ServerProcess):
    """``capella serve`` with ``[server.tls]``: an https:// URL and a TLS readiness check."""

    def __init__(self, data_dir: Path, config: Path, context: ssl.SSLContext) -> None:
        super().__init__(data_dir, config=config)
        self.url = f"https://127.0.0.1:{self.port}"
        self.context = context


@pytest.fixture(scope="module")
def plain_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Plain HTTP, a short head deadline and small header limits."""
    root = tmp_path_factory.mktemp("plain")
    config = write_config(
        root / "capella.toml",
        f'header_timeout = "{HEADER_TIMEOUT}s"\nmax_header_size = "2KiB"\nmax_headers = 20\n',
    )
    yield from running(ServerProcess(root / "data", config=config))


@pytest.fixture(scope="module")
def limited_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """At most 20 connections; a long head deadline so idle connections stay."""
    root = tmp_path_factory.mktemp("limited")
    config = write_config(root / "capella.toml", 'max_connections = 20\nheader_timeout = "60s"\n')
    yield from running(ServerProcess(root / "data", config=config))


def _tls_table(pki: Pki, client_ca: bool) -> str:
    table = f'cert_file = "{pki.server_cert}"\nkey_file = "{pki.server_key}"\n'
    return table + (f'client_ca_file = "{pki.ca}"\n' if client_ca else "")


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("tls")
    config = write_config(
        root / "capella.toml", f'header_timeout = "{HEADER_TIMEOUT}s"', _tls_table(pki, False)
    )
    yield from running(TlsServerProcess(root / "data", config, pki.client_context()))


@pytest.fixture(scope="module")
def mtls_server(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("mtls")
    config = write_config(
        root / "capella.toml", f'header_timeout = "{HEADER_TIMEOUT}s"', _tls_table(pki, True)
    )
    yield from running(TlsServerProcess(root / "data", config, pki.client_context(cert="alice")))


# --- raw HTTP --------------------------------------------------------------------------


def request_bytes(path: str = "/healthz", *, close: bool = False, extra: str = "") -> bytes:
    connection = "close" if close else "keep-alive"
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: {connection}\r\n{extra}\r\n".encode()


async def read_answer(reader: asyncio.StreamReader) -> Answer:
    """One HTTP/1.1 response with a Content-Length, read within ``READ_TIMEOUT``."""
    return await read_raw_answer(reader, READ_TIMEOUT)


async def exchange(port: int, data: bytes, *, then_closed: bool = False) -> Answer:
    """Send ``data`` on a new connection and read one answer (and check the server then closes)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        answer = await read_answer(reader)
        if then_closed:
            assert await closed_within(reader, SLACK) == b""
        return answer
    finally:
        writer.close()


async def closed_within(reader: asyncio.StreamReader, seconds: float) -> bytes:
    """What the server sends before it closes; fails if it is still open after ``seconds``."""
    received = b""
    deadline = time.monotonic() + seconds
    for _ in range(1000):
        left = deadline - time.monotonic()
        assert left > 0, f"still open after {seconds}s; received {received!r}"
        try:
            chunk = await asyncio.wait_for(reader.read(65536), left)
        except TimeoutError:
            continue
        except ConnectionError:
            return received
        if not chunk:
            return received
        received += chunk
    raise AssertionError("too many reads")


# --- the head deadline (slowloris) -----------------------------------------------------


async def test_slowloris_connections_are_closed_while_others_are_served(plain_server: ServerProcess) -> None:
    port = plain_server.port
    head = request_bytes(extra="X-Slow: " + "a" * 200 + "\r\n")

    async def slowloris() -> tuple[float, bytes]:
        # Timed from before the connect: the server's deadline runs from its accept, which a busy
        # client loop may see return well after (a full run saw 1.11 s measured from the return).
        opened = time.monotonic()
        # From another loopback address than the client's: one address's connections are capped,
        # and the client must be served whether its connection comes before the attack or after.
        reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.2", 0))
        received = b""
        try:
            for i in range(40):  # one byte every 0.5 s; bounded at 20 s
                try:
                    writer.write(head[i : i + 1])
                    await writer.drain()
                    chunk = await asyncio.wait_for(reader.read(4096), 0.5)
                except TimeoutError:
                    continue
                except ConnectionError:
                    return time.monotonic() - opened, received
                received += chunk
                if not chunk or received.endswith(b"}"):
                    return time.monotonic() - opened, received
            raise AssertionError(f"a slow connection is still open after 20 s: {received!r}")
        finally:
            writer.close()

    latencies: list[float] = []
    attack = [asyncio.create_task(slowloris()) for _ in range(200)]
    async with AsyncClient(plain_server.url, timeout=10.0) as client:
        await client.put_queue("slowloris")
        for i in range(2000):  # stops when the attack is over; bounded anyway
            started = time.perf_counter()
            await client.produce("slowloris", [{"data": f"m{i}"}])
            await client.read("slowloris", after=i, limit=1)
            latencies.append(time.perf_counter() - started)
            if all(task.done() for task in attack):
                break
            await asyncio.sleep(0.01)  # paced: latency samples all through the attack
        closes = await asyncio.wait_for(asyncio.gather(*attack), HEADER_TIMEOUT + SLACK + 20)
        await client.put_queue("slowloris-after")  # the server still serves

    # The attacking address holds at most max_connections_per_address (128) of them: the rest are
    # refused at once; the held ones are cut at the head deadline.
    refused = [data for _, data in closes if data.startswith(b"HTTP/1.1 503 ")]
    after = sorted(seconds for seconds, data in closes if not data.startswith(b"HTTP/1.1 503 "))
    timed_out = [data for _, data in closes if data.startswith(b"HTTP/1.1 408 ")]
    assert len(refused) == 200 - 128
    assert b'"code":"too_many_connections_from_address"' in refused[0]
    latencies.sort()
    print(
        f"\nslowloris: {len(after)} slow connections closed after {after[0]:.2f}-{after[-1]:.2f} s "
        f"({len(timed_out)} saw the 408); {len(latencies)} produce+read pairs meanwhile: "
        f"p50={statistics.median(latencies) * 1000:.1f} ms "
        f"p99={latencies[int(len(latencies) * 0.99)] * 1000:.1f} ms max={latencies[-1] * 1000:.1f} ms"
    )
    assert after[0] >= HEADER_TIMEOUT - 0.1
    assert after[-1] <= HEADER_TIMEOUT + SLACK
    assert len(latencies) >= 10
    assert latencies[-1] < 1.0
    assert timed_out, "no slow connection was told why it was closed"
    assert b'"code":"request_timeout"' in timed_out[0]


async def test_a_connection_that_sends_nothing_gets_408_and_is_closed(plain_server: ServerProcess) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", plain_server.port)
    started = time.monotonic()
    try:
        received = await closed_within(reader, HEADER_TIMEOUT + SLACK)
    finally:
        writer.close()
    elapsed = time.monotonic() - started

    assert HEADER_TIMEOUT - 0.1 <= elapsed <= HEADER_TIMEOUT + SLACK
    assert received.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
    assert b"Connection: close\r\n" in received
    body = orjson.loads(received.partition(b"\r\n\r\n")[2])
    assert body["error"]["code"] == "request_timeout"
    assert "1.5 s" in body["error"]["message"]


async def test_an_idle_keepalive_connection_outlives_the_head_deadline(plain_server: ServerProcess) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", plain_server.port)
    try:
        writer.write(request_bytes())
        assert (await read_answer(reader)).status == 200
        await asyncio.sleep(
            HEADER_TIMEOUT + 1.0
        )  # idle: keepalive_timeout (75 s) applies, not the head deadline
        writer.write(request_bytes())
        assert (await read_answer(reader)).status == 200
    finally:
        writer.close()


async def test_a_slow_second_head_on_a_keepalive_connection_is_cut(plain_server: ServerProcess) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", plain_server.port)
    try:
        writer.write(request_bytes())
        assert (await read_answer(reader)).status == 200
        await asyncio.sleep(0.5)  # idle between requests: that time must not count against the head
        writer.write(b"GET /healthz HTTP/1.1\r\n")  # the clock starts with this first byte
        started = time.monotonic()
        received = await closed_within(reader, HEADER_TIMEOUT + SLACK)
    finally:
        writer.close()

    assert HEADER_TIMEOUT - 0.1 <= time.monotonic() - started <= HEADER_TIMEOUT + SLACK
    assert received.startswith(b"HTTP/1.1 408 ")


async def test_a_long_poll_is_not_cut_by_the_head_deadline(plain_server: ServerProcess) -> None:
    async with AsyncClient(plain_server.url, timeout=10.0) as client:
        await client.put_queue("long-poll")
        started = time.monotonic()
        answer = await client.read("long-poll", after=0, wait=HEADER_TIMEOUT + 1.0)
        elapsed = time.monotonic() - started
        # The same connection serves the next request.
        await client.produce("long-poll", [{"data": "x"}])

    assert answer.messages == []
    assert elapsed >= HEADER_TIMEOUT + 0.9


async def test_pipelined_requests_are_all_answered(plain_server: ServerProcess) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", plain_server.port)
    try:
        writer.write(request_bytes() * 3 + request_bytes(close=True))
        answers = [await read_answer(reader) for _ in range(4)]
        assert await closed_within(reader, SLACK) == b""
    finally:
        writer.close()

    assert [a.status for a in answers] == [200] * 4


# --- header limits ---------------------------------------------------------------------


async def test_a_header_over_max_header_size_gets_431_json(plain_server: ServerProcess) -> None:
    answer = await exchange(
        plain_server.port, request_bytes(extra=f"X-Big: {'a' * 2100}\r\n"), then_closed=True
    )

    assert answer.status == 431
    error = answer.error()
    assert error["code"] == "headers_too_large"
    assert error["limit"] == 2048
    assert "longer than 2048 bytes" in error["message"]


async def test_a_header_just_under_max_header_size_is_served(plain_server: ServerProcess) -> None:
    answer = await exchange(plain_server.port, request_bytes(extra=f"X-Big: {'a' * 1900}\r\n"))

    assert answer.status == 200


async def test_a_request_line_over_max_header_size_gets_431_json(plain_server: ServerProcess) -> None:
    answer = await exchange(plain_server.port, request_bytes(f"/healthz?{'q' * 2100}"))

    assert answer.status == 431
    assert answer.error()["code"] == "headers_too_large"


async def test_more_than_max_headers_gets_431_json(plain_server: ServerProcess) -> None:
    extra = "".join(f"X-H{i}: {i}\r\n" for i in range(25))
    answer = await exchange(plain_server.port, request_bytes(extra=extra))

    # This also pins aiohttp's "Too many headers" message, which the guard relies on.
    assert answer.status == 431
    error = answer.error()
    assert error["code"] == "headers_too_large"
    assert error["message"] == "the request has more than 20 headers"


async def test_a_request_that_is_not_http_gets_400_json(plain_server: ServerProcess) -> None:
    answer = await exchange(plain_server.port, b"HELLO THERE\r\n\r\n")

    assert answer.status == 400
    assert answer.error()["code"] == "invalid_request"


async def test_the_client_raises_headers_too_large(plain_server: ServerProcess) -> None:
    async with AsyncClient(plain_server.url, token="t" * 3000) as client:
        with pytest.raises(HeadersTooLarge):
            await client.queues()


# --- JSON nesting ----------------------------------------------------------------------


def nested(depth: int) -> bytes:
    """A JSON object ``depth`` levels deep (the outer object counts)."""
    return b'{"x":' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"


async def test_json_deeper_than_max_json_depth_gets_400_json_too_deep(api: TestClient) -> None:
    deep = await api.put("/v1/queues/deep", data=nested(33))
    at_limit = await api.put("/v1/queues/deep", data=nested(32))

    assert deep.status == 400
    error = (await deep.json())["error"]
    assert error["code"] == "json_too_deep"
    assert error["limit"] == 32
    # Refused for what it says, not for how deep it is.
    assert (await at_limit.json())["error"]["code"] != "json_too_deep"


@pytest.mark.parametrize(
    ("body", "depth"),
    [
        (b"1", 0),
        (b"[]", 1),
        (b'{"a": [1, {"b": []}]}', 4),
        (b'{"a": "[[[[[[[[[[[["}', 1),  # brackets in strings do not count
        (b'{"a": "]]]]]]", "b": [[["["]]]}', 4),
        (b"[[1], [[2]], [[[3]]]]", 4),
    ],
)
def test_nesting_is_measured_exactly(body: bytes, depth: int) -> None:
    value = orjson.loads(body)

    assert nesting(value, 32) == depth
    assert shallow_enough(body, depth) or b'"' in body
    if depth:
        assert nesting(value, depth - 1) == depth  # counts one past the limit, then stops
        # The byte pre-check never calls a body shallow when it is deeper than the limit.
        assert not shallow_enough(body, depth - 1)


def test_the_precheck_passes_a_large_produce_body_without_walking_it() -> None:
    body = orjson.dumps({"messages": [{"data": f"m{i}", "headers": {"k": "v"}} for i in range(10_000)]})

    assert shallow_enough(body, 32)
    assert nesting(orjson.loads(body), 32) == 4


# --- the connection cap ----------------------------------------------------------------


async def open_served(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A keep-alive connection that has been answered 200 (retried while a closed one is released)."""
    served: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def answered() -> bool:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request_bytes())
        if (await read_answer(reader)).status == 200:
            served.append((reader, writer))
            return True
        writer.close()
        return False

    await until(answered, within=5.0, every=0.1, what="a connection accepted")
    return served[0]


async def open_busy(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A served connection with the next request head begun: busy, so it is not idle (idle
    keep-alive connections give way to new ones once the server runs low on slots)."""
    reader, writer = await open_served(port)
    writer.write(b"GET /healthz HTTP/1.1\r\n")
    await writer.drain()
    return reader, writer


async def finish_head(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> Answer:
    """The answer to the head ``open_busy`` began."""
    writer.write(b"Host: 127.0.0.1\r\n\r\n")
    return await read_answer(reader)


async def test_a_connection_over_max_connections_gets_503_json(limited_server: ServerProcess) -> None:
    port = limited_server.port
    held = [await open_busy(port) for _ in range(20)]
    try:
        refused = await exchange(port, request_bytes())
        async with AsyncClient(limited_server.url) as client:
            with pytest.raises(TooManyConnections):
                await client.queues()
        # The held ones are still served.
        assert (await finish_head(*held[0])).status == 200
        held[0][1].write(b"GET /healthz HTTP/1.1\r\n")  # busy again

        for _, writer in held[:5]:
            writer.close()
        held = held[5:]
        held += [await open_busy(port) for _ in range(5)]
        again = await exchange(port, request_bytes())
    finally:
        for _, writer in held:
            writer.close()

    assert refused.status == 503
    assert refused.headers["connection"] == "close"
    error = refused.error()
    assert error["code"] == "too_many_connections"
    assert error["limit"] == 20
    assert again.status == 503
    assert "connections refused" in limited_server.log()


async def test_refusals_past_a_second_max_connections_are_closed_at_once(
    limited_server: ServerProcess,
) -> None:
    port = limited_server.port

    async def reset_by_server(writer: asyncio.StreamWriter, reader: asyncio.StreamReader) -> bool:
        # A lingering refusal reads and discards; a closed socket answers a write with a reset.
        async def reset() -> bool:
            try:
                writer.write(b"x")
                await writer.drain()
            except ConnectionError:
                return True
            return reader.exception() is not None

        # A second: for the lingering one, the time in which no reset may come.
        return await eventually(reset, within=1.0, every=0.05)

    held = [await open_busy(port) for _ in range(20)]
    refused: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        for _ in range(21):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            refused.append((reader, writer))
            assert (await read_answer(reader)).status == 503
        lingering, flooded = await asyncio.gather(
            reset_by_server(refused[-2][1], refused[-2][0]), reset_by_server(refused[-1][1], refused[-1][0])
        )
    finally:
        for _, writer in held + refused:
            writer.close()

    assert not lingering
    assert flooded


# --- TLS -------------------------------------------------------------------------------


async def test_a_client_with_the_ca_talks_https(tls_server: ServerProcess, pki: Pki) -> None:
    async with AsyncClient(tls_server.url, ssl=pki.client_context()) as client:
        await client.put_queue("tls")
        await client.produce("tls", [{"data": "over TLS"}])
        answer = await client.read("tls", after=0)

    assert [m.data for m in answer.messages] == ["over TLS"]
    assert f"url=https://127.0.0.1:{tls_server.port}" in tls_server.log()


async def test_a_client_without_the_ca_fails_cleanly_and_the_server_survives(
    tls_server: ServerProcess, pki: Pki
) -> None:
    async with AsyncClient(tls_server.url, timeout=5.0) as client:
        with pytest.raises(Unreachable, match=r"(?i)certificate verify failed"):
            await client.queues()
    async with AsyncClient(tls_server.url, ssl=pki.client_context()) as client:
        assert await client.ready()


async def test_plain_http_on_the_tls_port_is_dropped(tls_server: ServerProcess, pki: Pki) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", tls_server.port)
    try:
        writer.write(request_bytes())
        received = await closed_within(reader, SLACK)
    finally:
        writer.close()

    assert not received.startswith(b"HTTP/")
    async with AsyncClient(tls_server.url, ssl=pki.client_context()) as client:
        assert await client.ready()


async def test_a_tls_handshake_must_finish_within_the_head_deadline(tls_server: ServerProcess) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", tls_server.port)
    started = time.monotonic()
    try:
        await closed_within(reader, HEADER_TIMEOUT + SLACK)
    finally:
        writer.close()

    assert HEADER_TIMEOUT - 0.1 <= time.monotonic() - started <= HEADER_TIMEOUT + SLACK


def test_the_server_context_refuses_tls_below_1_2(pki: Pki) -> None:
    context = ssl_context(TlsSettings(pki.server_cert, pki.server_key))

    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert context.verify_mode == ssl.CERT_NONE


async def test_a_cluster_reaches_a_tls_cluster_with_its_ca_file(tls_server: ServerProcess, pki: Pki) -> None:
    async with AsyncClient(tls_server.url, ssl=pki.client_context()) as client:
        # The server is its own external cluster: with the CA the far side is reached over TLS and answers
        # its name, which is this cluster's, so the cluster is refused (a same-named cluster).
        with pytest.raises(SameClusterName):
            await client.put_cluster("self-tls", url=tls_server.url, ca_file=str(pki.ca))
        # Without the CA the name cannot be asked: the cluster is kept, and its ping says why.
        await client.put_cluster("self-no-ca", url=tls_server.url, connect_timeout=2, timeout=5)
        without_ca = await client.ping_cluster("self-no-ca")

    assert without_ca.ok is False
    assert without_ca.error.code == "unreachable"
    assert "certificate verify failed" in without_ca.error.message.lower()


# --- mutual TLS ------------------------------------------------------------------------


async def test_mutual_tls_accepts_a_client_certificate_from_the_ca(
    mtls_server: ServerProcess, pki: Pki
) -> None:
    async with AsyncClient(mtls_server.url, ssl=pki.client_context(cert="alice")) as client:
        await client.put_queue("mtls")
        assert await client.queues()


@pytest.mark.parametrize("cert", [None, "mallory"], ids=["no-certificate", "another-ca"])
async def test_mutual_tls_refuses_a_client_without_a_good_certificate(
    mtls_server: ServerProcess, pki: Pki, cert: str | None
) -> None:
    async with AsyncClient(mtls_server.url, ssl=pki.client_context(cert=cert), timeout=5.0) as client:
        with pytest.raises(Unreachable):
            await client.queues()
    async with AsyncClient(mtls_server.url, ssl=pki.client_context(cert="alice")) as client:
        assert await client.ready()


@contextlib.asynccontextmanager
async def serving(
    cluster: Cluster,
    supervisor: Supervisor,
    settings: ServerSettings,
    route: Handler | None = None,
    authenticator: Authenticator | None = None,
) -> AsyncIterator[str]:
    """The app in this process behind the server's own ``listen``; yields its https:// URL."""
    guard = ConnectionGuard(settings)
    app = create_app(cluster, settings, supervisor, authenticator=authenticator, guard=guard)
    if route is not None:
        app.router.add_get("/test/route", route)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    try:
        site = await listen(runner, settings, guard)
        yield f"https://127.0.0.1:{site.port}"
    finally:
        await runner.cleanup()
        guard.close()


async def test_the_client_certificate_reaches_the_app(
    cluster: Cluster, supervisor: Supervisor, pki: Pki
) -> None:
    async def peer(request: web.Request) -> web.Response:
        assert request.transport is not None
        cert = request.transport.get_extra_info("peercert")
        subject = dict(item[0] for item in cert["subject"])
        return web.json_response({"cn": subject["commonName"]})

    settings = ServerSettings(listen="127.0.0.1:0", tls=TlsSettings(pki.server_cert, pki.server_key, pki.ca))
    async with (
        serving(cluster, supervisor, settings, peer) as url,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=pki.client_context(cert="alice"))) as http,
        http.get(f"{url}/test/route") as resp,
    ):
        assert resp.status == 200
        assert await resp.json() == {"cn": "alice"}


async def test_a_client_certificate_signs_in_as_the_user_it_names(
    cluster: Cluster, supervisor: Supervisor, pki: Pki, tmp_path: Path
) -> None:
    users = AuthStore(tmp_path / "auth")
    users.add_user("root", "root-password", admin=True)
    users.add_user("alice", "alice-password", rules=(AccessRule.parse("allow:queue:read:*"),))
    authenticator = Authenticator(users, AuthSettings(enabled=True, tls_client_users=True))
    settings = ServerSettings(listen="127.0.0.1:0", tls=TlsSettings(pki.server_cert, pki.server_key, pki.ca))
    async with serving(cluster, supervisor, settings, authenticator=authenticator) as url:
        async with AsyncClient(url, ssl=pki.client_context(cert="alice")) as alice:
            assert (await alice.me()).user == "alice"
            assert (await alice.me()).via == "tls"
            with pytest.raises(Forbidden):
                await alice.put_queue("not-allowed")
        # Credentials in the request win over the certificate.
        async with AsyncClient(
            url, ssl=pki.client_context(cert="alice"), username="root", password="root-password"
        ) as root:
            assert (await root.me()).user == "root"
        users.put_user("alice", {"enabled": False})
        async with AsyncClient(url, ssl=pki.client_context(cert="alice")) as alice:
            with pytest.raises(Unauthorized):
                await alice.me()


async def test_a_client_certificate_is_not_a_sign_in_unless_configured(
    cluster: Cluster, supervisor: Supervisor, pki: Pki, tmp_path: Path
) -> None:
    users = AuthStore(tmp_path / "auth")
    users.add_user("alice", "alice-password", admin=True)
    authenticator = Authenticator(users, AuthSettings(enabled=True))
    settings = ServerSettings(listen="127.0.0.1:0", tls=TlsSettings(pki.server_cert, pki.server_key, pki.ca))
    async with (
        serving(cluster, supervisor, settings, authenticator=authenticator) as url,
        AsyncClient(url, ssl=pki.client_context(cert="alice")) as alice,
    ):
        with pytest.raises(Unauthorized):
            await alice.me()


async def test_a_tls_connection_over_max_connections_gets_503_json(
    cluster: Cluster, supervisor: Supervisor, pki: Pki
) -> None:
    settings = ServerSettings(
        listen="127.0.0.1:0", max_connections=1, tls=TlsSettings(pki.server_cert, pki.server_key)
    )
    async with (
        serving(cluster, supervisor, settings) as url,
        AsyncClient(url, ssl=pki.client_context()) as other,
    ):
        port = int(url.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=pki.client_context())
        try:
            writer.write(b"GET /healthz HTTP/1.1\r\n")  # holds the one connection, busy with a head
            await writer.drain()
            with pytest.raises(TooManyConnections):
                await other.health()
            writer.write(b"Host: 127.0.0.1\r\nConnection: close\r\n\r\n")
            assert (await read_answer(reader)).status == 200
        finally:
            writer.close()


# --- bad TLS files stop the server -----------------------------------------------------


def test_a_key_that_does_not_match_the_certificate_is_refused(pki: Pki) -> None:
    with pytest.raises(InvalidConfig, match=r"(?i)key values mismatch"):
        ssl_context(TlsSettings(pki.server_cert, pki.client_key))


def test_an_encrypted_key_is_refused_without_a_prompt(pki: Pki) -> None:
    with pytest.raises(InvalidConfig, match="key_file is encrypted"):
        ssl_context(TlsSettings(pki.server_cert, pki.encrypted_key))


def test_a_certificate_file_that_is_not_pem_is_refused(pki: Pki, tmp_path: Path) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")

    with pytest.raises(InvalidConfig, match="cannot use cert_file"):
        ssl_context(TlsSettings(junk, pki.server_key))


def test_a_client_ca_file_without_a_certificate_is_refused(pki: Pki, tmp_path: Path) -> None:
    empty = tmp_path / "empty.pem"
    empty.write_text("")

    with pytest.raises(InvalidConfig, match=r"client_ca_file .* cannot be used"):
        ssl_context(TlsSettings(pki.server_cert, pki.server_key, empty))


def test_capella_serve_stops_with_a_clear_message_on_a_bad_key(pki: Pki, tmp_path: Path) -> None:
    tls = f'cert_file = "{pki.server_cert}"\nkey_file = "{pki.client_key}"\n'
    config = write_config(tmp_path / "capella.toml", 'listen = "127.0.0.1:0"', tls)
    command = [sys.executable, "-m", "capella", "serve", "--config", str(config)]
    done = subprocess.run(
        [*command, "--data-dir", str(tmp_path / "data")],
        capture_output=True,
        text=True,
        timeout=SERVER_START_TIMEOUT,
        check=False,
    )

    assert done.returncode == 2, done.stderr
    assert "capella: server.tls: cannot use cert_file" in done.stderr
