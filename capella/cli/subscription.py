"""``capella subscription create|list|show|delete``: cursors and work queues on a queue.

A subscription is a cursor (the last id read, ``consume --subscription`` moves it) or, with
``--ack`` or any retry-policy option, an ack-mode subscription: a work queue that ``capella
work`` claims from (docs/work-queues.md). Its mode never changes once created; ``create``
again changes a cursor's position or replica flag, or the policy options given.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from msgspec import UnsetType

from capella.cli.output import created, error, print_fields, print_json, print_table, utc
from capella.client import Client
from capella.wire.work import RetryPolicy, Subscription

# The policy options: their dest is the RetryPolicy field they set.
POLICY = ("lease", "max_attempts", "backoff", "delay", "max_delay", "jitter", "dead_letter")


def add_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    subscription = commands.add_parser(
        "subscription",
        help="create, list, show and delete subscriptions (cursors, work queues)",
        parents=[common],
    )
    actions = subscription.add_subparsers(dest="action", metavar="ACTION", required=True)

    create = actions.add_parser(
        "create",
        help="create a subscription, or change it",
        description="A cursor by default; an ack-mode subscription (a work queue) with --ack or "
        "any policy option. Options left out keep their current (or default) values.",
        parents=[common],
    )
    create.add_argument("queue")
    create.add_argument("name")
    cursor = create.add_argument_group("cursor", "a plain cursor: the last id read")
    cursor.add_argument("--after", type=int, metavar="ID", help="the cursor: read after this id (default 0)")
    cursor.add_argument(
        "--reset", action="store_true", help="move the cursor back to --after if it is past it"
    )
    cursor.add_argument(
        "--replica",
        action=argparse.BooleanOptionalAction,
        help="count it as a replica (producers can wait for N replicas to have a message)",
    )
    ack = create.add_argument_group(
        "ack mode", "a work queue: each message leased to one consumer, retried, dead at last"
    )
    ack.add_argument("--ack", action="store_true", help="ack mode (implied by any option below)")
    ack.add_argument("--lease", metavar="DUR", help="default lease of a claim (30s)")
    ack.add_argument(
        "--max-attempts", type=int, metavar="N", help="claims before a message is dead (5; 0: no limit)"
    )
    ack.add_argument("--backoff", choices=("fixed", "exponential"), help="retry delays (exponential)")
    ack.add_argument("--delay", metavar="DUR", help="first retry delay; fixed: every retry (1s)")
    ack.add_argument("--max-delay", metavar="DUR", help="cap of a retry delay (5m)")
    ack.add_argument("--jitter", type=float, metavar="F", help="spread each delay by ± this fraction (0.1)")
    dead = ack.add_mutually_exclusive_group()
    dead.add_argument("--dead-letter", metavar="QUEUE", help="an existing queue that gets each dead message")
    dead.add_argument(
        "--no-dead-letter",
        dest="dead_letter",
        action="store_const",
        const="",
        help="stop copying dead messages",
    )
    create.set_defaults(func=create_subscription, uses_client=True)

    listing = actions.add_parser("list", help="list a queue's subscriptions", parents=[common])
    listing.add_argument("queue")
    listing.set_defaults(func=list_subscriptions, uses_client=True)

    show = actions.add_parser("show", help="show a subscription, its policy and work", parents=[common])
    show.add_argument("queue")
    show.add_argument("name")
    show.set_defaults(func=show_subscription, uses_client=True)

    delete = actions.add_parser(
        "delete", help="delete a subscription (a work queue: with its messages' states)", parents=[common]
    )
    delete.add_argument("queue")
    delete.add_argument("name")
    delete.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    delete.set_defaults(func=delete_subscription, uses_client=True)


def create_subscription(args: argparse.Namespace, client: Client) -> int:
    policy = {key: getattr(args, key) for key in POLICY if getattr(args, key) is not None}
    if "dead_letter" in policy and not policy["dead_letter"]:
        policy["dead_letter"] = None  # --no-dead-letter
    cursor = args.after is not None or args.reset or args.replica is not None
    if (args.ack or policy) and cursor:
        error(
            "--after, --reset and --replica are for a cursor; --ack and the policy options for a work queue"
        )
        return 2
    body: dict[str, Any] = {"mode": "ack", "policy": policy} if args.ack or policy else {}
    if args.after is not None:
        body["last_id"] = args.after
    if args.reset:
        body["reset"] = True
    if args.replica is not None:
        body["replica"] = args.replica
    sub, was_created = client.save_subscription(args.queue, args.name, **body)
    if args.json:
        print_json(sub)
    else:
        kind = "work queue" if sub.mode == "ack" else "cursor"
        print(f"subscription {args.queue}/{sub.name} {created(was_created)} ({kind})")
    return 0


def list_subscriptions(args: argparse.Namespace, client: Client) -> int:
    subscriptions = client.subscriptions(args.queue)
    if args.json:
        print_json(subscriptions)
        return 0
    rows = []
    for sub in subscriptions:
        work = None if isinstance(sub.work, UnsetType) else sub.work
        counts = ["-", "-", "-"] if work is None else [str(work.in_flight), str(work.failed), str(work.dead)]
        replica = "yes" if sub.replica else "no"
        rows.append([sub.name, sub.mode, str(sub.last_id), str(sub.lag), replica, *counts, utc(sub.updated)])
    header = ["NAME", "MODE", "LAST_ID", "LAG", "REPLICA", "IN_FLIGHT", "FAILED", "DEAD", "UPDATED"]
    print_table(header, rows)
    return 0


def show_subscription(args: argparse.Namespace, client: Client) -> int:
    sub = client.subscription(args.queue, args.name)
    if args.json:
        print_json(sub)
        return 0
    print_fields(_fields(args.queue, sub))
    return 0


def _fields(queue: str, sub: Subscription) -> list[tuple[str, object]]:
    fields: list[tuple[str, object]] = [
        ("name", f"{queue}/{sub.name}"),
        ("mode", "ack (a work queue)" if sub.mode == "ack" else "cursor"),
        ("last id", sub.last_id),
        ("lag", sub.lag),
        ("replica", "yes" if sub.replica else "no"),
        ("created", utc(sub.created)),
        ("updated", utc(sub.updated)),
    ]
    if not isinstance(sub.work, UnsetType):
        work = sub.work
        fields += [
            ("claimed through", work.claimed_through),
            ("backlog", work.backlog),
            ("in flight", work.in_flight),
            ("failed", f"{work.failed} (waiting for a retry)"),
            ("dead", work.dead),
        ]
    if not isinstance(sub.policy, UnsetType):
        fields += _policy(sub.policy)
    return fields


def _policy(policy: RetryPolicy) -> list[tuple[str, object]]:
    def shown(value: object) -> object:
        return "-" if isinstance(value, UnsetType) or value is None else value

    return [
        ("lease", f"{shown(policy.lease)} s"),
        ("max attempts", shown(policy.max_attempts)),
        ("backoff", f"{shown(policy.backoff)}, from {shown(policy.delay)} s to {shown(policy.max_delay)} s"),
        ("jitter", f"± {shown(policy.jitter)}"),
        ("dead letter", shown(policy.dead_letter)),
    ]


def delete_subscription(args: argparse.Namespace, client: Client) -> int:
    if not args.yes:
        if not sys.stdin.isatty():
            error(f"not deleting subscription {args.queue}/{args.name} without --yes")
            return 2
        answer = input(f"delete subscription {args.queue}/{args.name}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            error("not deleted")
            return 1
    client.delete_subscription(args.queue, args.name)
    if args.json:
        print_json({"deleted": f"{args.queue}/{args.name}"})
    else:
        print(f"subscription {args.queue}/{args.name} deleted")
    return 0
