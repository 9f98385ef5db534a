"""``capella handler create|list|show|start|stop|run|drop``: manage background handlers."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson
from msgspec import UNSET, UnsetType

from capella.cli.output import created, error, print_fields, print_json, print_table, utc
from capella.client import Client
from capella.wire.copy import CopyStatus
from capella.wire.handler_status import HandlerStatus
from capella.wire.handlers import HANDLER_TYPES as TYPES
from capella.wire.postgres import PgOutboxStatus
from capella.wire.push import DeliveryError, PushStatus


def add_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    handler = commands.add_parser(
        "handler", help="create, list, show, start, stop, run and drop handlers", parents=[common]
    )
    actions = handler.add_subparsers(dest="action", metavar="ACTION", required=True)

    create = actions.add_parser(
        "create", help="create a handler, or replace its definition", parents=[common]
    )
    create.add_argument("name")
    create.add_argument("--type", required=True, choices=TYPES, help="what the handler does")
    create.add_argument(
        "--queue",
        dest="queues",
        action="append",
        metavar="QUEUE",
        help="a queue name or pattern such as 'logs-*' (repeat for more; pg_outbox takes none)",
    )
    create.add_argument(
        "--param",
        dest="params",
        action="append",
        type=_param,
        default=[],
        metavar="KEY=VALUE",
        help="a parameter such as interval=10m or max_messages=1000 (JSON values are read as JSON)",
    )
    create.add_argument(
        "--params-json", type=_params_json, metavar="JSON", help="all parameters as one JSON object"
    )
    create.add_argument("--stopped", action="store_true", help="save it without starting it")
    create.set_defaults(func=create_handler, uses_client=True)

    listing = actions.add_parser("list", help="list handlers and their status", parents=[common])
    listing.set_defaults(func=list_handlers, uses_client=True)

    show = actions.add_parser("show", help="show a handler's definition and status", parents=[common])
    show.add_argument("name")
    show.set_defaults(func=show_handler, uses_client=True)

    for action, help_text in (
        ("start", "start a handler's periodic runs"),
        ("stop", "stop a handler's periodic runs (waits for a running pass)"),
    ):
        command = actions.add_parser(action, help=help_text, parents=[common])
        command.add_argument("name")
        command.set_defaults(func=control_handler, uses_client=True)

    run = actions.add_parser(
        "run", help="run one pass now, print what it did; exit 1 when it failed", parents=[common]
    )
    run.add_argument("name")
    run.set_defaults(func=run_handler, uses_client=True)

    drop = actions.add_parser("drop", help="stop a handler and delete its definition", parents=[common])
    drop.add_argument("name")
    drop.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    drop.set_defaults(func=drop_handler, uses_client=True)


def create_handler(args: argparse.Namespace, client: Client) -> int:
    params: dict[str, Any] = dict(args.params_json or {})
    params.update(args.params)
    info, was_created = client.save_handler(
        args.name, args.type, queues=args.queues, params=params, started=not args.stopped
    )
    if args.json:
        print_json(info)
    else:
        state = "started" if info.started else "stopped"
        print(f"handler {info.name} {created(was_created, 'replaced')} ({state})")
    return 0


def list_handlers(args: argparse.Namespace, client: Client) -> int:
    handlers = client.handlers()
    if args.json:
        print_json(handlers)
        return 0
    rows = []
    for info in handlers:
        last_error = info.status.last_error
        added = info.status.added()
        lag = None if added is None else added.lag
        rows.append(
            [
                info.name,
                info.type,
                ",".join(info.queues),
                "yes" if info.started else "no",
                str(info.status.runs),
                # The number the API and capella_handler_lag give; "-" where a type has none.
                str(lag) if isinstance(lag, int) else "-",
                last_error.message if last_error else "-",
            ]
        )
    print_table(["NAME", "TYPE", "QUEUES", "STARTED", "RUNS", "LAG", "LAST_ERROR"], rows)
    return 0


def show_handler(args: argparse.Namespace, client: Client) -> int:
    info = client.handler(args.name)
    if args.json:
        print_json(info)
        return 0
    status = info.status
    last_error = status.last_error
    print_fields(
        [
            ("name", info.name),
            ("type", info.type),
            ("queues", ", ".join(info.queues)),
            ("params", ", ".join(f"{k}={v}" for k, v in info.params.items()) or "-"),
            ("runs as", info.user or "-"),
            *([("cannot run", status.cannot_run)] if status.cannot_run else []),
            ("started", "yes" if info.started else "no"),
            ("running", "yes" if status.running else "no"),
            ("runs", f"{status.runs} ({status.items} items, {status.bytes} bytes)"),
            ("last run", utc(status.last_run)),
            ("last success", utc(status.last_success)),
            ("failing since", utc(status.failing_since)),
            ("next run", utc(status.next_run)),
            *_lag(status),
            (
                "last error",
                f"{last_error.message} ({last_error.code}) at {utc(last_error.time)}" if last_error else "-",
            ),
            *_delivery_fields(status),
        ]
    )
    return 0


def _delivery_fields(status: HandlerStatus) -> list[tuple[str, str]]:
    """A push handler's deliveries; nothing for the other types."""
    push = status.part(PushStatus)
    if push is None:
        return []
    failure = push.last_delivery_error
    return [
        ("delivered", str(push.delivered)),
        ("failed", f"{push.failed} attempts"),
        ("dead", str(push.dead)),
        ("in flight", str(push.in_flight)),
        ("retrying", str(push.retrying)),
        ("lag", str(push.lag)),
        (
            "last delivery error",
            "-"
            if not isinstance(failure, DeliveryError)
            else f"{failure.message}{'' if failure.status else ' (no answer)'} at {utc(failure.time)}",
        ),
    ]


def control_handler(args: argparse.Namespace, client: Client) -> int:
    control = client.start_handler if args.action == "start" else client.stop_handler
    info = control(args.name)
    if args.json:
        print_json(info)
    else:
        print(f"handler {args.name} {'started' if args.action == 'start' else 'stopped'}")
    return 0


def run_handler(args: argparse.Namespace, client: Client) -> int:
    """One pass: its own items and bytes on stdout, or its error on stderr; exit 0 or 1."""
    info = client.run_handler(args.name)
    done = info.pass_
    if isinstance(done, UnsetType):  # a server older than the pass in the answer
        error(f"handler {args.name}: the server does not report the pass it ran")
        return 1
    if args.json:
        print_json(done)
    elif done.ok:
        print(f"handler {args.name} pass ok: {done.items} items, {done.bytes} bytes")
    else:
        error(f"handler {args.name} pass failed: {done.error}")
    return 0 if done.ok else 1


def drop_handler(args: argparse.Namespace, client: Client) -> int:
    if not args.yes:
        if not sys.stdin.isatty():
            error(f"not dropping handler {args.name} without --yes")
            return 2
        answer = input(f"drop handler {args.name}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            error("not dropped")
            return 1
    client.drop_handler(args.name)
    if args.json:
        print_json({"dropped": args.name})
    else:
        print(f"handler {args.name} dropped")
    return 0


def _lag(status: HandlerStatus) -> list[tuple[str, str]]:
    """The lines of what is not done yet, for the handlers that report it."""
    added = status.added()
    if added is None:
        return []
    if isinstance(added, PgOutboxStatus):
        # Rows waiting in a table, with the age of the oldest.
        age = added.oldest_age
        waiting = "-" if added.lag is None else f"{added.lag} rows"
        return [("waiting", waiting + ("" if age is None else f", oldest {age:.1f}s"))]
    observed = added.lag_observed if isinstance(added, CopyStatus) else None
    seen = "" if observed is UNSET or observed is None else f" (as seen at {utc(observed)})"
    return [("lag", f"{added.lag} messages{seen}")]


def _param(text: str) -> tuple[str, Any]:
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), _value(raw)


def _value(raw: str) -> Any:
    # Numbers, lists and objects go as JSON; anything else ("7d", "64MiB") goes as text.
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw


def _params_json(text: str) -> dict[str, Any]:
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise argparse.ArgumentTypeError(f"not valid JSON: {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return value
