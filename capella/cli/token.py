"""``capella token create|list|revoke``: bearer tokens for programs and scripts.

``token create`` prints only the token's text, so ``export CAPELLA_TOKEN=$(capella token
create --ttl 8h)`` works; the server shows it this once and keeps a digest. A token cannot
create tokens: ``create`` signs in with a name and password.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime

from capella.cli.output import print_json, print_table
from capella.client import Client


def add_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    token = commands.add_parser("token", help="create, list and revoke bearer tokens", parents=[common])
    actions = token.add_subparsers(dest="action", metavar="ACTION", required=True)

    # Not parents=[common]: its --user (who signs in) would clash with the token's owner.
    create = actions.add_parser(
        "create",
        help="create a token and print it (shown only this once)",
        description="Print a new bearer token. Who signs in (--user) goes before `token`; "
        "--user here names the token's owner.",
    )
    create.add_argument("--ttl", metavar="DUR", help="lifetime such as 8h or 30d (default: auth.token_ttl)")
    create.add_argument("--description", metavar="TEXT", help="what the token is for")
    create.add_argument(
        "--user",
        dest="owner",
        metavar="NAME",
        help="a token for this user (needs user admin on it and everything it holds)",
    )
    create.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print the whole answer as JSON"
    )
    create.set_defaults(func=create_token, uses_client=True)

    listing = actions.add_parser("list", help="list your tokens (never their text)", parents=[common])
    listing.set_defaults(func=list_tokens, uses_client=True)

    revoke = actions.add_parser("revoke", help="revoke a token at once", parents=[common])
    revoke.add_argument("id")
    revoke.set_defaults(func=revoke_token, uses_client=True)


def create_token(args: argparse.Namespace, client: Client) -> int:
    answer = client.create_token(ttl=args.ttl, description=args.description, user=args.owner)
    if args.json:
        print_json(answer)
    else:
        print(answer.token)
    return 0


def list_tokens(args: argparse.Namespace, client: Client) -> int:
    tokens = client.tokens()
    if args.json:
        print_json(tokens)
        return 0
    rows = [
        [info.id, info.user, _time(info.created), _time(info.expires), info.description or "-"]
        for info in tokens
    ]
    print_table(["ID", "USER", "CREATED", "EXPIRES", "DESCRIPTION"], rows)
    return 0


def revoke_token(args: argparse.Namespace, client: Client) -> int:
    client.revoke_token(args.id)
    if args.json:
        print_json({"revoked": args.id})
    else:
        print(f"token {args.id} revoked")
    return 0


def _time(value: float | None) -> str:
    if value is None:
        return "never"
    return datetime.fromtimestamp(float(value), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
