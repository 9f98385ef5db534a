"""kill -9 a real ``capella serve`` while it relays an outbox table and while it fills an inbox.

After the restart each committed row must be in the queue exactly once, and each message in
the inbox table exactly once, byte for byte. The outbox handler connects with a password in
its DSN: the API, the log and the data directory must never show it in clear, and the
restarted server must still connect (the password comes back decrypted with its key).
"""

from __future__ import annotations

import asyncio
import base64
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
from support.http import read_all
from support.pg import PASSWORD, PASSWORD_ROLE, PgServer, fresh_database
from support.servers import ServerProcess
from support.wait import eventually

from capella.handlers.pg_inbox import inbox_ddl
from capella.handlers.pg_outbox import outbox_ddl

pytestmark = pytest.mark.slow

ROWS = 20_000


async def start(data_dir: Path, port: int | None = None, queue: str | None = None) -> ServerProcess:
    """A server on ``data_dir`` once it is ready, with an empty ``queue`` made if one is named."""
    server = ServerProcess(data_dir, port)
    await asyncio.to_thread(server.wait_ready)
    if queue is not None:
        async with (
            aiohttp.ClientSession() as session,
            session.put(f"{server.url}/v1/queues/{queue}", json={}) as resp,
        ):
            assert resp.status == 201
    return server


async def rows(conn: asyncpg.Connection, table: str) -> int:
    count: int = await conn.fetchval(f"SELECT count(*) FROM {table}")
    return count


async def rows_come_to(
    conn: asyncpg.Connection, table: str, where: Callable[[int], bool], within: float
) -> bool:
    """Whether ``table``'s row count comes to one ``where`` holds for within ``within`` seconds."""

    async def there() -> bool:
        return where(await rows(conn, table))

    return await eventually(there, within)


async def killed_and_restarted(
    server: ServerProcess, data_dir: Path, conn: asyncpg.Connection, table: str
) -> tuple[ServerProcess, int]:
    """kill -9 ``server`` and start it again on its port: the new process, and ``table``'s row
    count at the kill."""
    server.kill()
    count = await rows(conn, table)
    return await start(data_dir, server.port), count


def payload(message: dict[str, Any]) -> bytes:
    if "data_b64" in message:
        return base64.b64decode(message["data_b64"])
    return str(message["data"]).encode()


async def handler_status(session: aiohttp.ClientSession, url: str, name: str) -> dict[str, Any]:
    async with session.get(f"{url}/v1/handlers/{name}") as resp:
        answer: dict[str, Any] = await resp.json()
        return answer


async def test_kill_9_mid_relay_leaves_each_committed_row_once_in_the_queue(
    tmp_path: Path, pg_server: PgServer
) -> None:
    database = f"t{uuid.uuid4().hex[:12]}"
    async with fresh_database(pg_server, database) as (_, conn):
        await conn.execute(outbox_ddl(notify=True))
        payloads = [os.urandom(1 + i % 97) for i in range(ROWS)]
        ids = await conn.fetch(
            "INSERT INTO capella_outbox (data) SELECT unnest($1::bytea[]) RETURNING id", payloads
        )
        committed = sorted((r["id"], p) for r, p in zip(ids, payloads, strict=True))
        secret_dsn = f"postgresql://{PASSWORD_ROLE}:{PASSWORD}@127.0.0.1:{pg_server.port}/{database}"
        data_dir = tmp_path / "data"
        server = await start(data_dir, queue="orders")
        async with aiohttp.ClientSession() as session:
            url = server.url
            definition = {"type": "pg_outbox", "params": {"to": "orders", "dsn": secret_dsn, "batch": 20}}
            async with session.put(f"{url}/v1/handlers/relay", json=definition) as resp:
                assert resp.status == 201, await resp.text()
                assert PASSWORD not in await resp.text()

            assert await rows_come_to(conn, "capella_outbox", lambda n: n < ROWS, 30)
            server, left = await killed_and_restarted(server, data_dir, conn, "capella_outbox")
            try:
                assert 0 < left < ROWS, "the kill must come in the middle of the relay"
                assert await rows_come_to(conn, "capella_outbox", lambda n: n == 0, 60)
                queued = await read_all(session, f"{url}/v1/queues/orders", limit=5000)
                got = sorted((m["external_id"], payload(m)) for m in queued)
                assert len(got) == len({i for i, _ in got}), "a row is in the queue twice"
                assert got == committed
                assert {m["source"] for m in queued} == {f"pg:{database}.capella_outbox"}
                shown = await handler_status(session, url, "relay")
                assert shown["params"]["password"] == "stored encrypted"
                assert PASSWORD not in str(shown)
                async with session.get(f"{url}/metrics") as resp:
                    metrics = await resp.text()
                assert 'capella_handler_items_total{handler="relay",type="pg_outbox"}' in metrics
            finally:
                server.stop()
        assert PASSWORD not in server.log_path.read_text(errors="replace")
        for path in data_dir.rglob("*"):
            if path.is_file():
                assert PASSWORD.encode() not in path.read_bytes(), path


async def test_kill_9_mid_inbox_copy_leaves_each_message_once_in_the_table(
    tmp_path: Path, pg_server: PgServer
) -> None:
    async with fresh_database(pg_server) as (dsn, conn):
        await conn.execute(inbox_ddl())
        data_dir = tmp_path / "data"
        server = await start(data_dir, queue="events")
        async with aiohttp.ClientSession() as session:
            url = server.url
            for start_at in range(0, ROWS, 2000):
                batch = [
                    {
                        "data_b64": base64.b64encode(os.urandom(1 + i % 89)).decode(),
                        "source": f"dc{i % 2}",
                        "external_id": i,
                        "segment": i % 3,
                    }
                    for i in range(start_at, start_at + 2000)
                ]
                async with session.post(
                    f"{url}/v1/queues/events/messages?save=wait", json={"messages": batch}
                ) as resp:
                    assert resp.status == 200, await resp.text()
            definition = {"type": "pg_inbox", "queue": "events", "params": {"dsn": dsn, "batch": 50}}
            async with session.put(f"{url}/v1/handlers/inbox", json=definition) as resp:
                assert resp.status == 201, await resp.text()

            assert await rows_come_to(conn, "capella_inbox", bool, 30)
            server, inserted = await killed_and_restarted(server, data_dir, conn, "capella_inbox")
            try:
                assert 0 < inserted < ROWS, "the kill must come in the middle of the copy"
                assert await rows_come_to(conn, "capella_inbox", lambda n: n >= ROWS, 60)
                queued = await read_all(session, f"{url}/v1/queues/events", limit=5000)
            finally:
                server.stop()
        rows = await conn.fetch(
            "SELECT source, external_id, id, data, segment FROM capella_inbox ORDER BY id"
        )
        assert [tuple(r) for r in rows] == [
            (m["source"], m["external_id"], m["id"], payload(m), m["segment"]) for m in queued
        ]
