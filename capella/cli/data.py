"""``capella produce`` and ``capella consume``: messages in and out of a queue."""

from __future__ import annotations

import argparse
import base64
import sys
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any, BinaryIO

import orjson
from msgspec import UnsetType

from capella.cli.arguments import MESSAGE_FILTERS, moment, pairs, positive
from capella.cli.command import Command, arg, one_of, show
from capella.cli.output import print_payload, utc
from capella.cli.progress import Progress
from capella.client import Client
from capella.errors import InvalidMessage
from capella.wire.messages import ProduceResult

BATCH = 1000
# A follower long-polls this long per request; the server caps it at server.max_wait.
FOLLOW_WAIT = 30.0


def produce_messages(args: argparse.Namespace, client: Client) -> None:
    defaults: dict[str, Any] = {}
    if args.source is not None:
        defaults["source"] = args.source
    if args.segment is not None:
        defaults["segment"] = args.segment
    if args.headers:
        defaults["headers"] = dict(args.headers)
    if args.delay is not None:
        defaults["delay"] = args.delay
    if args.deliver_at is not None:
        defaults["deliver_at"] = args.deliver_at
    messages = _numbered(args.external_id)
    if args.messages:
        lines: Iterable[bytes] = (m.encode() for m in args.messages)
        _produce_all(client, args, messages(_messages(lines, args.ndjson, defaults)), Progress("produced"))
        return
    if args.file is not None:
        with args.file.open("rb") as f:
            progress = Progress("produced", reading=f)
            _produce_all(client, args, messages(_messages(_lines(f), args.ndjson, defaults)), progress)
            return
    progress = Progress("produced", reading=sys.stdin.buffer)
    stdin = _messages(_lines(sys.stdin.buffer), args.ndjson, defaults)
    _produce_all(client, args, messages(stdin), progress)


def _filters(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "source": args.source,
        "headers": dict(args.headers) or None,
        "json": {path: _json_value(value) for path, value in args.fields} or None,
    }


def _after_or_subscription(args: argparse.Namespace) -> str | None:
    if args.subscription is not None and any(_filters(args).values()):
        return "--source, --header and --field read after an id: use --after, not --subscription"
    return None


def consume_messages(args: argparse.Namespace, client: Client) -> None:
    remaining: int | None = args.limit
    wait = FOLLOW_WAIT if args.follow else None
    after: int = args.after
    filters = _filters(args)
    if args.subscription is not None:
        # A commit never moves a cursor back, so committing 0 only creates the subscription
        # if needed and tells us where it is.
        after = client.commit(args.queue, args.subscription, 0).last_id
    while remaining is None or remaining > 0:
        limit = BATCH if remaining is None else min(remaining, BATCH)
        if args.subscription is not None:
            page = client.read_subscription(
                args.queue, args.subscription, limit=limit, wait=wait, segments=args.segments, commit="none"
            )
        else:
            page = client.read(
                args.queue, after=after, limit=limit, wait=wait, segments=args.segments, **filters
            )
        for message in page.messages:
            show(args, message, lambda args, message: print_payload(message))
        sys.stdout.flush()
        last_id = page.last_id
        if args.subscription is not None and last_id > after:
            # Commit after printing: a consumer killed in between sees the batch again.
            client.commit(args.queue, args.subscription, last_id)
        if remaining is not None:
            remaining -= len(page.messages)
        if last_id <= after and not page.messages and not args.follow:
            break
        after = max(after, last_id)


def _produce_all(
    client: Client, args: argparse.Namespace, messages: Iterator[dict[str, Any]], progress: Progress
) -> None:
    while batch := list(islice(messages, BATCH)):
        for result in client.produce(args.queue, batch, save=args.save):
            show(args, result, lambda args, result: print(_outcome(result)))
        sys.stdout.flush()
        progress.add(len(batch))
    progress.finish()


def _outcome(result: ProduceResult) -> str:
    """What happened to one message: ``7``, ``7 duplicate`` or ``scheduled 12 due <time>``."""
    if not isinstance(result.scheduled_id, UnsetType):
        due = None if isinstance(result.deliver_at, UnsetType) else result.deliver_at
        return f"scheduled {result.scheduled_id} due {utc(due)}"
    return f"{result.id} duplicate" if result.duplicate else str(result.id)


def _numbered(first: int | None) -> Callable[[Iterator[dict[str, Any]]], Iterator[dict[str, Any]]]:
    """Messages with external ids counted up from ``first`` (those that carry one keep it)."""

    def numbered(messages: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        if first is None:
            yield from messages
            return
        for offset, message in enumerate(messages):
            yield {"external_id": first + offset, **message}

    return numbered


def _messages(lines: Iterable[bytes], ndjson: bool, defaults: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for number, line in enumerate(lines, 1):
        if ndjson:
            if not line.strip():
                continue
            message = json_object(line, number)
        else:
            try:
                message = {"data": line.decode()}
            except UnicodeDecodeError:
                message = {"data_b64": base64.b64encode(line).decode("ascii")}
        if "delay" in message or "deliver_at" in message:
            # A line's own due time replaces the command's (both at once would be refused).
            yield {k: v for k, v in defaults.items() if k not in ("delay", "deliver_at")} | message
        else:
            yield {**defaults, **message}


def json_object(line: bytes, number: int) -> dict[str, Any]:
    """Line ``number`` of an NDJSON input as the message object it must be."""
    try:
        message = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise InvalidMessage(f"line {number} is not valid JSON: {exc}") from None
    if not isinstance(message, dict):
        raise InvalidMessage(f"line {number} is not a JSON object")
    return message


def _lines(f: BinaryIO) -> Iterator[bytes]:
    for line in f:
        yield line.removesuffix(b"\n").removesuffix(b"\r")


def _json_value(text: str) -> Any:
    # As the server reads a json.<path> filter: JSON when it parses (42, true, "42"), else text.
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


# Both print as they go, one line per message: the answers are streams, not one document.
COMMANDS = (
    Command(
        "produce",
        "append messages to a queue",
        produce_messages,
        text=None,
        description="Append messages: the MESSAGE arguments, else each line of --file, else each "
        "line of standard input. Prints one line per message, in order: its id (and 'duplicate' "
        "when its identity was already stored), or 'scheduled ID due TIME' for a delayed one.",
        args=(
            arg("queue"),
            arg("messages", nargs="*", metavar="MESSAGE"),
            arg("--file", type=Path, metavar="F", help="read one message per line from F"),
            arg(
                "--ndjson", action="store_true", help="each message is a JSON object in the API's wire shape"
            ),
            arg("--save", metavar="MODE", help="none|immediate|mark|wait|default"),
            arg("--source", metavar="S", help="the messages' source (default: the cluster)"),
            arg(
                "--external-id",
                type=int,
                metavar="N",
                help="the first message's external id, the next ones N+1, N+2...: with --source, their "
                "identity, stored once (default: each message's own id)",
            ),
            arg("--segment", type=int, metavar="N", help="the messages' segment"),
            pairs("--header", "headers", "NAME=VALUE", "a header of every message (repeat)"),
            one_of(
                arg("--delay", metavar="DURATION", help="deliver after this long (10s, 5m, 2h)"),
                arg(
                    "--deliver-at",
                    type=moment,
                    metavar="TIME",
                    help="deliver at this time (RFC 3339 or UNIX seconds)",
                ),
            ),
        ),
    ),
    Command(
        "consume",
        "print messages from a queue",
        consume_messages,
        text=None,
        description="Print messages, one per line: the payload, or the whole message with --json. "
        "Stops when caught up unless --follow.",
        args=(
            arg("queue"),
            one_of(
                arg("--after", type=int, default=0, metavar="ID", help="start after this id"),
                arg(
                    "--subscription",
                    metavar="NAME",
                    help="start after this subscription's cursor and move it",
                ),
            ),
            arg("--limit", type=positive, metavar="N", help="stop after N messages"),
            arg("--segments", metavar="RANGES", help="only these segments, e.g. 0-9,20"),
            *MESSAGE_FILTERS,
            pairs(
                "--field",
                "fields",
                "PATH=VALUE",
                "only JSON payloads whose field at the dotted PATH equals the JSON VALUE (repeat)",
            ),
            arg("--follow", "-f", action="store_true", help="wait for new messages until Ctrl-C"),
        ),
        check=_after_or_subscription,
    ),
)
