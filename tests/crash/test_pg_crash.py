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
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
from support.http import read_all
from support.pg import PASSWORD, PASSWORD_ROLE, PgServer
from support.servers import ServerProcess
from support.wait import eventually

from capella.handlers.pg_inbox import inbox_ddl
from capella.handlers.pg_outbox import outbox_ddl

pytestmark = pytest.mark.slow

ROWS = 20_000


async def start(data_dir: Path, port: int | None = None) -> ServerProcess:
    server = ServerProcess(data_dir, port)
    await asyncio.to_thread(server.wait_ready)
    return server


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
    dsn = pg_server.create_database(database)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(outbox_ddl(notify=True))
        payloads = [os.urandom(1 + i % 97) for i in range(ROWS)]
        ids = await conn.fetch(
            "INSERT INTO capella_outbox (data) SELECT unnest($1::bytea[]) RETURNING id", payloads
        )
        committed = sorted((r["id"], p) for r, p in zip(ids, payloads, strict=True))
        secret_dsn = f"postgresql://{PASSWORD_ROLE}:{PASSWORD}@127.0.0.1:{pg_server.port}/{database}"
        data_dir = tmp_path / "data"
        server = await start(data_dir)
        async with aiohttp.ClientSession() as session:
            url = server.url
            async with session.put(f"{url}/v1/queues/orders", json={}) as resp:
                assert resp.status == 201
            definition = {"type": "pg_outbox", "params": {"to": "orders", "dsn": secret_dsn, "batch": 20}}
            async with session.put(f"{url}/v1/handlers/relay", json=definition) as resp:
                assert resp.status == 201, await resp.text()
                assert PASSWORD not in await resp.text()

            async def some_relayed() -> bool:
                return bool(await conn.fetchval("SELECT count(*) FROM capella_outbox") < ROWS)

            assert await eventually(some_relayed, 30)
            server.kill()
            left = await conn.fetchval("SELECT count(*) FROM capella_outbox")
            assert 0 < left < ROWS, "the kill must come in the middle of the relay"

            server = await start(data_dir, server.port)
            try:

                async def drained() -> bool:
                    return await conn.fetchval("SELECT count(*) FROM capella_outbox") == 0

                assert await eventually(drained, 60)
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
    finally:
        await conn.close()


async def test_kill_9_mid_inbox_copy_leaves_each_message_once_in_the_table(
    tmp_path: Path, pg_server: PgServer
) -> None:
    dsn = pg_server.create_database(f"t{uuid.uuid4().hex[:12]}")
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(inbox_ddl())
        data_dir = tmp_path / "data"
        server = await start(data_dir)
        async with aiohttp.ClientSession() as session:
            url = server.url
            async with session.put(f"{url}/v1/queues/events", json={}) as resp:
                assert resp.status == 201
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

            async def some_inserted() -> bool:
                return bool(await conn.fetchval("SELECT count(*) FROM capella_inbox"))

            assert await eventually(some_inserted, 30)
            server.kill()
            inserted = await conn.fetchval("SELECT count(*) FROM capella_inbox")
            assert 0 < inserted < ROWS, "the kill must come in the middle of the copy"

            server = await start(data_dir, server.port)
            try:

                async def complete() -> bool:
                    return await conn.fetchval("SELECT count(*) FROM capella_inbox") >= ROWS

                assert await eventually(complete, 60)
                queued = await read_all(session, f"{url}/v1/queues/events", limit=5000)
            finally:
                server.stop()
        rows = await conn.fetch(
            "SELECT source, external_id, id, data, segment FROM capella_inbox ORDER BY id"
        )
        assert [tuple(r) for r in rows] == [
            (m["source"], m["external_id"], m["id"], payload(m), m["segment"]) for m in queued
        ]
    finally:
        await conn.close()
