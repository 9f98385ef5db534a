"""``capella user add|passwd|enable|disable|list|show|rules|drop``: who may connect.

Through a running server's API, or with ``--data-dir``/``--config`` straight on the users file
of a stopped server: that is how the first admin is made (``capella user add admin --admin
--data-dir ./capella-data``). A running server holds the directory's lock, so the offline
commands refuse to write under it. New passwords come from a prompt (asked twice) or one line
of ``--password-stdin``, never from an argument: arguments show in ``ps``.
"""

from __future__ import annotations

import argparse
import getpass
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import msgspec

from capella.auth.password import check_password
from capella.auth.rule import AccessRule
from capella.auth.store import Account, AuthStore
from capella.cli.command import Command, Family, arg, choose_target, drop
from capella.cli.login import Login, connect, login
from capella.cli.output import print_fields, print_table, utc
from capella.config import load_config
from capella.errors import AlreadyExists, InvalidRequest, UserNotFound
from capella.wire.auth import User


class Users(Protocol):
    """What the commands need: ``Client`` online, ``StoreUsers`` offline."""

    def users(self) -> list[User]: ...

    def user(self, name: str) -> User: ...

    def put_user(self, name: str, **fields: Any) -> User: ...

    def drop_user(self, name: str) -> None: ...

    def change_password(self, name: str, password: str, old_password: str | None = None) -> User: ...


class StoreUsers:
    """The same calls, and the same answers as the API, on an ``AuthStore`` this process holds."""

    def __init__(self, store: AuthStore) -> None:
        self._store = store

    def users(self) -> list[User]:
        return [_shown(u) for u in self._store.users()]

    def user(self, name: str) -> User:
        return _shown(self._store.user(name))

    def put_user(self, name: str, **fields: Any) -> User:
        return _shown(self._store.put_user(name, fields)[0])

    def drop_user(self, name: str) -> None:
        self._store.drop_user(name)

    def change_password(self, name: str, password: str, old_password: str | None = None) -> User:
        # Whoever can write the data directory needs no old password.
        self._store.user(name)
        return _shown(self._store.put_user(name, {"password": password})[0])


def _shown(user: Account) -> User:
    """A stored user as the API shows it: the same wire struct the client returns."""
    return user.shown()


@dataclass(frozen=True, slots=True)
class Access:
    """What a ``user`` command works on: the users, and who signed in to reach them."""

    users: Users
    who: Login


@contextmanager
def users_of(args: argparse.Namespace) -> Iterator[Access]:
    """The server's users, or the data directory's when one is named (``--data-dir``, ``--config``)."""
    choose_target(args)
    if args.data_dir is None and args.config is None:
        who = login(args)
        with connect(args, who) as client:
            yield Access(client, who)
        return
    config = load_config(args.config, {"data_dir": args.data_dir})
    store = AuthStore(config.data_dir / "auth")
    store.lock()
    try:
        yield Access(StoreUsers(store), Login())
    finally:
        store.unlock()


def add_user(args: argparse.Namespace, access: Access) -> User:
    users = access.users
    # Ask before the prompt: PUT would otherwise reset an existing user's password.
    if _exists(users, args.name):
        raise AlreadyExists(
            f"user {args.name!r} already exists: change it with `capella user passwd|rules|enable|disable`"
        )
    fields: dict[str, Any] = {"password": _new_password(args)}
    # Sent only when asked for: only an admin may set them, and a user manager may still add users.
    if args.admin:
        fields["admin"] = True
    if args.allow or args.deny:
        fields["rules"] = _rules(args)
    return users.put_user(args.name, **fields)


def change_password(args: argparse.Namespace, access: Access) -> User:
    users, who = access.users, access.who
    users.user(args.name)
    new = _new_password(args)
    # The server wants the old password from a user who changes its own without `user admin`.
    old = who.password if who.user == args.name else None
    return users.change_password(args.name, new, old)


def enable_user(args: argparse.Namespace, access: Access) -> User:
    access.users.user(args.name)  # a PUT would try to create a missing user
    return access.users.put_user(args.name, enabled=args.action == "enable")


def print_users(args: argparse.Namespace, found: list[User]) -> None:
    rows = [
        [
            info.name,
            "yes" if info.admin else "no",
            "yes" if info.enabled else "no",
            " ".join(str(AccessRule.parse(msgspec.to_builtins(r))) for r in info.rules) or "-",
        ]
        for info in found
    ]
    print_table(["NAME", "ADMIN", "ENABLED", "RULES"], rows)


def print_user(args: argparse.Namespace, info: User) -> None:
    rules = [str(AccessRule.parse(msgspec.to_builtins(r))) for r in info.rules]
    print_fields(
        [
            ("name", info.name),
            ("admin", "yes" if info.admin else "no"),
            ("enabled", "yes" if info.enabled else "no"),
            ("rules", " ".join(rules) or "-"),
            ("created", utc(info.created)),
            ("updated", utc(info.updated)),
        ]
    )


def set_rules(args: argparse.Namespace, access: Access) -> User:
    access.users.user(args.name)
    return access.users.put_user(args.name, rules=_rules(args))


def print_rules(args: argparse.Namespace, info: User) -> None:
    count = len(info.rules)
    print(f"user {args.name} has {count} rule{'' if count == 1 else 's'}")


def _exists(users: Users, name: str) -> bool:
    try:
        users.user(name)
    except UserNotFound:
        return False
    return True


def _new_password(args: argparse.Namespace) -> str:
    if args.password_stdin:
        return check_password(sys.stdin.readline().rstrip("\r\n"))
    if not sys.stdin.isatty():
        raise InvalidRequest(
            "no terminal to ask for the new password on: pipe it in with --password-stdin", field="password"
        )
    password = check_password(getpass.getpass(f"new password for {args.name}: "))
    if getpass.getpass("the same again: ") != password:
        raise InvalidRequest("the two passwords differ", field="password")
    return password


def _rules(args: argparse.Namespace) -> list[dict[str, Any]]:
    return [msgspec.to_builtins(rule.to_wire()) for rule in [*args.allow, *args.deny]]


def _rule(effect: str) -> Callable[[str], AccessRule]:
    def parse(text: str) -> AccessRule:
        if text.count(":") < 2:
            raise argparse.ArgumentTypeError(
                f"expected TYPE:ACTION:PATTERN such as queue:read:orders-*, got {text!r}"
            )
        try:
            return AccessRule.parse(f"{effect}:{text}", f"--{effect}")
        except InvalidRequest as exc:
            raise argparse.ArgumentTypeError(exc.message) from None

    return parse


OFFLINE = (
    arg(
        "--data-dir",
        type=Path,
        metavar="DIR",
        help="change this data directory's users directly instead of a server's (stop the server first)",
    ),
    arg(
        "--config", type=Path, metavar="FILE", help="like --data-dir, with the data directory of this config"
    ),
)
RULES = tuple(
    arg(
        f"--{effect}",
        action="append",
        type=_rule(effect),
        default=[],
        metavar="RULE",
        help=f"{effect} TYPE:ACTION:PATTERN, e.g. queue:read:orders-* (repeat for more)",
    )
    for effect in ("allow", "deny")
)
PASSWORD = arg(
    "--password-stdin",
    action="store_true",
    help="read the new password from the first line of standard input instead of a prompt",
)

USER = Family(
    "user",
    "add, change, list and drop users (also offline, on a data directory)",
    (
        Command(
            "add",
            "add a user",
            add_user,
            text=lambda args, info: print(f"user {args.name} added{' (admin)' if info.admin else ''}"),
            args=(
                *OFFLINE,
                *RULES,
                PASSWORD,
                arg("name"),
                arg("--admin", action="store_true", help="may do everything, including managing users"),
            ),
        ),
        Command(
            "passwd",
            "set a user's password",
            change_password,
            text=lambda args, _: print(f"password of user {args.name} changed"),
            args=(*OFFLINE, PASSWORD, arg("name")),
        ),
        *(
            Command(
                action,
                help_text,
                enable_user,
                text=lambda args, _: print(f"user {args.name} {args.action}d"),
                args=(*OFFLINE, arg("name")),
            )
            for action, help_text in (
                ("enable", "let a user sign in again"),
                ("disable", "stop a user signing in"),
            )
        ),
        Command(
            "list",
            "list users and their rules",
            lambda args, access: access.users.users(),
            text=print_users,
            args=OFFLINE,
        ),
        Command(
            "show",
            "show a user (never its password)",
            lambda args, access: access.users.user(args.name),
            text=print_user,
            args=(*OFFLINE, arg("name")),
        ),
        Command(
            "rules",
            "replace a user's rules",
            set_rules,
            text=print_rules,
            description="Replace the user's rules with the --allow and --deny given (none: no rules). "
            "Deny wins over allow; no matching rule means no.",
            args=(*OFFLINE, *RULES, arg("name")),
        ),
        drop(
            "user",
            "delete a user and revoke its tokens",
            lambda args, access: access.users.drop_user(args.name),
            question="drop user {name} and revoke its tokens?",
            args=OFFLINE,
        ),
    ),
    on=users_of,
)
