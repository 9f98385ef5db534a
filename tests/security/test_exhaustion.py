"""Resource exhaustion by strangers and by one user, against a real server with small limits.

Nothing expensive happens before sign-in: a ``POST /cluster`` body (its credentials are inside
it) is read and decompressed only up to ``[compat] max_read_before_sign_in`` before its sender
is signed in. Connections are capped per client address, idle keep-alive connections give way
when slots run low, request bodies in flight are capped per address and SSE streams per user:
after an attacker fills what it can from one or a few addresses, an admin from another
address is still served.

The attackers connect from loopback aliases (127.0.0.2 and up: Linux routes all of
127.0.0.0/8 to lo), by binding their sockets' source address. Every loop is bounded, every
read has a timeout, and waits poll (``support.wait``).
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from support.http import read_answer as read_raw_answer
from support.http import read_head
from support.original import envelope
from support.wait import until

from .conftest import ADMIN_PASSWORD, DEV_PASSWORD, Secured, StartSecured

pytestmark = pytest.mark.slow

MAX_CONNECTIONS = 12
PER_ADDRESS = 4
IDLE_PER_ADDRESS = 2
BODIES_PER_ADDRESS = 2
STREAMS_PER_USER = 2
BEFORE_SIGN_IN = 16 * 1024
LIMITS = f"""
[server]
max_connections = {MAX_CONNECTIONS}
max_connections_per_address = {PER_ADDRESS}
max_idle_per_address = {IDLE_PER_ADDRESS}
max_bodies_per_address = {BODIES_PER_ADDRESS}
max_streams_per_user = {STREAMS_PER_USER}
header_timeout = "30s"
body_timeout = "30s"

[compat]
original = true
max_read_before_sign_in = "{BEFORE_SIGN_IN // 1024}KiB"
"""
READ_TIMEOUT = 5.0
MiB = 1024 * 1024

Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@pytest.fixture
def limited(start_secured: StartSecured) -> Secured:
    return start_secured(LIMITS)


def basic(user: str) -> str:
    password = ADMIN_PASSWORD if user == "admin" else DEV_PASSWORD
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def port_of(secured: Secured) -> int:
    return int(secured.url.rsplit(":", 1)[1])


def rss_kib(secured: Secured) -> int:
    """The server process's resident memory (VmRSS), in KiB."""
    for line in Path(f"/proc/{secured.server.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS line")


async def connect(secured: Secured, source: str) -> Stream:
    return await asyncio.open_connection("127.0.0.1", port_of(secured), local_addr=(source, 0))


def head(method: str, path: str, *, user: str | None = None, extra: str = "", close: bool = False) -> bytes:
    lines = [
        f"{method} {path} HTTP/1.1",
        "Host: 127.0.0.1",
        f"Connection: {'close' if close else 'keep-alive'}",
    ]
    if user is not None:
        lines.append(f"Authorization: {basic(user)}")
    return ("\r\n".join(lines) + "\r\n" + extra + "\r\n").encode()


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One response with a Content-Length, within ``READ_TIMEOUT``: status, headers, body."""
    answer = await read_raw_answer(reader, READ_TIMEOUT)
    return answer.status, answer.headers, answer.body


async def closed(reader: asyncio.StreamReader) -> bool:
    """Whether the server has closed the connection (EOF or reset), within ``READ_TIMEOUT``."""
    try:
        return await asyncio.wait_for(reader.read(65536), READ_TIMEOUT) == b""
    except ConnectionError:
        return True
    except TimeoutError:
        return False


@asynccontextmanager
async def opened() -> AsyncIterator[list[Stream]]:
    """A list to put connections in; all closed on the way out."""
    streams: list[Stream] = []
    try:
        yield streams
    finally:
        for _, writer in streams:
            writer.close()


async def served_idle(secured: Secured, source: str) -> Stream | None:
    """A keep-alive connection from ``source`` answered once and then left idle; None if refused."""
    reader, writer = await connect(secured, source)
    writer.write(head("GET", "/healthz"))
    status, _, _ = await read_answer(reader)
    if status != 200:
        writer.close()
        return None
    return reader, writer


def admin_is_served(secured: Secured, source: str) -> Any:
    async def check() -> tuple[int, bytes]:
        reader, writer = await connect(secured, source)
        try:
            writer.write(head("GET", "/v1/me", user="admin", close=True))
            status, _, body = await read_answer(reader)
            return status, body
        finally:
            writer.close()

    return check()


def cluster_call(secured: Secured, data: bytes, compress: str = "") -> dict[str, Any]:
    answer = secured.call("POST", "/cluster", user=None, data=data, headers={"Compress-Type": compress})
    assert answer.status == 200, answer.body
    responce: dict[str, Any] = answer.body["responce"]
    return responce


# --- bodies before sign-in -----------------------------------------------------------------------


async def test_large_anonymous_cluster_bodies_are_refused_early_and_cost_no_memory(limited: Secured) -> None:
    # Eight strangers, each from its own address, announce 15 MiB and send all but the last
    # byte: a valid-looking head with a wrong password, then padding. Before, the server read
    # (and kept) all of it: eight such bodies took its RSS from 75 to 230 MB.
    size = 15 * MiB
    prefix = json.dumps(envelope("q_add", user="admin", password="wrong"))[:-2].encode() + b',"body":"'
    filler = b"a" * (256 * 1024)
    before = rss_kib(limited)
    answers: list[tuple[int, bytes]] = []
    async with opened() as streams:
        for i in range(8):
            reader, writer = await connect(limited, f"127.0.0.{10 + i}")
            streams.append((reader, writer))
            writer.write(
                head("POST", "/cluster", extra=f"Content-Length: {size}\r\nCompress-Type: \r\n") + prefix
            )
            sent = len(prefix)
            for _ in range(size // len(filler)):  # bounded: 60 chunks
                piece = filler[: size - 1 - sent]
                if not piece:
                    break
                try:
                    writer.write(piece)
                    await asyncio.wait_for(writer.drain(), 1.0)
                except (ConnectionError, TimeoutError):
                    break  # the server stopped reading: refused
                sent += len(piece)
        grown = rss_kib(limited) - before
        print(f"\nRSS {before} KiB, after 8 stalled anonymous 15 MiB /cluster bodies: +{grown} KiB")
        for reader, _ in streams:
            status, _, body = await read_answer(reader)
            answers.append((status, body))
            assert await closed(reader)  # refused with its body unread: nothing more can follow

    for status, body in answers:
        assert status == 200  # the original's clients read every answer as HTTP 200
        error = json.loads(body)["responce"]["error"]
        assert error["code"] == 10300903  # the wrong password, found from the head alone
    assert grown < 8 * 1024


def test_a_gzip_bomb_is_refused_before_sign_in(limited: Secured) -> None:
    bomb = gzip.compress(
        json.dumps(envelope("ping", user="admin", password="wrong"))[:-2].encode()
        + b',"body":"'
        + b"a" * (64 * MiB)
        + b'"}}'
    )
    before = rss_kib(limited)
    started = time.monotonic()

    responce = cluster_call(limited, bomb, "gzip")

    # Signed in from the head (the first 16 KiB of text): the wrong password, nothing inflated further.
    assert responce["error"]["code"] == 10300903
    assert time.monotonic() - started < 2.0
    assert rss_kib(limited) - before < 4 * 1024


def test_a_signed_in_users_large_envelope_is_read_after_sign_in(limited: Secured) -> None:
    limited.call("PUT", "/v1/queues/big", {}, user="admin")
    payload = base64.b64encode(b"x" * (200 * 1024)).decode()  # 270 KB of envelope: past the 16 KiB
    sent = envelope(
        "q_add", {"msg": {"msg": payload}, "sm": 1}, user="admin", password=ADMIN_PASSWORD, object_name="big"
    )
    plain = cluster_call(limited, json.dumps(sent).encode())
    zipped = cluster_call(limited, gzip.compress(json.dumps(sent).encode()), "gzip")

    assert plain["error"] is None and zipped["error"] is None
    read = limited.call("GET", "/v1/queues/big/messages?after=0", user="admin")
    assert [len(m["data"]) for m in read.body["messages"]] == [200 * 1024] * 2


def test_a_large_envelope_must_name_its_sender_first_and_once(limited: Secured) -> None:
    padding = "p" * (BEFORE_SIGN_IN * 2)
    sent = envelope("ping", {"pad": padding}, user="admin", password=ADMIN_PASSWORD)
    late = {"request": sent.pop("request"), **sent}  # credentials after the request
    twice = json.dumps(sent)[:-1] + f', "request": {json.dumps(late["request"])}, "user_name": "dev"}}'

    assert cluster_call(limited, json.dumps(late).encode())["error"]["code"] == 10120103
    assert "max_read_before_sign_in" in cluster_call(limited, json.dumps(late).encode())["error"]["iet"]
    assert cluster_call(limited, twice.encode())["error"]["code"] == 10120103
    # A small one is read whole before sign-in, in any order (as the original reads it).
    small = envelope("ping", user="admin", password=ADMIN_PASSWORD)
    assert (
        cluster_call(limited, json.dumps({"request": small.pop("request"), **small}).encode())["error"]
        is None
    )


# --- connections per address ---------------------------------------------------------------------


async def test_idle_keepalive_connections_from_one_address_cannot_keep_another_out(limited: Secured) -> None:
    async with opened() as streams:
        for _ in range(MAX_CONNECTIONS):  # all the server holds, if it let one address have them
            stream = await served_idle(limited, "127.0.0.2")
            if stream is not None:
                streams.append(stream)
        open_now = [s for s in streams if not s[0].at_eof()]
        status, _ = await admin_is_served(limited, "127.0.0.3")

    assert status == 200
    assert len(open_now) <= PER_ADDRESS


async def test_idle_connections_from_several_addresses_give_way_to_a_new_one(limited: Secured) -> None:
    # Six addresses, two idle keep-alive connections each: every slot the server has.
    async with opened() as streams:
        for i in range(MAX_CONNECTIONS):
            stream = await served_idle(limited, f"127.0.0.{2 + i % 6}")
            assert stream is not None
            streams.append(stream)
        for _ in range(3):  # and a few times over: each new one closes the longest idle one
            status, _ = await admin_is_served(limited, "127.0.0.50")
            assert status == 200
        assert await closed(streams[0][0])  # the first (longest idle) gave way


async def test_more_connections_than_the_cap_from_one_address_are_refused(limited: Secured) -> None:
    async with opened() as streams:
        for _ in range(PER_ADDRESS):  # busy: each has begun a request head
            reader, writer = await connect(limited, "127.0.0.2")
            writer.write(b"GET /healthz HTTP/1.1\r\n")
            streams.append((reader, writer))
        reader, writer = await connect(limited, "127.0.0.2")
        streams.append((reader, writer))
        writer.write(head("GET", "/healthz"))
        status, headers, body = await read_answer(reader)
        other, _ = await admin_is_served(limited, "127.0.0.3")
        # The held ones are still served.
        held_reader, held_writer = streams[0]
        held_writer.write(b"Host: 127.0.0.1\r\n\r\n")
        held, _, _ = await read_answer(held_reader)

    assert status == 503
    assert headers["connection"] == "close"
    error = json.loads(body)["error"]
    assert error["code"] == "too_many_connections_from_address"
    assert error["limit"] == PER_ADDRESS
    assert other == 200
    assert held == 200
    assert "over max_connections_per_address" in limited.server.log()


async def test_bodies_in_flight_from_one_address_are_capped(limited: Secured) -> None:
    async with opened() as streams:
        for _ in range(BODIES_PER_ADDRESS):  # each sends a part of its body, then waits
            reader, writer = await connect(limited, "127.0.0.2")
            writer.write(head("POST", "/cluster", extra="Content-Length: 1000\r\n") + b'{"auth_type"')
            streams.append((reader, writer))
        # A request answered from another address: the server has read the heads sent before.
        assert (await admin_is_served(limited, "127.0.0.3"))[0] == 200
        reader, writer = await connect(limited, "127.0.0.2")
        streams.append((reader, writer))
        writer.write(head("POST", "/cluster", extra="Content-Length: 1000\r\n") + b'{"auth_type"')
        status, headers, body = await read_answer(reader)
        refused_closed = await closed(reader)
        other, _ = await admin_is_served(limited, "127.0.0.3")

    assert status == 429
    assert headers["retry-after"] == "1"
    assert json.loads(body)["error"]["code"] == "too_many_bodies"
    assert refused_closed
    assert other == 200


# --- streams per user ----------------------------------------------------------------------------


async def open_stream(secured: Secured, source: str, user: str) -> tuple[Stream, int, dict[str, str], bytes]:
    reader, writer = await connect(secured, source)
    writer.write(head("GET", "/v1/queues/dev-q/stream", user=user))
    status, headers = await read_head(reader, READ_TIMEOUT)
    body = b""
    if "content-length" in headers:
        body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), READ_TIMEOUT)
    return (reader, writer), status, headers, body


async def test_sse_streams_over_the_per_user_cap_are_refused_and_the_admin_is_served(
    limited: Secured,
) -> None:
    assert limited.call("PUT", "/v1/queues/dev-q", {}, user="admin").status in (200, 201)
    async with opened() as streams:
        for i in range(STREAMS_PER_USER):  # from two addresses: the cap is the user's, not the address's
            stream, status, headers, _ = await open_stream(limited, f"127.0.0.{2 + i}", "dev")
            streams.append(stream)
            assert status == 200 and headers["content-type"] == "text/event-stream"
        stream, status, headers, body = await open_stream(limited, "127.0.0.4", "dev")
        streams.append(stream)
        admin, admin_status, admin_headers, _ = await open_stream(limited, "127.0.0.5", "admin")
        streams.append(admin)

        # One of dev's streams ends: dev may open another once the server has seen it go (at
        # its next write: a message here, else the heartbeat).
        streams[0][1].close()

        async def reopened() -> bool:
            limited.call("POST", "/v1/queues/dev-q/messages", {"messages": [{"data": "wake"}]})
            stream, status, _, _ = await open_stream(limited, "127.0.0.6", "dev")
            streams.append(stream)
            return status == 200

        await until(reopened, within=5.0, every=0.1, what="dev's stream after one closed")

    assert status == 429
    assert headers["retry-after"] == "5"
    error = json.loads(body)["error"]
    assert error["code"] == "too_many_streams"
    assert error["limit"] == STREAMS_PER_USER
    assert admin_status == 200 and admin_headers["content-type"] == "text/event-stream"
