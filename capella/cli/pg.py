"""``capella pg outbox-ddl|inbox-ddl``: the SQL of the tables the pg_outbox and pg_inbox handlers use.

Both print to stdout and need no server, so ``capella pg outbox-ddl --notify | psql app``
creates the outbox table with the trigger that wakes the relay at each commit.
"""

from __future__ import annotations

import argparse

from capella.cli.command import Command, Family, arg, no_server
from capella.handlers.pg_inbox import inbox_ddl
from capella.handlers.pg_outbox import outbox_ddl


# SQL for psql, never JSON: the calls print it themselves (text=None), whatever --json says.
def print_outbox_ddl(args: argparse.Namespace, _: None) -> None:
    print(outbox_ddl(args.table, notify=args.notify, keep=args.keep), end="")


def print_inbox_ddl(args: argparse.Namespace, _: None) -> None:
    print(inbox_ddl(args.table), end="")


PG = Family(
    "pg",
    "print the SQL of the PostgreSQL outbox and inbox tables",
    (
        Command(
            "outbox-ddl",
            "print the outbox table's CREATE TABLE",
            print_outbox_ddl,
            text=None,
            args=(
                arg("--table", default="capella_outbox", help="the table (default capella_outbox)"),
                arg(
                    "--notify",
                    action="store_true",
                    help="add the trigger that wakes the relay at each commit",
                ),
                arg("--keep", action="store_true", help="add relayed_at, for a relay with delete: false"),
            ),
        ),
        Command(
            "inbox-ddl",
            "print the inbox table's CREATE TABLE",
            print_inbox_ddl,
            text=None,
            args=(arg("--table", default="capella_inbox", help="the table (default capella_inbox)"),),
        ),
    ),
    common=False,
    on=no_server,
)
