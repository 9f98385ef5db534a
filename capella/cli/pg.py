"""``capella pg outbox-ddl|inbox-ddl``: the SQL of the tables the pg_outbox and pg_inbox handlers use.

Both print to stdout and need no server, so ``capella pg outbox-ddl --notify | psql app``
creates the outbox table with the trigger that wakes the relay at each commit.
"""

from __future__ import annotations

import argparse

from capella.handlers.pg_inbox import inbox_ddl
from capella.handlers.pg_outbox import outbox_ddl


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    pg = commands.add_parser("pg", help="print the SQL of the PostgreSQL outbox and inbox tables")
    actions = pg.add_subparsers(dest="action", metavar="ACTION", required=True)

    outbox = actions.add_parser("outbox-ddl", help="print the outbox table's CREATE TABLE")
    outbox.add_argument("--table", default="capella_outbox", help="the table (default capella_outbox)")
    outbox.add_argument(
        "--notify", action="store_true", help="add the trigger that wakes the relay at each commit"
    )
    outbox.add_argument("--keep", action="store_true", help="add relayed_at, for a relay with delete: false")
    outbox.set_defaults(func=print_outbox_ddl, uses_client=False)

    inbox = actions.add_parser("inbox-ddl", help="print the inbox table's CREATE TABLE")
    inbox.add_argument("--table", default="capella_inbox", help="the table (default capella_inbox)")
    inbox.set_defaults(func=print_inbox_ddl, uses_client=False)


def print_outbox_ddl(args: argparse.Namespace) -> int:
    print(outbox_ddl(args.table, notify=args.notify, keep=args.keep), end="")
    return 0


def print_inbox_ddl(args: argparse.Namespace) -> int:
    print(inbox_ddl(args.table), end="")
    return 0
