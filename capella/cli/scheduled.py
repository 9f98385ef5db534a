"""``capella scheduled list|show|reschedule|cancel``: delayed messages waiting in a queue."""

from __future__ import annotations

import argparse

from msgspec import UnsetType

from capella.cli.arguments import moment
from capella.cli.command import Command, Family, arg, one_of
from capella.cli.output import print_fields, print_table, text_of, utc
from capella.client import Client
from capella.wire.messages import CancelledScheduled, ScheduledList, ScheduledMessage


def print_scheduled(args: argparse.Namespace, page: ScheduledList) -> None:
    rows = [
        [str(item.scheduled_id), utc(item.deliver_at), item.source, str(item.segment), text_of(item)]
        for item in page.scheduled
    ]
    print_table(["ID", "DUE", "SOURCE", "SEGMENT", "DATA"], rows)
    more = f"; next page: --after {page.next}" if page.next is not None else ""
    print(f"{len(rows)} shown, {page.count} scheduled in all{more}")


def print_message(args: argparse.Namespace, item: ScheduledMessage) -> None:
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


def reschedule_message(args: argparse.Namespace, client: Client) -> ScheduledMessage:
    when = moment(args.at) if args.at is not None else None
    return client.reschedule(args.queue, args.id, deliver_at=when, delay=args.delay)


def print_cancelled(args: argparse.Namespace, answer: CancelledScheduled) -> None:
    for sid in answer.cancelled:
        print(f"cancelled {sid}")
    for sid in answer.not_cancelled:
        print(f"not cancelled {sid}: already delivered, being delivered, or unknown")


SCHEDULED = Family(
    "scheduled",
    "list, show, reschedule and cancel delayed messages",
    (
        Command(
            "list",
            "what is waiting, soonest first",
            lambda args, client: client.scheduled(args.queue, limit=args.limit, after=args.after),
            text=print_scheduled,
            args=(
                arg("queue"),
                arg("--limit", type=int, default=100, metavar="N", help="at most N (default 100)"),
                arg("--after", metavar="CURSOR", help="the next page: the cursor the last one printed"),
            ),
        ),
        Command(
            "show",
            "one delayed message",
            lambda args, client: client.scheduled_message(args.queue, args.id),
            text=print_message,
            args=(arg("queue"), arg("id", type=int)),
        ),
        Command(
            "reschedule",
            "move a delayed message to another time",
            reschedule_message,
            text=lambda args, item: print(
                f"scheduled message {item.scheduled_id} due {utc(item.deliver_at)}"
            ),
            args=(
                arg("queue"),
                arg("id", type=int),
                one_of(
                    arg("--delay", metavar="DURATION", help="due this long from now (10m, 2h, 7d)"),
                    arg("--at", metavar="TIME", help="due at this time (RFC 3339 or UNIX seconds)"),
                    required=True,
                ),
            ),
        ),
        Command(
            "cancel",
            "cancel delayed messages by id",
            lambda args, client: client.cancel_scheduled_many(args.queue, args.ids),
            text=print_cancelled,
            args=(arg("queue"), arg("ids", type=int, nargs="+", metavar="ID")),
            exit=lambda args, answer: 1 if answer.not_cancelled else 0,
        ),
    ),
)
