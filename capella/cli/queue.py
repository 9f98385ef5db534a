"""``capella queue create|list|show|drop``: manage queue definitions."""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any

from capella.cli.output import created, error, print_fields, print_json, print_table, size, utc
from capella.client import Client


def add_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    queue = commands.add_parser("queue", help="create, list, show and drop queues", parents=[common])
    actions = queue.add_subparsers(dest="action", metavar="ACTION", required=True)

    create = actions.add_parser("create", help="create a queue, or update its definition", parents=[common])
    create.add_argument("name")
    # A block is sealed at any of these; they are not retention (that is an expire handler).
    block = create.add_argument_group("block limits", "when the open block is sealed and a new one begins")
    block.add_argument("--block-max-messages", type=int, metavar="N", help="seal a block at N messages")
    block.add_argument("--block-max-bytes", metavar="SIZE", help="seal a block at this size, e.g. 8MiB")
    block.add_argument("--block-max-age", metavar="DUR", help="seal a block at this age, e.g. 1h")
    # The old names, before "limits" was found to read like retention; hidden, still accepted.
    create.add_argument("--max-count", type=int, dest="block_max_messages", help=argparse.SUPPRESS)
    create.add_argument("--max-bytes", dest="block_max_bytes", help=argparse.SUPPRESS)
    create.add_argument("--max-age", dest="block_max_age", help=argparse.SUPPRESS)
    create.add_argument("--save", metavar="MODE", help="default save mode: none|immediate|mark|wait")
    create.add_argument("--subscription-save", metavar="MODE", help="save mode of subscription commits")
    create.add_argument("--segments", type=_segment_range, metavar="LO-HI", help="allowed segment range")
    create.set_defaults(func=create_queue, uses_client=True)

    listing = actions.add_parser("list", help="list queues", parents=[common])
    listing.set_defaults(func=list_queues, uses_client=True)

    show = actions.add_parser("show", help="show a queue's definition and stats", parents=[common])
    show.add_argument("name")
    show.set_defaults(func=show_queue, uses_client=True)

    drop = actions.add_parser("drop", help="delete a queue and all its messages", parents=[common])
    drop.add_argument("name")
    drop.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    drop.set_defaults(func=drop_queue, uses_client=True)


def create_queue(args: argparse.Namespace, client: Client) -> int:
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
    info, was_created = client.save_queue(args.name, **definition)
    if args.json:
        print_json(info)
    else:
        print(f"queue {info.name} {created(was_created)}")
    return 0


def list_queues(args: argparse.Namespace, client: Client) -> int:
    queues = client.queues()
    if args.json:
        print_json(queues)
        return 0
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
    return 0


def show_queue(args: argparse.Namespace, client: Client) -> int:
    info = client.queue(args.name)
    if args.json:
        print_json(info)
        return 0
    stats, definition = info.stats, info.definition
    block = definition.block
    blocks = stats.blocks
    fields: list[tuple[str, object]] = [
        ("name", info.name),
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
    subscriptions = client.subscriptions(args.name)
    if subscriptions:
        print()
        rows = [
            [s.name, s.mode, str(s.last_id), str(s.lag), "yes" if s.replica else "no"] for s in subscriptions
        ]
        print_table(["SUBSCRIPTION", "MODE", "LAST_ID", "LAG", "REPLICA"], rows)
    return 0


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{name} {count}" for name, count in counts.items() if count)


def drop_queue(args: argparse.Namespace, client: Client) -> int:
    if not args.yes:
        if not sys.stdin.isatty():
            error(f"not dropping queue {args.name} without --yes")
            return 2
        answer = input(f"drop queue {args.name} and all its messages? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            error("not dropped")
            return 1
    client.drop_queue(args.name)
    if args.json:
        print_json({"dropped": args.name})
    else:
        print(f"queue {args.name} dropped")
    return 0


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
