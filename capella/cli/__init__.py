"""The ``capella`` command: ``serve``, plus admin and data commands that talk to a server.

Every command but ``serve`` uses ``capella.client.Client`` against ``--url`` (default:
``$CAPELLA_URL``, else a saved context (``cli/contexts.py``), else http://127.0.0.1:8676),
signed in as ``cli/login.py`` describes (``--user``, ``$CAPELLA_USER`` + ``$CAPELLA_PASSWORD``,
``$CAPELLA_TOKEN``, or the context's); ``user`` commands can also work on a stopped server's
data directory. Each command is one row of the table in ``cli/command.py``, declared in
its module (``queue.QUEUE``...). Errors print as ``capella: <code>: <message>``
and exit 1; bad usage exits 2; Ctrl-C exits 130.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from capella import __version__
from capella.cli import serve
from capella.cli.command import add, run
from capella.cli.output import error
from capella.errors import CapellaError, Unauthorized, Unreachable


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except SystemExit as exc:  # argparse exits on --help, --version and bad usage
        return exc.code if isinstance(exc.code, int) else 2
    try:
        return run(args.row, args)
    except Unreachable as exc:
        error(f"{exc.code}: {exc.message}")
        error(
            f"is a server running at {args.url}? Start one with `capella serve`, or set --url or CAPELLA_URL."
        )
        return 1
    except Unauthorized as exc:
        from capella.cli.login import HINT

        error(f"{exc.code}: {exc.message}")
        error(HINT)
        return 1
    except CapellaError as exc:
        error(f"{exc.code}: {exc.message}")
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`capella consume q | head`): stop quietly, and keep Python's
        # final flush of stdout from failing again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    argv = sys.argv[1:] if argv is None else list(argv)
    root = parser(serve_only=argv[:1] == ["serve"])
    args, extra = root.parse_known_args(argv)
    # argparse stops filling `produce QUEUE MESSAGE...` at the first option, so messages
    # after an option (`produce q --save wait a b`) arrive here; anything else is an error.
    if extra and isinstance(getattr(args, "messages", None), list) and "--" not in extra:
        if unknown := [a for a in extra if a.startswith("-") and len(a) > 1]:
            root.error(f"unrecognized arguments: {' '.join(unknown)}")
        args.messages.extend(extra)
    elif extra:
        root.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def parser(*, serve_only: bool = False) -> argparse.ArgumentParser:
    """The command line; ``serve_only`` when it starts with ``serve``.

    ``capella serve`` is parsed by the serve command alone (it takes no global option), and
    the other commands' modules are imported here, deliberately late: they import the HTTP
    client and more, which a server without clusters never needs (~1 MB of idle memory).
    """
    if serve_only:
        root = argparse.ArgumentParser(prog="capella", description="Capella message broker.")
        add(root.add_subparsers(dest="command", metavar="COMMAND", required=True), serve.SERVE, None)
        return root
    from capella.cli import (
        cluster,
        context,
        data,
        handler,
        pg,
        queue,
        scheduled,
        subscription,
        token,
        topic,
        transfer,
        user,
        work,
    )

    # The global options are accepted before or after the command: the copies on the
    # commands default to SUPPRESS so they never overwrite a value given earlier.
    common = argparse.ArgumentParser(add_help=False)
    _add_globals(common, suppress=True)

    root = argparse.ArgumentParser(prog="capella", description="Capella message broker.")
    root.add_argument("--version", action="version", version=f"capella {__version__}")
    _add_globals(root, suppress=False)
    commands = root.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for row in (
        serve.SERVE,
        queue.QUEUE,
        topic.TOPIC,
        subscription.SUBSCRIPTION,
        handler.HANDLER,
        cluster.CLUSTER,
        *data.COMMANDS,
        *transfer.COMMANDS,
        scheduled.SCHEDULED,
        work.WORK,
        user.USER,
        token.TOKEN,
        pg.PG,
        context.CONTEXT,
    ):
        add(commands, row, common)
    return root


def _add_globals(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    from capella.client import DEFAULT_URL

    def default(value: object) -> object:
        return argparse.SUPPRESS if suppress else value

    parser.add_argument(
        "--url",
        default=default(None),
        help=f"the server's base URL (default: $CAPELLA_URL, else the context's, else {DEFAULT_URL})",
    )
    parser.add_argument(
        "--context",
        default=default(None),
        metavar="NAME",
        help="use this saved context (default: $CAPELLA_CONTEXT, else the current one: `capella context`)",
    )
    parser.add_argument(
        "--user",
        default=default(None),
        metavar="NAME",
        help="sign in as NAME, with the password from $CAPELLA_PASSWORD or a prompt (default: "
        "the token in $CAPELLA_TOKEN, else $CAPELLA_USER)",
    )
    parser.add_argument("--json", action="store_true", default=default(False), help="print JSON for programs")
    parser.add_argument(
        "--timeout",
        type=float,
        default=default(30.0),
        metavar="SECONDS",
        help="give up on a request after this long (default: 30)",
    )
