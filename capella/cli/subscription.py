"""``capella subscription create|list|show|delete``: cursors and work queues on a queue.

A subscription is a cursor (the last id read, ``consume --subscription`` moves it) or, with
``--ack`` or any retry-policy option, an ack-mode subscription: a work queue that ``capella
work`` claims from (docs/work-queues.md). Its mode never changes once created; ``create``
again changes a cursor's position or replica flag, or the policy options given.
"""

from __future__ import annotations

import argparse
from typing import Any

import orjson
from msgspec import UnsetType

from capella.cli.command import Command, Confirm, Family, arg, one_of, section
from capella.cli.output import created, print_fields, print_table, utc
from capella.client import Client, Saved
from capella.wire.work import RetryPolicy, Subscription

# The policy options: their dest is the RetryPolicy field they set.
POLICY = ("lease", "max_attempts", "backoff", "delay", "max_delay", "jitter", "dead_letter")


def _policy_of(args: argparse.Namespace) -> dict[str, Any]:
    policy = {key: getattr(args, key) for key in POLICY if getattr(args, key) is not None}
    if "dead_letter" in policy and not policy["dead_letter"]:
        policy["dead_letter"] = None  # --no-dead-letter
    return policy


def _cursor_or_work(args: argparse.Namespace) -> str | None:
    cursor = args.after is not None or args.reset or args.replica is not None
    if (args.ack or _policy_of(args)) and cursor:
        return (
            "--after, --reset and --replica are for a cursor; --ack and the policy options for a work queue"
        )
    return None


def save_subscription(args: argparse.Namespace, client: Client) -> Saved[Subscription]:
    policy = _policy_of(args)
    body: dict[str, Any] = {"mode": "ack", "policy": policy} if args.ack or policy else {}
    if args.after is not None:
        body["last_id"] = args.after
    if args.reset:
        body["reset"] = True
    if args.replica is not None:
        body["replica"] = args.replica
    return client.save_subscription(args.queue, args.name, **body)


def print_saved(args: argparse.Namespace, saved: Saved[Subscription]) -> None:
    kind = "work queue" if saved.value.mode == "ack" else "cursor"
    print(f"subscription {args.queue}/{saved.value.name} {created(saved.created)} ({kind})")


def print_subscriptions(args: argparse.Namespace, subscriptions: list[Subscription]) -> None:
    rows = []
    for sub in subscriptions:
        work = None if isinstance(sub.work, UnsetType) else sub.work
        counts = ["-", "-", "-"] if work is None else [str(work.in_flight), str(work.failed), str(work.dead)]
        replica = "yes" if sub.replica else "no"
        rows.append([sub.name, sub.mode, str(sub.last_id), str(sub.lag), replica, *counts, utc(sub.updated)])
    header = ["NAME", "MODE", "LAST_ID", "LAG", "REPLICA", "IN_FLIGHT", "FAILED", "DEAD", "UPDATED"]
    print_table(header, rows)


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
    if not isinstance(sub.group, UnsetType):
        fields.append(("group", _text(sub.group)))
    if not isinstance(sub.metadata, UnsetType):
        fields.append(("metadata", _text(sub.metadata)))
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


def _text(value: str) -> str:
    # A client's text, shown on one line as it is, or quoted as JSON when empty or when it holds
    # what a terminal would not show as itself (a newline, a control character).
    return value if value and value.isprintable() else orjson.dumps(value).decode()


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


SUBSCRIPTION = Family(
    "subscription",
    "create, list, show and delete subscriptions (cursors, work queues)",
    (
        Command(
            "create",
            "create a subscription, or change it",
            save_subscription,
            text=print_saved,
            json=lambda args, saved: saved.value,
            description="A cursor by default; an ack-mode subscription (a work queue) with --ack or "
            "any policy option. Options left out keep their current (or default) values.",
            args=(
                arg("queue"),
                arg("name"),
                section(
                    "cursor",
                    "a plain cursor: the last id read",
                    arg("--after", type=int, metavar="ID", help="the cursor: read after this id (default 0)"),
                    arg(
                        "--reset",
                        action="store_true",
                        help="move the cursor back to --after if it is past it",
                    ),
                    arg(
                        "--replica",
                        action=argparse.BooleanOptionalAction,
                        help="count it as a replica (producers can wait for N replicas to have a message)",
                    ),
                ),
                section(
                    "ack mode",
                    "a work queue: each message leased to one consumer, retried, dead at last",
                    arg("--ack", action="store_true", help="ack mode (implied by any option below)"),
                    arg("--lease", metavar="DUR", help="default lease of a claim (30s)"),
                    arg(
                        "--max-attempts",
                        type=int,
                        metavar="N",
                        help="claims before a message is dead (5; 0: no limit)",
                    ),
                    arg("--backoff", choices=("fixed", "exponential"), help="retry delays (exponential)"),
                    arg("--delay", metavar="DUR", help="first retry delay; fixed: every retry (1s)"),
                    arg("--max-delay", metavar="DUR", help="cap of a retry delay (5m)"),
                    arg(
                        "--jitter", type=float, metavar="F", help="spread each delay by ± this fraction (0.1)"
                    ),
                    one_of(
                        arg(
                            "--dead-letter",
                            metavar="QUEUE",
                            help="an existing queue that gets each dead message",
                        ),
                        arg(
                            "--no-dead-letter",
                            dest="dead_letter",
                            action="store_const",
                            const="",
                            help="stop copying dead messages",
                        ),
                    ),
                ),
            ),
            check=_cursor_or_work,
        ),
        Command(
            "list",
            "list a queue's subscriptions",
            lambda args, client: client.subscriptions(args.queue),
            text=print_subscriptions,
            args=(arg("queue"),),
        ),
        Command(
            "show",
            "show a subscription, its policy and work",
            lambda args, client: client.subscription(args.queue, args.name),
            text=lambda args, sub: print_fields(_fields(args.queue, sub)),
            args=(arg("queue"), arg("name")),
        ),
        Command(
            "delete",
            "delete a subscription (a work queue: with its messages' states)",
            lambda args, client: client.delete_subscription(args.queue, args.name),
            text=lambda args, _: print(f"subscription {args.queue}/{args.name} deleted"),
            json=lambda args, _: {"deleted": f"{args.queue}/{args.name}"},
            args=(arg("queue"), arg("name")),
            confirm=Confirm(
                "delete subscription {queue}/{name}?",
                "not deleting subscription {queue}/{name} without --yes",
                "not deleted",
            ),
        ),
    ),
)
