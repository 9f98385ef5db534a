"""``capella export`` and ``capella import``: a queue to NDJSON and back, identity kept.

Each line is one message in the produce shape (``data`` or ``data_b64``, ``source``,
``external_id``, ``external_time``, ``segment``, ``headers``), so ``capella import``,
``capella produce --ndjson`` and ``POST .../messages`` with ``application/x-ndjson`` all take
it. The identity ``(source, external_id)`` goes with every message, so importing a file twice,
or into the queue it came from, stores nothing twice: the repeats are answered as duplicates.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import Any, BinaryIO

import orjson
from msgspec import UNSET

from capella.cli.command import Command, Refused, arg
from capella.cli.data import json_object
from capella.cli.progress import Progress
from capella.client import Client
from capella.wire.messages import StoredMessage

BATCH = 1000


def export_queue(args: argparse.Namespace, client: Client) -> None:
    progress = Progress("exported", client.queue(args.queue).stats.messages)
    if args.file is None:
        exported = _export(client, args.queue, args.after, sys.stdout.buffer, progress)
    else:
        try:
            out = args.file.open("wb")
        except OSError as exc:
            raise Refused(f"cannot write {args.file}: {exc.strerror}") from None
        with out:
            exported = _export(client, args.queue, args.after, out, progress)
    progress.finish()
    if args.file is not None:
        print(f"exported {exported} messages to {args.file}")


def _export(client: Client, queue: str, after: int, out: BinaryIO, progress: Progress) -> int:
    exported = 0
    while True:
        page = client.read(queue, after=after, limit=BATCH)
        out.write(b"".join(orjson.dumps(_line(m), option=orjson.OPT_APPEND_NEWLINE) for m in page.messages))
        out.flush()
        exported += len(page.messages)
        progress.add(len(page.messages))
        if page.last_id <= after:
            return exported
        after = page.last_id


def _line(message: StoredMessage) -> dict[str, Any]:
    line: dict[str, Any] = (
        {"data": message.data} if message.data is not UNSET else {"data_b64": message.data_b64}
    )
    line.update(
        source=message.source,
        external_id=message.external_id,
        external_time=message.external_time,
        segment=message.segment,
    )
    if message.headers:
        line["headers"] = message.headers
    return line


def import_queue(args: argparse.Namespace, client: Client) -> None:
    try:
        source = sys.stdin.buffer if args.file is None else args.file.open("rb")
    except OSError as exc:
        raise Refused(f"cannot read {args.file}: {exc.strerror}") from None
    total_bytes = args.file.stat().st_size if args.file is not None else None
    progress = Progress("imported", reading=source)
    stored = duplicates = 0
    try:
        lines = _objects(source)
        while batch := list(islice(lines, BATCH)):
            for result in client.produce(args.queue, batch, save=args.save):
                if result.duplicate:
                    duplicates += 1
                else:
                    stored += 1
            progress.add(len(batch))
    finally:
        if args.file is not None:
            source.close()
    progress.finish()
    size = f" ({total_bytes:,} bytes)" if total_bytes is not None else ""
    print(f"imported {stored + duplicates} messages{size}: {stored} stored, {duplicates} already there")


def _objects(source: BinaryIO) -> Iterator[dict[str, Any]]:
    for number, line in enumerate(source, 1):
        if line.strip():
            yield json_object(line, number)


# Both print a summary line, never JSON: the messages themselves are the NDJSON.
COMMANDS = (
    Command(
        "export",
        "write a queue's messages as NDJSON, identity kept",
        export_queue,
        text=None,
        args=(
            arg("queue"),
            arg("--after", type=int, default=0, metavar="ID", help="only messages after this id"),
            arg("--file", type=Path, metavar="F", help="write to F (default: standard output)"),
        ),
    ),
    Command(
        "import",
        "append an NDJSON export to a queue (a repeat is a no-op)",
        import_queue,
        text=None,
        args=(
            arg("queue"),
            arg("--file", type=Path, metavar="F", help="read F (default: standard input)"),
            arg("--save", metavar="MODE", default="wait", help="save mode of the appends (default: wait)"),
        ),
    ),
)
