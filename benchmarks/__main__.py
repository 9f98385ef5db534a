"""``python -m benchmarks [--quick] [--only NAME] [--profile DIR]``: run, print, write JSON."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

import orjson

from benchmarks import (
    auth,
    commits,
    delayed,
    disk,
    kafka,
    latency,
    machine,
    memory,
    postgres,
    produce,
    push,
    read,
    replication,
    restart,
    shared,
    tiers_archive,
    tiers_memory,
    tiers_read,
    versus,
    work,
)
from benchmarks.profile import summarize
from benchmarks.result import BenchmarkFailed, Outcome, Row, render_table
from benchmarks.settings import Settings

SCENARIOS: dict[str, Callable[[Settings], Awaitable[Outcome]]] = {
    "produce": produce.run,
    "read": read.run,
    "latency": latency.run,
    "memory": memory.run,
    "restart": restart.run,
    "disk": disk.run,
    "tiers-memory": tiers_memory.run,
    "tiers-archive": tiers_archive.run,
    "tiers-read-s3": tiers_read.run,
    "replication": replication.run,
    "auth": auth.run,
    "delayed": delayed.run,
    "work": work.run,
    "commits": commits.run,
    "postgres": postgres.run,
    "shared": shared.run,
    "push": push.run,
    "versus": versus.run,
    "kafka": kafka.run,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="capella-bench-", dir=args.data_root) as work:
        settings = Settings(quick=args.quick, work_dir=Path(work), profile_dir=args.profile)
        report: dict[str, Any] = {
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "quick": args.quick,
            "machine": machine.describe(Path(work)),
            "scenarios": {},
            "rows": [],
        }
        rows: list[Row] = []
        code = 0
        try:
            _run_loop(run_all(settings, args.only or list(SCENARIOS), report, rows))
        except (KeyboardInterrupt, asyncio.CancelledError):
            print("interrupted: the servers were stopped; partial results follow", file=sys.stderr)
            code = 130
        except BenchmarkFailed as exc:
            print(f"benchmark failed: {exc}", file=sys.stderr)
            code = 1
    report["rows"] = [row.to_dict() for row in rows]
    args.output.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    print()
    print(render_table(rows))
    below = [row for row in rows if row.met is False]
    targets = sum(row.target is not None for row in rows)
    print(f"\n{len(below)} of {targets} targets not reached; JSON: {args.output}")
    if args.profile is not None:
        print(f"profiles (py-spy raw): {args.profile}")
        for path in sorted(args.profile.glob("*.txt")):
            print(f"\n== {path.stem}\n{summarize(path)}")
    return code


async def run_all(settings: Settings, names: list[str], report: dict[str, Any], rows: list[Row]) -> None:
    # SIGTERM unwinds like Ctrl-C, so the servers are stopped and the temp dirs removed.
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    for name in names:
        print(f"{name}:", flush=True)
        started = time.perf_counter()
        outcome = await SCENARIOS[name](settings)
        report["scenarios"][name] = {**outcome.details, "scenario_s": time.perf_counter() - started}
        rows.extend(outcome.rows)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description="Benchmark a real Capella server.")
    p.add_argument("--quick", action="store_true", help="small counts: a smoke check in under 2 minutes")
    p.add_argument(
        "--only",
        action="append",
        choices=list(SCENARIOS),
        metavar="NAME",
        help=f"run only this scenario (repeatable): {', '.join(SCENARIOS)}",
    )
    p.add_argument(
        "--output",
        type=Path,
        default=Path("bench-results/latest.json"),
        help="where to write the JSON results (default: bench-results/latest.json)",
    )
    p.add_argument(
        "--data-root",
        type=Path,
        default=None,
        help="where the servers' temporary data directories go (default: the system temp dir)",
    )
    p.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        default=None,
        help="record each measured run with py-spy (raw collapsed stacks) into DIR",
    )
    return p


def _run_loop(coro: Coroutine[Any, Any, None]) -> None:
    try:
        import uvloop
    except ImportError:
        asyncio.run(coro)
        return
    uvloop.run(coro)


if __name__ == "__main__":
    raise SystemExit(main())
