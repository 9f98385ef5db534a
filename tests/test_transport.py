"""Transport hardening against real servers on 127.0.0.1: the connection guard (the connection
cap and the request-head deadline that defeats slowloris), header limits and the JSON nesting
limit.

Servers are real ``capella serve`` processes, one per configuration and module. Every wait
is bounded: raw sockets read with a timeout and give up after a fixed number of tries.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient
from conftest import ServerProcess

from capella.api.request import nesting, shallow_enough
from capella.client import AsyncClient
from capella.errors import HeadersTooLarge, TooManyConnections

pytestmark = pytest.mark.slow

HEADER_TIMEOUT = 1.5
# A loaded CI machine (2 cores, several test runs) may add this much to any deadline.
SLACK = 2.0
READ_TIMEOUT = 10.0


# --- servers ---------------------------------------------------------------------------


def write_config(path: Path, server: str, tls: str = "") -> Path:
    tls_table = f"\n[server.tls]\n{tls}\n" if tls else ""
    path.write_text(
        f'[cluster]\nname = "transport"\n\n[server]\n{server}\n{tls_table}\n'
        '[mounts.default]\nprovider = "memory"\n'
    )
    return path


def _started(server: ServerProcess) -> Iterator[ServerProcess]:
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def plain_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Plain HTTP, a short head deadline and small header limits."""
    root = tmp_path_factory.mktemp("plain")
    config = write_config(
        root / "capella.toml",
        f'header_timeout = "{HEADER_TIMEOUT}s"\nmax_header_size = "2KiB"\nmax_headers = 20\n',
    )
    yield from _started(ServerProcess(root / "data", config=config))


@pytest.fixture(scope="module")
def limited_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """At most 20 connections; a long head deadline so idle connections stay."""
    root = tmp_path_factory.mktemp("limited")
    config = write_config(root / "capella.toml", 'max_connections = 20\nheader_timeout = "60s"\n')
    yield from _started(ServerProcess(root / "data", config=config))


# --- raw HTTP --------------------------------------------------------------------------


def request_bytes(path: str = "/healthz", *, close: bool = False, extra: str = "") -> bytes:
    connection = "close" if close else "keep-alive"
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: {connection}\r\n{extra}\r\n".encode()


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def error(self) -> dict[str, Any]:
        assert self.headers["content-type"].startswith("application/json"), self.headers
        error: dict[str, Any] = orjson.loads(self.body)["error"]
        return error


async def read_answer(reader: asyncio.StreamReader) -> Answer:
    """One HTTP/1.1 response with a Content-Length, read within ``READ_TIMEOUT``."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT)
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    body = await asyncio.wait_for(reader.readexactly(int(headers.get("content-length", "0"))), READ_TIMEOUT)
    return Answer(int(status_line.split()[1]), headers, body)


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
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        opened = time.monotonic()
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
            await asyncio.sleep(0.01)
        closes = await asyncio.wait_for(asyncio.gather(*attack), HEADER_TIMEOUT + SLACK + 20)
        await client.put_queue("slowloris-after")  # the server still serves

    after = sorted(seconds for seconds, _ in closes)
    timed_out = [data for _, data in closes if data.startswith(b"HTTP/1.1 408 ")]
    latencies.sort()
    print(
        f"\nslowloris: 200 slow connections closed after {after[0]:.2f}-{after[-1]:.2f} s "
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
        await asyncio.sleep(0.5)
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

    assert answer["messages"] == []
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


async def open_served(port: int, attempts: int = 50) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A keep-alive connection that has been answered 200 (retried while a closed one is released)."""
    for _ in range(attempts):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request_bytes())
        answer = await read_answer(reader)
        if answer.status == 200:
            return reader, writer
        writer.close()
        await asyncio.sleep(0.1)
    raise AssertionError(f"no connection accepted after {attempts} attempts")


async def test_a_connection_over_max_connections_gets_503_json(limited_server: ServerProcess) -> None:
    port = limited_server.port
    held = [await open_served(port) for _ in range(20)]
    try:
        refused = await exchange(port, request_bytes())
        async with AsyncClient(limited_server.url) as client:
            with pytest.raises(TooManyConnections):
                await client.queues()
        # The held ones are still served.
        reader, writer = held[0]
        writer.write(request_bytes())
        assert (await read_answer(reader)).status == 200

        for _, writer in held[:5]:
            writer.close()
        held = held[5:]
        held += [await open_served(port) for _ in range(5)]
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
        for _ in range(20):
            try:
                writer.write(b"x")
                await writer.drain()
            except ConnectionError:
                return True
            await asyncio.sleep(0.05)
            if reader.exception() is not None:
                return True
        return False

    held = [await open_served(port) for _ in range(20)]
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
