"""``capella work claim|ack|nack|list|retry|delete``: a work queue (ack-mode subscription).

``claim``, ``ack`` and ``nack`` are what a worker does, for scripts and trying things out;
``list``, ``retry`` and ``delete`` are the operator's view (docs/work-queues.md).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from msgspec import UnsetType

from capella.cli.arguments import MESSAGE_FILTERS
from capella.cli.command import Arg, Command, Confirm, Family, Group, arg, one_of
from capella.cli.output import print_table, text_of, utc
from capella.cli.progress import Progress
from capella.client import Client
from capella.wire.work import ClaimedMessage, DeletedWork, ReceiptResult, RetriedWork, WorkList

STATUSES = ("pending", "in_flight", "failed", "dead")


def print_claimed(args: argparse.Namespace, claimed: list[ClaimedMessage]) -> None:
    rows = [[str(m.id), m.receipt, str(m.attempt), utc(m.lease_until), text_of(m)] for m in claimed]
    print_table(["ID", "RECEIPT", "ATTEMPT", "LEASE_UNTIL", "DATA"], rows)


def answer_receipts(args: argparse.Namespace, client: Client) -> list[ReceiptResult]:
    if args.action == "ack":
        answer = client.ack(args.queue, args.subscription, args.receipts)
    else:
        answer = client.nack(args.queue, args.subscription, args.receipts, delay=args.delay, error=args.error)
    return answer if isinstance(answer, list) else [answer]


def print_outcomes(args: argparse.Namespace, results: list[ReceiptResult]) -> None:
    for result in results:
        print(_outcome(args.action, result))


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


def list_work(args: argparse.Namespace, client: Client) -> WorkList:
    return client.work(
        args.queue,
        args.subscription,
        status=args.status,
        source=args.source,
        headers=dict(args.headers) or None,
        after=args.after,
        limit=args.limit,
    )


def print_work(args: argparse.Namespace, page: WorkList) -> None:
    rows = [[str(m.id), m.status, str(m.attempts), m.last_error or "-", text_of(m)] for m in page.messages]
    print_table(["ID", "STATUS", "ATTEMPTS", "LAST_ERROR", "DATA"], rows)
    if page.next_after is not None:
        print(f"more: --after {page.next_after}")


def retry_work(args: argparse.Namespace, client: Client) -> RetriedWork:
    def page(selection: dict[str, Any]) -> tuple[list[int], int | None]:
        answer = client.retry_work(args.queue, args.subscription, **selection)
        return answer.retried, answer.next_after

    retried = _every_page(page, _selected(args) | _when(args), Progress("retried"))
    return RetriedWork(retried=retried, next_after=None)


def _which(args: argparse.Namespace) -> str | None:
    return None if args.status or args.ids else "say which messages: --status or --id"


def delete_work(args: argparse.Namespace, client: Client) -> DeletedWork:
    def page(selection: dict[str, Any]) -> tuple[list[int], int | None]:
        answer = client.delete_work(args.queue, args.subscription, **selection)
        return answer.deleted, answer.next_after

    deleted = _every_page(page, _selected(args), Progress("deleted"))
    return DeletedWork(deleted=deleted, next_after=None)


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


# Every work command names the queue and the ack-mode subscription first.
ON = (arg("queue"), arg("subscription", help="the ack-mode subscription"))
SELECTION: tuple[Arg | Group, ...] = (
    arg("--status", action="append", choices=STATUSES, help="only messages with this status (repeat)"),
    *MESSAGE_FILTERS,
)


def _answer(action: str, help_text: str, *options: Arg) -> Command[list[ReceiptResult]]:
    """``ack`` or ``nack`` the receipts; exit 1 when one was not answered."""
    return Command(
        action,
        help_text,
        answer_receipts,
        text=print_outcomes,
        args=(*ON, arg("receipts", nargs="+", metavar="RECEIPT"), *options),
        exit=lambda args, results: 0 if all(r.ok for r in results) else 1,
    )


IDS = arg("--id", dest="ids", type=int, action="append", metavar="ID", help="this message (repeat)")

WORK = Family(
    "work",
    "claim, ack, nack, list, retry and delete work-queue messages",
    (
        Command(
            "claim",
            "lease messages: due retries first, then new ones in id order",
            lambda args, client: client.claim(
                args.queue, args.subscription, limit=args.limit, lease=args.lease, wait=args.wait
            ),
            text=print_claimed,
            args=(
                *ON,
                arg("--limit", type=int, default=1, metavar="N", help="at most N (default 1)"),
                arg("--lease", metavar="DURATION", help="how long to hold them (default: the policy's)"),
                arg("--wait", type=float, metavar="SECONDS", help="long-poll when nothing is ready"),
            ),
        ),
        _answer("ack", "finish claimed messages"),
        _answer(
            "nack",
            "give claimed messages back: retried by the policy, or dead",
            arg("--delay", metavar="DURATION", help="retry after this (default: the backoff)"),
            arg("--error", metavar="TEXT", help="why it failed, kept with the message"),
        ),
        Command(
            "list",
            "messages by status, in id order",
            list_work,
            text=print_work,
            args=(
                *ON,
                *SELECTION,
                arg("--after", type=int, default=0, metavar="ID", help="start after this id"),
                arg("--limit", type=int, default=100, metavar="N", help="at most N (default 100)"),
            ),
        ),
        Command(
            "retry",
            "make waiting messages claimable now (or --at), and move dead ones back",
            retry_work,
            text=lambda args, answer: print(f"retried {len(answer.retried)}"),
            args=(
                *ON,
                *SELECTION,
                IDS,
                one_of(
                    arg("--at", metavar="TIME", help="claimable from this time (RFC 3339 or UNIX seconds)"),
                    arg("--delay", metavar="DURATION", help="claimable after this long"),
                ),
            ),
        ),
        Command(
            "delete",
            "finish messages without processing them",
            delete_work,
            text=lambda args, answer: print(f"deleted {len(answer.deleted)}"),
            args=(*ON, *SELECTION, IDS),
            check=_which,
            confirm=Confirm(
                "finish these messages without processing them?", "not deleting without --yes", "not deleted"
            ),
        ),
    ),
)
