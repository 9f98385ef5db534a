"""``capella queue create|list|show|drop``: manage queue definitions."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from typing import Any

from capella.cli.command import Command, Family, arg, drop, section
from capella.cli.output import created, print_fields, print_table, size, utc
from capella.client import Client, Saved
from capella.wire.queues import QueueInfo
from capella.wire.work import Subscription


def save_queue(args: argparse.Namespace, client: Client) -> Saved[QueueInfo]:
    definition: dict[str, Any] = {}
    block = {
        key: value
        for key, value in (
            ("max_messages", args.block_max_messages),
            ("max_bytes", _number_or_text(args.block_max_bytes)),
            ("max_age", _number_or_text(args.block_max_age)),
        )
        if value is not None
    }
    if block:
        definition["block"] = block
    if args.save is not None:
        definition["save"] = args.save
    if args.subscription_save is not None:
        definition["subscription_save"] = args.subscription_save
    if args.segments is not None:
        definition["segments"] = {"min": args.segments[0], "max": args.segments[1]}
    if args.shared:
        definition["storage"] = "shared"
    return client.save_queue(args.name, **definition)


def print_queues(args: argparse.Namespace, queues: list[QueueInfo]) -> None:
    rows = []
    for info in queues:
        stats = info.stats
        rows.append(
            [
                info.name,
                str(stats.messages),
                str(stats.first_id),
                str(stats.last_id),
                size(stats.bytes),
                str(stats.subscriptions),
            ]
        )
    print_table(["NAME", "MESSAGES", "FIRST_ID", "LAST_ID", "SIZE", "SUBSCRIPTIONS"], rows)


# A queue and how to get its subscriptions: asked for only when they are printed, after it.
Shown = tuple[QueueInfo, Callable[[], list[Subscription]]]


def show_queue(args: argparse.Namespace, client: Client) -> Shown:
    return client.queue(args.name), lambda: client.subscriptions(args.name)


def print_queue(args: argparse.Namespace, shown: Shown) -> None:
    info, subscriptions_of = shown
    stats, definition = info.stats, info.definition
    block = definition.block
    blocks = stats.blocks
    fields: list[tuple[str, object]] = [
        ("name", info.name),
        ("storage", definition.storage or "local"),
        ("messages", f"{stats.messages} (ids {stats.first_id}-{stats.last_id}), {size(stats.bytes)}"),
        ("blocks", f"{blocks.total}: " + _counts(blocks.by_state)),
        ("blocks by mark", _counts(blocks.by_mark) or "-"),
        ("scheduled", f"{stats.scheduled.count}, next due {utc(stats.scheduled.next_due)}"),
        (
            "writable",
            "yes" if stats.writable else "no: " + "; ".join(f"{f.step}: {f.error}" for f in stats.faults),
        ),
        ("last error", stats.last_error or "-"),
    ]
    if block:  # every answer has it; only a request may leave it out
        max_bytes = size(block.max_bytes) if isinstance(block.max_bytes, int) else block.max_bytes
        limits = f"{block.max_messages} messages, {max_bytes}, {block.max_age} s"
        fields.append(("block sealed at", limits))
    fields.append(("save", f"{definition.save} (subscriptions: {definition.subscription_save})"))
    segments = definition.segments
    fields.append(("segments", "any" if not segments else f"{segments.min} to {segments.max}"))
    print_fields(fields)
    subscriptions = subscriptions_of()
    if subscriptions:
        print()
        rows = [
            [s.name, s.mode, str(s.last_id), str(s.lag), "yes" if s.replica else "no"] for s in subscriptions
        ]
        print_table(["SUBSCRIPTION", "MODE", "LAST_ID", "LAG", "REPLICA"], rows)


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{name} {count}" for name, count in counts.items() if count)


def _segment_range(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"\s*(-?\d+)\s*-\s*(-?\d+)\s*", text)
    if match is None or int(match.group(1)) > int(match.group(2)):
        raise argparse.ArgumentTypeError(f"expected LO-HI with LO <= HI, got {text!r}")
    return int(match.group(1)), int(match.group(2))


def _number_or_text(value: str | None) -> int | str | None:
    # The server reads "8MiB" and "1h" as well as plain numbers; plain numbers go as numbers.
    if value is not None and value.strip().isdigit():
        return int(value)
    return value


QUEUE = Family(
    "queue",
    "create, list, show and drop queues",
    (
        Command(
            "create",
            "create a queue, or update its definition",
            save_queue,
            text=lambda args, saved: print(f"queue {saved.value.name} {created(saved.created)}"),
            json=lambda args, saved: saved.value,
            args=(
                arg("name"),
                # A block is sealed at any of these; they are not retention (that is an expire handler).
                section(
                    "block limits",
                    "when the open block is sealed and a new one begins",
                    arg("--block-max-messages", type=int, metavar="N", help="seal a block at N messages"),
                    arg("--block-max-bytes", metavar="SIZE", help="seal a block at this size, e.g. 8MiB"),
                    arg("--block-max-age", metavar="DUR", help="seal a block at this age, e.g. 1h"),
                ),
                # The old names, before "limits" was found to read like retention; hidden, still accepted.
                arg("--max-count", type=int, dest="block_max_messages", help=argparse.SUPPRESS),
                arg("--max-bytes", dest="block_max_bytes", help=argparse.SUPPRESS),
                arg("--max-age", dest="block_max_age", help=argparse.SUPPRESS),
                arg("--save", metavar="MODE", help="default save mode: none|immediate|mark|wait"),
                arg("--subscription-save", metavar="MODE", help="save mode of subscription commits"),
                arg("--segments", type=_segment_range, metavar="LO-HI", help="allowed segment range"),
                arg(
                    "--shared",
                    action="store_true",
                    help="a shared queue: in S3 and PostgreSQL, through every node (docs/shared.md)",
                ),
            ),
        ),
        Command("list", "list queues", lambda args, client: client.queues(), text=print_queues),
        Command(
            "show",
            "show a queue's definition and stats",
            show_queue,
            text=print_queue,
            json=lambda args, shown: shown[0],
            args=(arg("name"),),
        ),
        drop(
            "queue",
            "delete a queue and all its messages",
            lambda args, client: client.drop_queue(args.name),
            question="drop queue {name} and all its messages?",
        ),
    ),
)
