"""``capella handler create|list|show|start|stop|run|drop``: manage background handlers."""

from __future__ import annotations

import argparse
from typing import Any

import orjson
from msgspec import UNSET, UnsetType

from capella.cli.command import Command, Family, Refused, arg, drop
from capella.cli.output import created, error, print_fields, print_table, utc
from capella.client import Client, Saved
from capella.wire.copy import CopyStatus
from capella.wire.handler_status import HandlerInfo, HandlerStatus, PassResult
from capella.wire.handlers import HANDLER_TYPES as TYPES
from capella.wire.postgres import PgOutboxStatus
from capella.wire.push import DeliveryError, PushStatus


def save_handler(args: argparse.Namespace, client: Client) -> Saved[HandlerInfo]:
    params: dict[str, Any] = dict(args.params_json or {})
    params.update(args.params)
    return client.save_handler(
        args.name, args.type, queues=args.queues, params=params, started=not args.stopped
    )


def print_saved(args: argparse.Namespace, saved: Saved[HandlerInfo]) -> None:
    info = saved.value
    state = "started" if info.started else "stopped"
    print(f"handler {info.name} {created(saved.created, 'replaced')} ({state})")


def print_handlers(args: argparse.Namespace, handlers: list[HandlerInfo]) -> None:
    rows = []
    for info in handlers:
        last_error = info.status.last_error
        added = info.status.added(info.type)
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


def print_handler(args: argparse.Namespace, info: HandlerInfo) -> None:
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
            *_lag(status, info.type),
            (
                "last error",
                f"{last_error.message} ({last_error.code}) at {utc(last_error.time)}" if last_error else "-",
            ),
            *_delivery_fields(status),
        ]
    )


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


def control_handler(args: argparse.Namespace, client: Client) -> HandlerInfo:
    control = client.start_handler if args.action == "start" else client.stop_handler
    return control(args.name)


def run_pass(args: argparse.Namespace, client: Client) -> PassResult:
    """The pass the server ran now: its items and bytes, or its error."""
    done = client.run_handler(args.name).pass_
    if isinstance(done, UnsetType):  # a server older than the pass in the answer
        raise Refused(f"handler {args.name}: the server does not report the pass it ran")
    return done


def print_pass(args: argparse.Namespace, done: PassResult) -> None:
    """What it did on stdout, or its error on stderr (and the run exits 1)."""
    if done.ok:
        print(f"handler {args.name} pass ok: {done.items} items, {done.bytes} bytes")
    else:
        error(f"handler {args.name} pass failed: {done.error}")


def _lag(status: HandlerStatus, kind: str) -> list[tuple[str, str]]:
    """The lines of what is not done yet, for the handlers that report it."""
    added = status.added(kind)
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


HANDLER = Family(
    "handler",
    "create, list, show, start, stop, run and drop handlers",
    (
        Command(
            "create",
            "create a handler, or replace its definition",
            save_handler,
            text=print_saved,
            json=lambda args, saved: saved.value,
            args=(
                arg("name"),
                arg("--type", required=True, choices=TYPES, help="what the handler does"),
                arg(
                    "--queue",
                    dest="queues",
                    action="append",
                    metavar="QUEUE",
                    help="a queue name or pattern such as 'logs-*' (repeat for more; pg_outbox takes none)",
                ),
                arg(
                    "--param",
                    dest="params",
                    action="append",
                    type=_param,
                    default=[],
                    metavar="KEY=VALUE",
                    help="a parameter such as interval=10m or max_messages=1000 "
                    "(JSON values are read as JSON)",
                ),
                arg(
                    "--params-json",
                    type=_params_json,
                    metavar="JSON",
                    help="all parameters as one JSON object",
                ),
                arg("--stopped", action="store_true", help="save it without starting it"),
            ),
        ),
        Command(
            "list",
            "list handlers and their status",
            lambda args, client: client.handlers(),
            text=print_handlers,
        ),
        Command(
            "show",
            "show a handler's definition and status",
            lambda args, client: client.handler(args.name),
            text=print_handler,
            args=(arg("name"),),
        ),
        *(
            Command(
                action,
                help_text,
                control_handler,
                text=lambda args, _: print(
                    f"handler {args.name} {'started' if args.action == 'start' else 'stopped'}"
                ),
                args=(arg("name"),),
            )
            for action, help_text in (
                ("start", "start a handler's periodic runs"),
                ("stop", "stop a handler's periodic runs (waits for a running pass)"),
            )
        ),
        Command(
            "run",
            "run one pass now, print what it did; exit 1 when it failed",
            run_pass,
            text=print_pass,
            args=(arg("name"),),
            exit=lambda args, done: 0 if done.ok else 1,
        ),
        drop(
            "handler",
            "stop a handler and delete its definition",
            lambda args, client: client.drop_handler(args.name),
        ),
    ),
)
