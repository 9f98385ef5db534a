"""``capella context add|list|use|show|remove``: saved servers, so commands need no ``--url``.

The file and the order in which ``--url``, the environment and contexts are chosen are in
``cli/contexts.py``. A context never holds a password; a token only as the file it is in.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any, NamedTuple

from capella.cli.command import Command, Family, arg, standalone
from capella.cli.contexts import Context, Contexts, Target, check_name, choose, load, save
from capella.cli.output import created, print_fields, print_table
from capella.client import DEFAULT_URL
from capella.errors import ContextNotFound


class Added(NamedTuple):
    """What ``context add`` saved: the file's contexts, and the new one in the file."""

    contexts: Contexts
    name: str
    existed: bool
    file: Path


def add_context(args: argparse.Namespace, _: None) -> Added:
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
    return Added(contexts, name, existed, save(contexts))


def print_added(args: argparse.Namespace, added: Added) -> None:
    contexts, name, existed, file = added
    current = " (current)" if contexts.current == name else ""
    print(f"context {name} {created(not existed, 'replaced')}{current} in {file}")


def print_contexts(args: argparse.Namespace, contexts: Contexts) -> None:
    rows = [
        ["*" if name == contexts.current else "", name, c.url, c.user or "-", _credentials(c)]
        for name, c in sorted(contexts.contexts.items())
    ]
    print_table(["", "NAME", "URL", "USER", "SIGN_IN"], rows)


def use_context(args: argparse.Namespace, _: None) -> None:
    contexts = load()
    _known(contexts.contexts, args.name)
    contexts.current = args.name
    save(contexts)


def show_context(args: argparse.Namespace, _: None) -> Target:
    if args.name is not None:
        contexts = load()
        saved = _known(contexts.contexts, args.name)
        source = "the current context" if contexts.current == args.name else "saved"
        target = Target(saved.url, source, args.name, saved)
    else:
        target = choose(args.url, args.context, DEFAULT_URL)
    return target


def target_json(args: argparse.Namespace, target: Target) -> dict[str, Any]:
    return {"name": target.name, "url": target.url, "from": target.source, "context": target.context}


def print_target(args: argparse.Namespace, target: Target) -> None:
    name, source, url, context = target.name, target.source, target.url, target.context
    fields: list[tuple[str, object]] = [("name", name or "-"), ("url", url), ("from", source)]
    if context is not None:
        fields += [
            ("user", context.user or "-"),
            ("token file", context.token_file or "-"),
            ("ca file", context.ca_file or "-"),
        ]
    print_fields(fields)


def remove_context(args: argparse.Namespace, _: None) -> None:
    contexts = load()
    _known(contexts.contexts, args.name)
    del contexts.contexts[args.name]
    if contexts.current == args.name:
        contexts.current = None
    save(contexts)


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


CONTEXT = Family(
    "context",
    "add, list, use, show and remove saved servers (contexts)",
    (
        # Not the common options: its --url is the context's, and --user is saved, not signed in with.
        Command(
            "add",
            "save a server as a context, or replace one",
            add_context,
            text=print_added,
            json=lambda args, added: added.contexts.contexts[added.name],
            description="Save a server under NAME. No password is ever saved: with --user, it comes "
            "from $CAPELLA_PASSWORD or a prompt; a bearer token is read from --token-file at each use.",
            args=(
                arg("name"),
                arg("--url", dest="context_url", required=True, metavar="URL", help="the server's base URL"),
                arg("--user", dest="context_user", metavar="NAME", help="sign in as this user"),
                arg(
                    "--token-file",
                    metavar="FILE",
                    help="sign in with the bearer token in this file (keep it 0600)",
                ),
                arg("--ca-file", metavar="FILE", help="trust the CA certificates in this PEM file (https)"),
                arg("--use", action="store_true", help="make it the current context (the first one is)"),
                arg("--json", action="store_true", default=False, help="print JSON for programs"),
            ),
            common=False,
        ),
        Command(
            "list",
            "list the saved contexts; * marks the current",
            lambda args, _: load(),
            text=print_contexts,
        ),
        Command(
            "use",
            "make a context the current one",
            use_context,
            text=lambda args, _: print(f"context {args.name} is current"),
            json=lambda args, _: {"current": args.name},
            args=(arg("name"),),
        ),
        Command(
            "show",
            "show a context; without NAME, the server commands would use now, and why",
            show_context,
            text=print_target,
            json=target_json,
            args=(arg("name", nargs="?"),),
        ),
        Command(
            "remove",
            "forget a context",
            remove_context,
            text=lambda args, _: print(f"context {args.name} removed"),
            json=lambda args, _: {"removed": args.name},
            args=(arg("name"),),
        ),
    ),
    on=standalone,
)
