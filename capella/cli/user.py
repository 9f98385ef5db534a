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
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import msgspec

from capella.auth.password import check_password
from capella.auth.rule import AccessRule
from capella.auth.store import Account, AuthStore
from capella.cli.login import Login, connect, login
from capella.cli.output import error, print_fields, print_json, print_table, utc
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


Command = Callable[[argparse.Namespace, Users, Login], int]


def add_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    offline = argparse.ArgumentParser(add_help=False)
    offline.add_argument(
        "--data-dir",
        type=Path,
        metavar="DIR",
        help="change this data directory's users directly instead of a server's (stop the server first)",
    )
    offline.add_argument(
        "--config", type=Path, metavar="FILE", help="like --data-dir, with the data directory of this config"
    )
    rules = argparse.ArgumentParser(add_help=False)
    for effect in ("allow", "deny"):
        rules.add_argument(
            f"--{effect}",
            action="append",
            type=_rule(effect),
            default=[],
            metavar="RULE",
            help=f"{effect} TYPE:ACTION:PATTERN, e.g. queue:read:orders-* (repeat for more)",
        )
    password = argparse.ArgumentParser(add_help=False)
    password.add_argument(
        "--password-stdin",
        action="store_true",
        help="read the new password from the first line of standard input instead of a prompt",
    )
    parents = [common, offline]

    user = commands.add_parser(
        "user",
        help="add, change, list and drop users (also offline, on a data directory)",
        parents=[common],
    )
    actions = user.add_subparsers(dest="action", metavar="ACTION", required=True)

    add = actions.add_parser("add", help="add a user", parents=[*parents, rules, password])
    add.add_argument("name")
    add.add_argument("--admin", action="store_true", help="may do everything, including managing users")
    add.set_defaults(func=_run(add_user), uses_client=False)

    passwd = actions.add_parser("passwd", help="set a user's password", parents=[*parents, password])
    passwd.add_argument("name")
    passwd.set_defaults(func=_run(change_password), uses_client=False)

    for action, help_text in (("enable", "let a user sign in again"), ("disable", "stop a user signing in")):
        command = actions.add_parser(action, help=help_text, parents=parents)
        command.add_argument("name")
        command.set_defaults(func=_run(enable_user), uses_client=False)

    listing = actions.add_parser("list", help="list users and their rules", parents=parents)
    listing.set_defaults(func=_run(list_users), uses_client=False)

    show = actions.add_parser("show", help="show a user (never its password)", parents=parents)
    show.add_argument("name")
    show.set_defaults(func=_run(show_user), uses_client=False)

    replace = actions.add_parser(
        "rules",
        help="replace a user's rules",
        description="Replace the user's rules with the --allow and --deny given (none: no rules). "
        "Deny wins over allow; no matching rule means no.",
        parents=[*parents, rules],
    )
    replace.add_argument("name")
    replace.set_defaults(func=_run(set_rules), uses_client=False)

    drop = actions.add_parser("drop", help="delete a user and revoke its tokens", parents=parents)
    drop.add_argument("name")
    drop.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    drop.set_defaults(func=_run(drop_user), uses_client=False)


def add_user(args: argparse.Namespace, users: Users, who: Login) -> int:
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
    info = users.put_user(args.name, **fields)
    if args.json:
        print_json(info)
    else:
        print(f"user {args.name} added{' (admin)' if info.admin else ''}")
    return 0


def change_password(args: argparse.Namespace, users: Users, who: Login) -> int:
    users.user(args.name)
    new = _new_password(args)
    # The server wants the old password from a user who changes its own without `user admin`.
    old = who.password if who.user == args.name else None
    info = users.change_password(args.name, new, old)
    if args.json:
        print_json(info)
    else:
        print(f"password of user {args.name} changed")
    return 0


def enable_user(args: argparse.Namespace, users: Users, who: Login) -> int:
    users.user(args.name)  # a PUT would try to create a missing user
    info = users.put_user(args.name, enabled=args.action == "enable")
    if args.json:
        print_json(info)
    else:
        print(f"user {args.name} {args.action}d")
    return 0


def list_users(args: argparse.Namespace, users: Users, who: Login) -> int:
    found = users.users()
    if args.json:
        print_json(found)
        return 0
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
    return 0


def show_user(args: argparse.Namespace, users: Users, who: Login) -> int:
    info = users.user(args.name)
    if args.json:
        print_json(info)
        return 0
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
    return 0


def set_rules(args: argparse.Namespace, users: Users, who: Login) -> int:
    users.user(args.name)
    info = users.put_user(args.name, rules=_rules(args))
    if args.json:
        print_json(info)
    else:
        count = len(info.rules)
        print(f"user {args.name} has {count} rule{'' if count == 1 else 's'}")
    return 0


def drop_user(args: argparse.Namespace, users: Users, who: Login) -> int:
    if not args.yes:
        if not sys.stdin.isatty():
            error(f"not dropping user {args.name} without --yes")
            return 2
        answer = input(f"drop user {args.name} and revoke its tokens? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            error("not dropped")
            return 1
    users.drop_user(args.name)
    if args.json:
        print_json({"dropped": args.name})
    else:
        print(f"user {args.name} dropped")
    return 0


def _run(command: Command) -> Callable[[argparse.Namespace], int]:
    """Run ``command`` against the server, or on the data directory when one is named."""

    def run(args: argparse.Namespace) -> int:
        if args.data_dir is None and args.config is None:
            who = login(args)
            with connect(args, who) as client:
                return command(args, client, who)
        config = load_config(args.config, {"data_dir": args.data_dir})
        store = AuthStore(config.data_dir / "auth")
        store.lock()
        try:
            return command(args, StoreUsers(store), Login())
        finally:
            store.unlock()

    return run


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
