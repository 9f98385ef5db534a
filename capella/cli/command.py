"""One row per command: the table the command line, ``--json``, prompts and exit codes come from.

Each command module declares its rows (``Command``, under a ``Family`` such as ``queue``);
``cli.parser`` builds argparse from them and ``run`` carries one out: open what it works on
(``on``: the server by default), refuse a wrong use (``check``: exit 2), ask before destroying
(``confirm``, skipped by ``--yes``), make the call, print its answer as text or, with
``--json``, as JSON, and exit with ``exit``'s code. Nothing else adds a parser, asks or picks
the form of an answer: as ``api/route.py``'s rows are for the API.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from capella.cli.output import error, print_json

if TYPE_CHECKING:
    from capella.client import Client

A = TypeVar("A")
Opener = Callable[[argparse.Namespace], AbstractContextManager[Any]]


@dataclass(frozen=True, slots=True)
class Arg:
    """One ``add_argument``: the flags (or the name) and the options, as argparse takes them."""

    flags: tuple[str, ...]
    options: dict[str, Any]


def arg(*flags: str, **options: Any) -> Arg:
    return Arg(flags, options)


@dataclass(frozen=True, slots=True)
class Group:
    """Arguments shown under a ``title`` in the help, or (``exclusive``) of which one at most is given."""

    args: tuple[Arg | Group, ...]
    title: str | None = None
    description: str | None = None
    exclusive: bool = False
    required: bool = False


def section(title: str, description: str, *args: Arg | Group) -> Group:
    return Group(args, title, description)


def one_of(*args: Arg, required: bool = False) -> Group:
    return Group(args, exclusive=True, required=required)


@dataclass(frozen=True, slots=True)
class Confirm:
    """What a destroying command asks first; each a template over its arguments (``{name}``).

    ``question`` is asked on a terminal; ``refused`` is said, with exit 2, when there is none
    (and no ``--yes``); ``declined``, with exit 1, when the answer is not yes.
    """

    question: str
    refused: str
    declined: str


class Refused(Exception):
    """A command stops: ``message`` on stderr, exit ``status``; not an error the server sent."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


@contextmanager
def server(args: argparse.Namespace) -> Iterator[Client]:
    """The server the arguments, the environment and the contexts name, signed in."""
    # Imported here: the HTTP client is more than `capella serve` ever needs (~1 MB idle).
    from capella.cli.login import connect, login

    choose_target(args)
    with connect(args, login(args)) as client:
        yield client


def no_server(args: argparse.Namespace) -> AbstractContextManager[None]:
    """Nothing to talk to; the target is still chosen, so a wrong ``--context`` is reported."""
    choose_target(args)
    return nullcontext()


def standalone(args: argparse.Namespace) -> AbstractContextManager[None]:
    """Nothing to talk to, and no target: ``serve`` is the server, ``context`` edits the targets."""
    return nullcontext()


def choose_target(args: argparse.Namespace) -> None:
    from capella.cli.contexts import choose
    from capella.client import DEFAULT_URL

    args.target = choose(args.url, args.context, DEFAULT_URL)
    args.url = args.target.url


def the_answer(args: argparse.Namespace, answer: object) -> object:
    return answer


def success(args: argparse.Namespace, answer: object) -> int:
    return 0


def no_problem(args: argparse.Namespace) -> str | None:
    return None


@dataclass(frozen=True, slots=True)
class Command(Generic[A]):
    """One command: its ``name`` (under its family's), ``help``, ``args`` and what it does.

    ``call`` gets the arguments and what ``on`` opened (``None``: what its family opens, a
    signed-in ``Client`` by default) and gives the answer; ``text`` prints it for people,
    ``json`` is what ``--json`` prints (the answer itself by default). ``text=None``: the call
    prints as it goes (a stream, or output that is never JSON). ``check`` names a wrong use
    before anything is done (exit 2); ``exit`` is the exit code for the answer (0 by default)
    and says on stderr why it is not 0.
    ``common``: the command takes the global options (``--url``, ``--json``...) after its name.
    """

    name: str
    help: str
    call: Callable[[argparse.Namespace, Any], A]
    text: Callable[[argparse.Namespace, A], object] | None
    json: Callable[[argparse.Namespace, A], object] = the_answer
    args: tuple[Arg | Group, ...] = ()
    description: str | None = None
    on: Opener | None = None
    check: Callable[[argparse.Namespace], str | None] = no_problem
    confirm: Confirm | None = None
    exit: Callable[[argparse.Namespace, A], int] = success
    common: bool = True


def drop(
    kind: str,
    help: str,
    call: Callable[[argparse.Namespace, Any], None],
    *,
    question: str | None = None,
    args: tuple[Arg | Group, ...] = (),
) -> Command[None]:
    """``KIND drop NAME``: asks ``question`` first (``drop KIND NAME?``); prints ``KIND NAME dropped``."""
    return Command(
        "drop",
        help,
        call,
        text=lambda args, _: print(f"{kind} {args.name} dropped"),
        json=lambda args, _: {"dropped": args.name},
        args=(*args, arg("name")),
        confirm=Confirm(
            question or f"drop {kind} {{name}}?", f"not dropping {kind} {{name}} without --yes", "not dropped"
        ),
    )


@dataclass(frozen=True, slots=True)
class Family:
    """A word that gathers commands: ``queue`` for ``queue create``, ``queue drop``...

    ``on`` is what its commands work on, unless one says otherwise.
    """

    name: str
    help: str
    commands: tuple[Command[Any], ...]
    common: bool = True
    on: Opener = server


Row = Command[Any] | Family


def add(
    parsers: argparse._SubParsersAction[argparse.ArgumentParser],
    row: Row,
    common: argparse.ArgumentParser | None,
) -> None:
    """``row`` on the command line; ``common`` is the parser of the global options, if any."""
    parents = [common] if common is not None and row.common else []
    if isinstance(row, Family):
        family = parsers.add_parser(row.name, help=row.help, parents=parents)
        actions = family.add_subparsers(dest="action", metavar="ACTION", required=True)
        for command in row.commands:
            add(actions, replace(command, on=command.on or row.on), common if row.common else None)
        return
    parser = parsers.add_parser(row.name, help=row.help, description=row.description, parents=parents)
    _add_args(parser, row.args)
    if row.confirm is not None:
        parser.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    parser.set_defaults(row=row)


def _add_args(container: argparse._ActionsContainer, args: tuple[Arg | Group, ...]) -> None:
    for item in args:
        if isinstance(item, Arg):
            container.add_argument(*item.flags, **item.options)
        elif item.exclusive:
            _add_args(container.add_mutually_exclusive_group(required=item.required), item.args)
        else:
            _add_args(container.add_argument_group(item.title, item.description), item.args)


def run(row: Command[Any], args: argparse.Namespace) -> int:
    """Carry out the command ``row`` with its parsed ``args``: its exit code."""
    with (row.on or server)(args) as target:
        if problem := row.check(args):
            error(problem)
            return 2
        if row.confirm is not None and not args.yes and (refusal := _refusal(row.confirm, args)):
            return refusal
        try:
            answer = row.call(args, target)
        except Refused as exc:
            error(exc.message)
            return exc.status
        if row.text is not None:
            show(args, answer, row.text, row.json)
        return row.exit(args, answer)


def show(
    args: argparse.Namespace,
    answer: A,
    text: Callable[[argparse.Namespace, A], object],
    json: Callable[[argparse.Namespace, A], object] = the_answer,
) -> None:
    """An answer as JSON with ``--json``, else as ``text`` prints it."""
    if args.json:
        print_json(json(args, answer))
    else:
        text(args, answer)


def _refusal(confirm: Confirm, args: argparse.Namespace) -> int:
    """0 when the user says yes; else the exit code, once the reason is on stderr."""
    words = vars(args)
    if not sys.stdin.isatty():
        error(confirm.refused.format(**words))
        return 2
    if input(f"{confirm.question.format(**words)} [y/N] ").strip().lower() not in ("y", "yes"):
        error(confirm.declined)
        return 1
    return 0
