"""PostgreSQL bridges: rows/s from an outbox table into a queue, messages/s into an inbox table.

A throwaway PostgreSQL cluster (the tests' ``tests/support/pg.py``: initdb in a temp dir, loopback,
``fsync = off``, so the figure is Capella's and the driver's, not the database disk's) and a
real server. 200,000 rows of 100 bytes are committed to the outbox first (not timed); a
``pg_outbox`` handler (batch 1000, ``save=wait``) then relays them, timed until the table is
empty. A ``pg_inbox`` handler (batch 1000) then copies the queue into an inbox table, timed
until the table holds every message. Both runs check the counts.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from benchmarks.client import new_session, put_queue, queue_stats
from benchmarks.meter import Meter
from benchmarks.result import BenchmarkFailed, Outcome, Row
from benchmarks.server import profiled, running_server
from benchmarks.settings import Settings

PAYLOAD = 100
CHUNK = 10_000
DEADLINE = 600.0


def pg_support() -> ModuleType:
    """tests/support/pg.py, so the tests and the benchmark run PostgreSQL the same way."""
    path = Path(__file__).resolve().parent.parent / "tests" / "support" / "pg.py"
    spec = importlib.util.spec_from_file_location("capella_bench_pg", path)
    if spec is None or spec.loader is None:
        raise BenchmarkFailed(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def run(settings: Settings) -> Outcome:
    try:
        import asyncpg
    except ImportError:
        raise BenchmarkFailed("the postgres scenario needs asyncpg: pip install -e '.[dev]'") from None
    from capella.handlers.pg_inbox import inbox_ddl
    from capella.handlers.pg_outbox import outbox_ddl

    total = settings.pick(200_000, 20_000)
    pg = await asyncio.to_thread(pg_support().PgServer)
    outcome = Outcome()
    try:
        dsn = await asyncio.to_thread(pg.create_database, "bench")
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(outbox_ddl() + inbox_ddl())
            for start in range(0, total, CHUNK):
                payloads = [os.urandom(PAYLOAD) for _ in range(min(CHUNK, total - start))]
                await conn.execute("INSERT INTO capella_outbox (data) SELECT unnest($1::bytea[])", payloads)
            name = "postgres"
            async with (
                running_server(settings.data_dir(name), settings.log_path(name)) as server,
                new_session() as session,
            ):
                await put_queue(session, server.url, "outbox")
                meter = Meter(server)
                async with profiled(server, settings.profile_path("postgres-outbox")):
                    meter.start()
                    await _put_handler(
                        session,
                        server.url,
                        "relay",
                        {"type": "pg_outbox", "params": {"to": "outbox", "dsn": dsn}},
                    )
                    await _until(conn, "SELECT count(*) = 0 FROM capella_outbox")
                    meter.stop()
                stored = (await queue_stats(session, server.url, "outbox"))["messages"]
                if stored != total:
                    raise BenchmarkFailed(f"outbox: {stored} messages in the queue, {total} rows committed")
                outcome.details["outbox"] = _figures(total, meter)

                meter = Meter(server)
                async with profiled(server, settings.profile_path("postgres-inbox")):
                    meter.start()
                    await _put_handler(
                        session,
                        server.url,
                        "inbox",
                        {"type": "pg_inbox", "queue": "outbox", "params": {"dsn": dsn}},
                    )
                    await _until(conn, f"SELECT count(*) >= {total} FROM capella_inbox")
                    meter.stop()
                inserted = await conn.fetchval("SELECT count(*) FROM capella_inbox")
                if inserted != total:
                    raise BenchmarkFailed(f"inbox: {inserted} rows for {total} messages")
                outcome.details["inbox"] = _figures(total, meter)
        finally:
            await conn.close()
    finally:
        await asyncio.to_thread(pg.close)
    for key, metric, unit in (
        ("outbox", f"outbox → queue, batch 1000, save=wait, {PAYLOAD} B rows", "rows/s"),
        ("inbox", f"queue → inbox table, batch 1000, {PAYLOAD} B messages", "msg/s"),
    ):
        figures = outcome.details[key]
        cpu = figures["cpu"]
        note = f"server CPU {cpu['server_cpu_pct']:.0f}%; PostgreSQL on the same machine, fsync off"
        outcome.rows.append(Row("postgres", metric, figures["rate"], unit, note=note))
        print(f"  {key}: {figures['rate']:,.0f} {unit} ({note})", flush=True)
    return outcome


async def _put_handler(session: Any, base: str, name: str, definition: dict[str, Any]) -> None:
    async with session.put(f"{base}/v1/handlers/{name}", json=definition) as resp:
        if resp.status not in (200, 201):
            raise BenchmarkFailed(f"PUT handler {name}: HTTP {resp.status}: {await resp.text()}")


async def _until(conn: Any, sql: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not await conn.fetchval(sql):
        if time.monotonic() > deadline:
            raise BenchmarkFailed(f"not done after {DEADLINE:.0f} s: {sql}")
        await asyncio.sleep(0.02)


def _figures(total: int, meter: Meter) -> dict[str, Any]:
    return {"rows": total, "seconds": meter.wall, "rate": total / meter.wall, "cpu": meter.to_dict()}
