"""Who the CLI signs in as, and the client that carries it.

A name from ``--user`` (default ``$CAPELLA_USER``) with its password from ``$CAPELLA_PASSWORD``
or a prompt on a terminal; or a bearer token from ``$CAPELLA_TOKEN``. ``--user`` on the command
line wins over a token in the environment, and a token over ``$CAPELLA_USER``. Passwords and
tokens are never arguments: arguments show in ``ps`` and in shell history.
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from dataclasses import dataclass, field

from capella.client import Client
from capella.errors import Unauthorized

HINT = (
    "sign in with CAPELLA_USER and CAPELLA_PASSWORD (or --user NAME, asked for the password "
    "on a terminal), or with a token in CAPELLA_TOKEN (`capella token create`)"
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
    return Login()


def connect(args: argparse.Namespace, who: Login) -> Client:
    return Client(args.url, timeout=args.timeout, username=who.user, password=who.password, token=who.token)


def _password(user: str, url: str) -> str:
    if password := os.environ.get("CAPELLA_PASSWORD"):
        return password
    if not sys.stdin.isatty():
        raise Unauthorized(f"no password for user {user!r}: set CAPELLA_PASSWORD, or run on a terminal")
    return getpass.getpass(f"password for {user} at {url}: ")
