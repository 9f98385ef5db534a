"""``capella context add|list|use|show|remove``: saved servers, so commands need no ``--url``.

The file and the order in which ``--url``, the environment and contexts are chosen are in
``cli/contexts.py``. A context never holds a password; a token only as the file it is in.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from capella.cli.contexts import Context, Target, check_name, choose, load, save
from capella.cli.output import created, print_fields, print_json, print_table
from capella.client import DEFAULT_URL
from capella.errors import ContextNotFound


def add_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    context = commands.add_parser(
        "context", help="add, list, use, show and remove saved servers (contexts)", parents=[common]
    )
    actions = context.add_subparsers(dest="action", metavar="ACTION", required=True)

    # Not parents=[common]: its --url is the context's, and --user is saved, not signed in with.
    add = actions.add_parser(
        "add",
        help="save a server as a context, or replace one",
        description="Save a server under NAME. No password is ever saved: with --user, it comes "
        "from $CAPELLA_PASSWORD or a prompt; a bearer token is read from --token-file at each use.",
    )
    add.add_argument("name")
    add.add_argument("--url", dest="context_url", required=True, metavar="URL", help="the server's base URL")
    add.add_argument("--user", dest="context_user", metavar="NAME", help="sign in as this user")
    add.add_argument(
        "--token-file", metavar="FILE", help="sign in with the bearer token in this file (keep it 0600)"
    )
    add.add_argument("--ca-file", metavar="FILE", help="trust the CA certificates in this PEM file (https)")
    add.add_argument("--use", action="store_true", help="make it the current context (the first one is)")
    add.add_argument("--json", action="store_true", default=False, help="print JSON for programs")
    add.set_defaults(func=add_context, uses_client=False)

    listing = actions.add_parser(
        "list", help="list the saved contexts; * marks the current", parents=[common]
    )
    listing.set_defaults(func=list_contexts, uses_client=False)

    use = actions.add_parser("use", help="make a context the current one", parents=[common])
    use.add_argument("name")
    use.set_defaults(func=use_context, uses_client=False)

    show = actions.add_parser(
        "show",
        help="show a context; without NAME, the server commands would use now, and why",
        parents=[common],
    )
    show.add_argument("name", nargs="?")
    show.set_defaults(func=show_context, uses_client=False)

    remove = actions.add_parser("remove", help="forget a context", parents=[common])
    remove.add_argument("name")
    remove.set_defaults(func=remove_context, uses_client=False)


def add_context(args: argparse.Namespace) -> int:
    name = check_name(args.name)
    contexts = load()
    existed = name in contexts.contexts
    # Saved absolute: a context is used from any directory.
    contexts.contexts[name] = Context(
        url=args.context_url,
        user=args.context_user,
        token_file=_absolute(args.token_file),
        ca_file=_absolute(args.ca_file),
    )
    if args.use or contexts.current is None:
        contexts.current = name
    file = save(contexts)
    if args.json:
        print_json(contexts.contexts[name])
    else:
        current = " (current)" if contexts.current == name else ""
        print(f"context {name} {created(not existed, 'replaced')}{current} in {file}")
    return 0


def list_contexts(args: argparse.Namespace) -> int:
    contexts = load()
    if args.json:
        print_json(contexts)
        return 0
    rows = [
        ["*" if name == contexts.current else "", name, c.url, c.user or "-", _credentials(c)]
        for name, c in sorted(contexts.contexts.items())
    ]
    print_table(["", "NAME", "URL", "USER", "SIGN_IN"], rows)
    return 0


def use_context(args: argparse.Namespace) -> int:
    contexts = load()
    _known(contexts.contexts, args.name)
    contexts.current = args.name
    save(contexts)
    if args.json:
        print_json({"current": args.name})
    else:
        print(f"context {args.name} is current")
    return 0


def show_context(args: argparse.Namespace) -> int:
    if args.name is not None:
        contexts = load()
        saved = _known(contexts.contexts, args.name)
        source = "the current context" if contexts.current == args.name else "saved"
        target = Target(saved.url, source, args.name, saved)
    else:
        target = choose(args.url, args.context, DEFAULT_URL)
    name, source, url, context = target.name, target.source, target.url, target.context
    if args.json:
        print_json({"name": name, "url": url, "from": source, "context": context})
        return 0
    fields: list[tuple[str, object]] = [("name", name or "-"), ("url", url), ("from", source)]
    if context is not None:
        fields += [
            ("user", context.user or "-"),
            ("token file", context.token_file or "-"),
            ("ca file", context.ca_file or "-"),
        ]
    print_fields(fields)
    return 0


def remove_context(args: argparse.Namespace) -> int:
    contexts = load()
    _known(contexts.contexts, args.name)
    del contexts.contexts[args.name]
    if contexts.current == args.name:
        contexts.current = None
    save(contexts)
    if args.json:
        print_json({"removed": args.name})
    else:
        print(f"context {args.name} removed")
    return 0


def _known(contexts: dict[str, Context], name: str) -> Context:
    if name not in contexts:
        raise ContextNotFound(f"no context named {name!r}: see `capella context list`")
    return contexts[name]


def _credentials(context: Context) -> str:
    if context.token_file:
        return f"token in {context.token_file}"
    if context.user:
        return "password ($CAPELLA_PASSWORD or a prompt)"
    return "none"


def _absolute(file: str | None) -> str | None:
    return None if file is None else os.path.abspath(Path(file).expanduser())
