"""Who the CLI signs in as, and the client that carries it.

A name from ``--user`` (default ``$CAPELLA_USER``) with its password from ``$CAPELLA_PASSWORD``
or a prompt on a terminal; or a bearer token from ``$CAPELLA_TOKEN``. ``--user`` on the command
line wins over a token in the environment, and a token over ``$CAPELLA_USER``; any of them over
the context's (its ``token_file``, else its ``user``: ``cli/contexts.py``). Passwords and
tokens are never arguments: arguments show in ``ps`` and in shell history.
"""

from __future__ import annotations

import argparse
import getpass
import os
import ssl
import sys
from dataclasses import dataclass, field

from capella.cli.contexts import Target, token_of
from capella.client import Client
from capella.errors import InvalidConfig, Unauthorized

HINT = (
    "sign in with CAPELLA_USER and CAPELLA_PASSWORD (or --user NAME, asked for the password "
    "on a terminal), with a token in CAPELLA_TOKEN (`capella token create`), or save them in a "
    "context (`capella context add NAME --url URL --user NAME`)"
)


@dataclass(frozen=True, slots=True)
class Login:
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)


def login(args: argparse.Namespace) -> Login:
    """The credentials for this run; asks for a password only when one is needed and missing."""
    if args.user:
        return Login(args.user, _password(args.user, args.url))
    if token := os.environ.get("CAPELLA_TOKEN"):
        return Login(token=token)
    if user := os.environ.get("CAPELLA_USER"):
        return Login(user, _password(user, args.url))
    context = _target(args).context
    if context is not None:
        if token := token_of(context):
            return Login(token=token)
        if context.user:
            return Login(context.user, _password(context.user, args.url))
    return Login()


def connect(args: argparse.Namespace, who: Login) -> Client:
    context = _target(args).context
    trust = None
    if context is not None and context.ca_file is not None:
        try:
            trust = ssl.create_default_context(cafile=os.path.expanduser(context.ca_file))
        except (OSError, ssl.SSLError) as exc:
            raise InvalidConfig(f"cannot use the CA file {context.ca_file}: {exc}") from None
    return Client(
        args.url, timeout=args.timeout, username=who.user, password=who.password, token=who.token, ssl=trust
    )


def _target(args: argparse.Namespace) -> Target:
    # main() chooses it for every command that may talk to a server; the default is no context.
    target = getattr(args, "target", None)
    return target if isinstance(target, Target) else Target(args.url, "--url")


def _password(user: str, url: str) -> str:
    if password := os.environ.get("CAPELLA_PASSWORD"):
        return password
    if not sys.stdin.isatty():
        raise Unauthorized(f"no password for user {user!r}: set CAPELLA_PASSWORD, or run on a terminal")
    return getpass.getpass(f"password for {user} at {url}: ")
