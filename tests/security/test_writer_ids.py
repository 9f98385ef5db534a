"""External ids that MultiWriter generates never collide between writers of one source: two
writer processes started together each store all of their messages on a real server."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.servers import ServerProcess, running

from capella.client import AsyncClient
from capella.client.multi import DAY, OFFSET_BITS, ExternalIds
from capella.wire import INT64_MAX

# 2026-11-26 12:00 UTC, and the same time of the next day.
NOON = 20_418 * DAY + 43_200
NEXT_NOON = NOON + DAY


def test_ids_hold_the_day_above_a_random_offset_and_count_up() -> None:
    ids = ExternalIds(draw=lambda n: 1000)
    taken = [ids.next(NOON) for _ in range(3)]
    assert taken == [(20_418 << OFFSET_BITS) + 1000 + i for i in range(3)]


def test_a_new_day_starts_above_the_old_run_and_a_clock_set_back_changes_nothing() -> None:
    draws = iter([(1 << OFFSET_BITS) - 5, 7])
    ids = ExternalIds(draw=lambda n: next(draws))
    first = [ids.next(NOON) for _ in range(3)]
    back = ids.next(NOON - 2 * DAY)
    new_day = ids.next(NEXT_NOON)
    assert back == first[-1] + 1
    assert new_day == (20_419 << OFFSET_BITS) + 7 > back


def test_a_run_that_fills_its_day_never_steps_back_at_the_next_one() -> None:
    draws = iter([(1 << OFFSET_BITS) - 1, 0])
    ids = ExternalIds(draw=lambda n: next(draws))
    last = [ids.next(NOON) for _ in range(3)][-1]
    assert ids.next(NEXT_NOON) == last + 1


def test_ids_stay_positive_int64_through_the_last_day_the_layout_holds() -> None:
    last_day = (1 << (63 - OFFSET_BITS)) - 1
    ids = ExternalIds(draw=lambda n: n - 1)
    assert 0 < ids.next(last_day * DAY) <= INT64_MAX
    assert 1970 + int(last_day * DAY // (365.2425 * DAY)) == 2328


def test_two_writers_draw_different_offsets() -> None:
    assert ExternalIds().next(NOON) != ExternalIds().next(NOON)


# A writer process: says it is ready, waits for the word, then writes COUNT messages in batches.
WRITER = textwrap.dedent(
    """
    import asyncio, sys
    from capella.client import MultiWriter

    url, name, count, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    print("ready", flush=True)
    sys.stdin.readline()

    async def main():
        # Built after the word: both writers start within a millisecond of each other.
        async with MultiWriter([url], 1, source="shared") as writer:
            for start in range(0, count, batch):
                texts = [f"{name}-{i}" for i in range(start, start + batch)]
                await writer.produce("shared", texts, save="mark")

    asyncio.run(main())
    print("done", flush=True)
    """
)
COUNT = 20_000
BATCH = 1_000


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    yield from running(ServerProcess(tmp_path / "data"))


@pytest.mark.slow
async def test_two_writer_processes_of_one_source_store_every_message(server: ServerProcess) -> None:
    async with AsyncClient(server.url) as client:
        await client.put_queue("shared")
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, server.url, name, str(COUNT), str(BATCH)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for name in ("a", "b")
    ]
    try:
        for writer in writers:
            assert writer.stdout is not None and writer.stdout.readline().strip() == "ready"
        for writer in writers:
            assert writer.stdin is not None
            writer.stdin.write("go\n")
            writer.stdin.flush()
        for writer in writers:
            assert await asyncio.to_thread(writer.wait, 60) == 0
    finally:
        for writer in writers:
            if writer.poll() is None:
                writer.kill()
                writer.wait()
            for pipe in (writer.stdin, writer.stdout):
                if pipe is not None:
                    pipe.close()
    payloads: set[bytes] = set()
    identities: set[tuple[str, int]] = set()
    async with AsyncClient(server.url) as client:
        after = 0
        while True:
            page = await client.read("shared", after=after, limit=10_000)
            if not page.messages:
                break
            for message in page.messages:
                payloads.add(message.payload)
                identities.add((message.source, message.external_id))
            after = page.last_id
    assert len(identities) == 2 * COUNT
    assert payloads == {f"{name}-{i}".encode() for name in ("a", "b") for i in range(COUNT)}
