"""``capella token create|list|revoke``: bearer tokens for programs and scripts.

``token create`` prints only the token's text, so ``export CAPELLA_TOKEN=$(capella token
create --ttl 8h)`` works; the server shows it this once and keeps a digest. A token cannot
create tokens: ``create`` signs in with a name and password.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime

from capella.cli.command import Command, Family, arg
from capella.cli.output import print_table
from capella.wire.auth import Token


def print_tokens(args: argparse.Namespace, tokens: list[Token]) -> None:
    rows = [
        [info.id, info.user, _time(info.created), _time(info.expires), info.description or "-"]
        for info in tokens
    ]
    print_table(["ID", "USER", "CREATED", "EXPIRES", "DESCRIPTION"], rows)


def _time(value: float | None) -> str:
    if value is None:
        return "never"
    return datetime.fromtimestamp(float(value), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


TOKEN = Family(
    "token",
    "create, list and revoke bearer tokens",
    (
        # Not the common options: their --user (who signs in) would clash with the token's owner.
        Command(
            "create",
            "create a token and print it (shown only this once)",
            lambda args, client: client.create_token(
                ttl=args.ttl, description=args.description, user=args.owner
            ),
            text=lambda args, answer: print(answer.token),
            description="Print a new bearer token. Who signs in (--user) goes before `token`; "
            "--user here names the token's owner.",
            args=(
                arg("--ttl", metavar="DUR", help="lifetime such as 8h or 30d (default: auth.token_ttl)"),
                arg("--description", metavar="TEXT", help="what the token is for"),
                arg(
                    "--user",
                    dest="owner",
                    metavar="NAME",
                    help="a token for this user (needs user admin on it and everything it holds)",
                ),
                arg(
                    "--json",
                    action="store_true",
                    default=argparse.SUPPRESS,
                    help="print the whole answer as JSON",
                ),
            ),
            common=False,
        ),
        Command(
            "list",
            "list your tokens (never their text)",
            lambda args, client: client.tokens(),
            text=print_tokens,
        ),
        Command(
            "revoke",
            "revoke a token at once",
            lambda args, client: client.revoke_token(args.id),
            text=lambda args, _: print(f"token {args.id} revoked"),
            json=lambda args, _: {"revoked": args.id},
            args=(arg("id"),),
        ),
    ),
)
