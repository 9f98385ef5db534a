"""``capella scheduled list|show|reschedule|cancel``: delayed messages waiting in a queue."""

from __future__ import annotations

import argparse

from msgspec import UnsetType

from capella.cli.arguments import moment
from capella.cli.output import print_fields, print_json, print_table, text_of, utc
from capella.client import Client


def add_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    scheduled = commands.add_parser(
        "scheduled", help="list, show, reschedule and cancel delayed messages", parents=[common]
    )
    actions = scheduled.add_subparsers(dest="action", metavar="ACTION", required=True)

    listing = actions.add_parser("list", help="what is waiting, soonest first", parents=[common])
    listing.add_argument("queue")
    listing.add_argument("--limit", type=int, default=100, metavar="N", help="at most N (default 100)")
    listing.add_argument("--after", metavar="CURSOR", help="the next page: the cursor the last one printed")
    listing.set_defaults(func=list_scheduled, uses_client=True)

    show = actions.add_parser("show", help="one delayed message", parents=[common])
    show.add_argument("queue")
    show.add_argument("id", type=int)
    show.set_defaults(func=show_scheduled, uses_client=True)

    reschedule = actions.add_parser(
        "reschedule", help="move a delayed message to another time", parents=[common]
    )
    reschedule.add_argument("queue")
    reschedule.add_argument("id", type=int)
    when = reschedule.add_mutually_exclusive_group(required=True)
    when.add_argument("--delay", metavar="DURATION", help="due this long from now (10m, 2h, 7d)")
    when.add_argument("--at", metavar="TIME", help="due at this time (RFC 3339 or UNIX seconds)")
    reschedule.set_defaults(func=reschedule_message, uses_client=True)

    cancel = actions.add_parser("cancel", help="cancel delayed messages by id", parents=[common])
    cancel.add_argument("queue")
    cancel.add_argument("ids", type=int, nargs="+", metavar="ID")
    cancel.set_defaults(func=cancel_scheduled, uses_client=True)


def list_scheduled(args: argparse.Namespace, client: Client) -> int:
    page = client.scheduled(args.queue, limit=args.limit, after=args.after)
    if args.json:
        print_json(page)
        return 0
    rows = [
        [str(item.scheduled_id), utc(item.deliver_at), item.source, str(item.segment), text_of(item)]
        for item in page.scheduled
    ]
    print_table(["ID", "DUE", "SOURCE", "SEGMENT", "DATA"], rows)
    more = f"; next page: --after {page.next}" if page.next is not None else ""
    print(f"{len(rows)} shown, {page.count} scheduled in all{more}")
    return 0


def show_scheduled(args: argparse.Namespace, client: Client) -> int:
    item = client.scheduled_message(args.queue, args.id)
    if args.json:
        print_json(item)
        return 0
    headers = ", ".join(f"{name}={value}" for name, value in item.headers.items())
    print_fields(
        [
            ("scheduled id", item.scheduled_id),
            ("due", utc(item.deliver_at)),
            ("created", utc(item.created)),
            ("source", item.source),
            ("external id", item.external_id),
            ("external time", utc(item.external_time)),
            ("segment", item.segment),
            ("headers", headers or "-"),
            ("data", item.data if not isinstance(item.data, UnsetType) else f"{item.data_b64} (base64)"),
        ]
    )
    return 0


def reschedule_message(args: argparse.Namespace, client: Client) -> int:
    when = moment(args.at) if args.at is not None else None
    item = client.reschedule(args.queue, args.id, deliver_at=when, delay=args.delay)
    if args.json:
        print_json(item)
    else:
        print(f"scheduled message {item.scheduled_id} due {utc(item.deliver_at)}")
    return 0


def cancel_scheduled(args: argparse.Namespace, client: Client) -> int:
    answer = client.cancel_scheduled_many(args.queue, args.ids)
    if args.json:
        print_json(answer)
    else:
        for sid in answer.cancelled:
            print(f"cancelled {sid}")
        for sid in answer.not_cancelled:
            print(f"not cancelled {sid}: already delivered, being delivered, or unknown")
    return 1 if answer.not_cancelled else 0
