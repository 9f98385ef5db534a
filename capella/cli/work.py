"""``capella work claim|ack|nack|list|retry|delete``: a work queue (ack-mode subscription).

``claim``, ``ack`` and ``nack`` are what a worker does, for scripts and trying things out;
``list``, ``retry`` and ``delete`` are the operator's view (docs/work-queues.md).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from msgspec import UnsetType

from capella.cli.arguments import add_message_filters
from capella.cli.output import error, print_json, print_table, text_of, utc
from capella.cli.progress import Progress
from capella.client import Client
from capella.wire.work import DeletedWork, ReceiptResult, RetriedWork

STATUSES = ("pending", "in_flight", "failed", "dead")


def add_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    work = commands.add_parser(
        "work", help="claim, ack, nack, list, retry and delete work-queue messages", parents=[common]
    )
    actions = work.add_subparsers(dest="action", metavar="ACTION", required=True)

    def action(name: str, help_text: str) -> argparse.ArgumentParser:
        parser = actions.add_parser(name, help=help_text, parents=[common])
        parser.add_argument("queue")
        parser.add_argument("subscription", help="the ack-mode subscription")
        return parser

    claim = action("claim", "lease messages: due retries first, then new ones in id order")
    claim.add_argument("--limit", type=int, default=1, metavar="N", help="at most N (default 1)")
    claim.add_argument("--lease", metavar="DURATION", help="how long to hold them (default: the policy's)")
    claim.add_argument("--wait", type=float, metavar="SECONDS", help="long-poll when nothing is ready")
    claim.set_defaults(func=claim_messages, uses_client=True)

    ack = action("ack", "finish claimed messages")
    ack.add_argument("receipts", nargs="+", metavar="RECEIPT")
    ack.set_defaults(func=answer_receipts, uses_client=True)

    nack = action("nack", "give claimed messages back: retried by the policy, or dead")
    nack.add_argument("receipts", nargs="+", metavar="RECEIPT")
    nack.add_argument("--delay", metavar="DURATION", help="retry after this (default: the backoff)")
    nack.add_argument("--error", metavar="TEXT", help="why it failed, kept with the message")
    nack.set_defaults(func=answer_receipts, uses_client=True)

    listing = action("list", "messages by status, in id order")
    _selection(listing)
    listing.add_argument("--after", type=int, default=0, metavar="ID", help="start after this id")
    listing.add_argument("--limit", type=int, default=100, metavar="N", help="at most N (default 100)")
    listing.set_defaults(func=list_work, uses_client=True)

    retry = action("retry", "make waiting messages claimable now (or --at), and move dead ones back")
    _selection(retry)
    retry.add_argument(
        "--id", dest="ids", type=int, action="append", metavar="ID", help="this message (repeat)"
    )
    when = retry.add_mutually_exclusive_group()
    when.add_argument("--at", metavar="TIME", help="claimable from this time (RFC 3339 or UNIX seconds)")
    when.add_argument("--delay", metavar="DURATION", help="claimable after this long")
    retry.set_defaults(func=retry_work, uses_client=True)

    delete = action("delete", "finish messages without processing them")
    _selection(delete)
    delete.add_argument(
        "--id", dest="ids", type=int, action="append", metavar="ID", help="this message (repeat)"
    )
    delete.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    delete.set_defaults(func=delete_work, uses_client=True)


def _selection(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--status", action="append", choices=STATUSES, help="only messages with this status (repeat)"
    )
    add_message_filters(parser)


def claim_messages(args: argparse.Namespace, client: Client) -> int:
    claimed = client.claim(args.queue, args.subscription, limit=args.limit, lease=args.lease, wait=args.wait)
    if args.json:
        print_json(claimed)
        return 0
    rows = [[str(m.id), m.receipt, str(m.attempt), utc(m.lease_until), text_of(m)] for m in claimed]
    print_table(["ID", "RECEIPT", "ATTEMPT", "LEASE_UNTIL", "DATA"], rows)
    return 0


def answer_receipts(args: argparse.Namespace, client: Client) -> int:
    if args.action == "ack":
        answer = client.ack(args.queue, args.subscription, args.receipts)
    else:
        answer = client.nack(args.queue, args.subscription, args.receipts, delay=args.delay, error=args.error)
    results = answer if isinstance(answer, list) else [answer]
    if args.json:
        print_json(results)
    else:
        for result in results:
            print(_outcome(args.action, result))
    return 0 if all(r.ok for r in results) else 1


def _outcome(verb: str, result: ReceiptResult) -> str:
    error = result.error
    if not isinstance(error, UnsetType):
        return f"{result.receipt}: {error.code}: {error.message}"
    if verb == "ack":
        return f"{result.receipt}: done"
    if result.dead is True:
        return f"{result.receipt}: dead (its attempts are used up)"
    retry_at = None if isinstance(result.retry_at, UnsetType) else result.retry_at
    return f"{result.receipt}: retry at {utc(retry_at)}"


def list_work(args: argparse.Namespace, client: Client) -> int:
    page = client.work(
        args.queue,
        args.subscription,
        status=args.status,
        source=args.source,
        headers=dict(args.headers) or None,
        after=args.after,
        limit=args.limit,
    )
    if args.json:
        print_json(page)
        return 0
    rows = [[str(m.id), m.status, str(m.attempts), m.last_error or "-", text_of(m)] for m in page.messages]
    print_table(["ID", "STATUS", "ATTEMPTS", "LAST_ERROR", "DATA"], rows)
    if page.next_after is not None:
        print(f"more: --after {page.next_after}")
    return 0


def retry_work(args: argparse.Namespace, client: Client) -> int:
    def page(selection: dict[str, Any]) -> tuple[list[int], int | None]:
        answer = client.retry_work(args.queue, args.subscription, **selection)
        return answer.retried, answer.next_after

    retried = _every_page(page, _selected(args) | _when(args), Progress("retried"))
    if args.json:
        print_json(RetriedWork(retried=retried, next_after=None))
    else:
        print(f"retried {len(retried)}")
    return 0


def delete_work(args: argparse.Namespace, client: Client) -> int:
    if not args.status and not args.ids:
        error("say which messages: --status or --id")
        return 2
    if not args.yes:
        if not sys.stdin.isatty():
            error("not deleting without --yes")
            return 2
        if input("finish these messages without processing them? [y/N] ").strip().lower() not in ("y", "yes"):
            error("not deleted")
            return 1

    def page(selection: dict[str, Any]) -> tuple[list[int], int | None]:
        answer = client.delete_work(args.queue, args.subscription, **selection)
        return answer.deleted, answer.next_after

    deleted = _every_page(page, _selected(args), Progress("deleted"))
    if args.json:
        print_json(DeletedWork(deleted=deleted, next_after=None))
    else:
        print(f"deleted {len(deleted)}")
    return 0


def _every_page(
    page: Callable[[dict[str, Any]], tuple[list[int], int | None]],
    selection: dict[str, Any],
    progress: Progress,
) -> list[int]:
    """The ids a bulk call changed, over every page: the server looks at one page per request."""
    done: list[int] = []
    while True:
        ids, next_after = page(selection)
        done += ids
        progress.add(len(ids))
        if next_after is None:
            progress.finish()
            return done
        selection = selection | {"after": next_after}


def _selected(args: argparse.Namespace) -> dict[str, Any]:
    selection: dict[str, Any] = {"status": args.status, "ids": args.ids, "source": args.source}
    if args.headers:
        selection["headers"] = dict(args.headers)
    return {key: value for key, value in selection.items() if value}


def _when(args: argparse.Namespace) -> dict[str, Any]:
    if args.at is not None:
        try:
            return {"at": float(args.at)}
        except ValueError:
            return {"at": args.at}
    return {"delay": args.delay} if args.delay is not None else {}
