"""Ready after ``kill -9``: spawn → ``/readyz`` 200 for a data directory holding 1,000,000
messages (``--quick``: 100,000) whose server was killed, not stopped.

The queue is seeded with 256-character text messages (``save=mark``, as ``read`` seeds), then
one ``save=wait`` message is answered, so everything before it is on disk too, and the server
gets SIGKILL at once: its last blocks are still being sealed and its journal holds what is
not. Each restart is timed from the spawn, checked to hold the last message, and killed again;
the first restart replays the crash, the later ones start from what the first left.
"""

from __future__ import annotations

import statistics

import orjson

from benchmarks.client import messages_url, new_session, put_queue
from benchmarks.read import seed
from benchmarks.result import BenchmarkFailed, Outcome, Row
from benchmarks.server import Server
from benchmarks.settings import Settings

RESTARTS = 3
TARGET_S = 1.0


async def run(settings: Settings) -> Outcome:
    outcome = Outcome()
    total = settings.pick(1_000_000, 100_000)
    data_dir = settings.data_dir("restart")
    log = settings.log_path("restart")
    server = await Server.start(data_dir, log)
    try:
        async with new_session() as session:
            await put_queue(session, server.url)
            await seed(server, total, settings.pick(300, 60))
            async with session.post(
                messages_url(server.url, "wait"), json={"messages": [{"data": "last"}]}
            ) as resp:
                if resp.status != 200:
                    raise BenchmarkFailed(f"restart: the save=wait write: HTTP {resp.status}")
    finally:
        server.kill()
    readies = []
    for _ in range(RESTARTS):
        server = await Server.start(data_dir, log)
        try:
            readies.append(server.startup)
            await _check_last(server, total + 1)
        finally:
            server.kill()
    outcome.details["ready_s"] = readies
    outcome.rows += [
        Row(
            "restart",
            f"kill -9 → spawn → /readyz, {total:,} stored msgs, first",
            readies[0],
            "s",
            TARGET_S,
            higher_is_better=False,
            note="replays the crash: journals and the seals in flight",
        ),
        Row(
            "restart",
            f"kill -9 → spawn → /readyz, {total:,} stored msgs, median of {RESTARTS}",
            statistics.median(readies),
            "s",
            TARGET_S,
            higher_is_better=False,
        ),
    ]
    print(f"  ready after kill -9: {', '.join(f'{s:.3f}' for s in readies)} s", flush=True)
    return outcome


async def _check_last(server: Server, last: int) -> None:
    async with new_session() as session:
        url = messages_url(server.url).with_query(after=last - 1, limit=10)
        async with session.get(url) as resp:
            page = orjson.loads(await resp.read())
    ids = [m["id"] for m in page.get("messages", [])]
    if ids != [last]:
        raise BenchmarkFailed(f"restart: after a kill -9 the queue ends at {ids}, not at id {last}")
