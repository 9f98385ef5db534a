"""Start-up time (spawn → ``/readyz`` 200), idle RSS of a fresh server with one queue, and with
1,000 idle queues (what each idle queue costs)."""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys

from benchmarks.client import new_session, put_queue
from benchmarks.result import Outcome, Row
from benchmarks.server import running_server
from benchmarks.settings import Settings

IDLE_SECONDS = 2.0
IDLE_QUEUES = 1000
# The bare stack the server stands on: the RSS of a process that has imported it is the floor
# of Capella's idle RSS, and the target is to stay within FLOOR_MARGIN_MB of it (issue 24).
STACK = ("uvloop", "orjson", "msgspec", "aiohttp.web")
FLOOR_MARGIN_MB = 3.0
_FLOOR = (
    f"import {', '.join(STACK)}, ctypes\n"
    "try:\n    ctypes.CDLL('libc.so.6').malloc_trim(0)  # as the server does after start-up\n"
    "except OSError:\n    pass\n"
    "print(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmRSS:')))\n"
)


def stack_floor_mb() -> float:
    """The RSS (MB) of a fresh Python that has imported ``STACK``, measured in a child process."""
    command = [sys.executable, "-c", _FLOOR]
    done = subprocess.run(command, capture_output=True, text=True, check=True, timeout=60)
    return int(done.stdout.strip()) / 1024


async def run(settings: Settings) -> Outcome:
    outcome = Outcome()
    startups = []
    for attempt in range(settings.pick(5, 2)):
        name = f"memory-{attempt}"
        async with running_server(settings.data_dir(name), settings.log_path(name)) as server:
            startups.append(server.startup)
            if attempt == 0:
                async with new_session() as session:
                    await put_queue(session, server.url)
                await asyncio.sleep(IDLE_SECONDS)
                outcome.details["idle_rss_mb"] = server.rss_mb()
                outcome.details["idle_peak_rss_mb"] = server.peak_rss_mb()
                # RSS counts shared library pages (libpython, libssl) as well as the heap.
                outcome.details["idle_rss_anon_mb"] = server.status_kb("RssAnon") / 1024
                outcome.details["idle_rss_file_mb"] = server.status_kb("RssFile") / 1024
                async with new_session() as session:
                    for i in range(1, IDLE_QUEUES):
                        await put_queue(session, server.url, f"idle-{i}")
                await asyncio.sleep(IDLE_SECONDS)
                outcome.details["idle_queues_rss_mb"] = server.rss_mb()
    outcome.details["startup_s"] = startups
    outcome.details["stack_floor_mb"] = floor = await asyncio.to_thread(stack_floor_mb)
    startup = statistics.median(startups)
    idle = outcome.details["idle_rss_mb"]
    anon, file = outcome.details["idle_rss_anon_mb"], outcome.details["idle_rss_file_mb"]
    per_queue_kb = (outcome.details["idle_queues_rss_mb"] - idle) * 1024 / (IDLE_QUEUES - 1)
    outcome.rows += [
        Row(
            "memory",
            f"idle RSS, 1 queue, after {IDLE_SECONDS:g} s",
            idle,
            "MB",
            floor + FLOOR_MARGIN_MB,
            higher_is_better=False,
            note=(
                f"{anon:.1f} MB anonymous + {file:.1f} MB file-backed (libraries); "
                f"the bare stack's import floor {floor:.1f} MB + {FLOOR_MARGIN_MB:g}"
            ),
        ),
        Row(
            "memory",
            f"idle RSS, {IDLE_QUEUES:,} queues, after {IDLE_SECONDS:g} s",
            outcome.details["idle_queues_rss_mb"],
            "MB",
            higher_is_better=False,
            note=f"{per_queue_kb:.1f} KB per idle queue",
        ),
        Row(
            "startup",
            "spawn → /readyz, empty data dir",
            startup,
            "s",
            higher_is_better=False,
            note=f"median of {len(startups)}",
        ),
    ]
    print(f"  idle RSS {idle:.1f} MB (floor {floor:.1f} MB), start-up {startup:.3f} s", flush=True)
    return outcome
