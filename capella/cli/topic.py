"""``capella topic create|list|show|drop``: topics of several partitions, each a queue."""

from __future__ import annotations

import argparse
from typing import Any

import orjson

from capella.cli.command import Command, Family, arg, drop
from capella.cli.output import created, print_fields, print_table
from capella.client import Client, Saved
from capella.wire.topics import TopicInfo


def save_topic(args: argparse.Namespace, client: Client) -> Saved[TopicInfo]:
    return client.define_topic(args.name, args.partitions, queue=args.queue_json)


def print_topics(args: argparse.Namespace, topics: list[TopicInfo]) -> None:
    print_table(
        ["NAME", "PARTITIONS", "SAVE"], [[t.name, str(t.partitions), str(t.definition.save)] for t in topics]
    )


def print_topic(args: argparse.Namespace, topic: TopicInfo) -> None:
    definition = topic.definition
    print_fields(
        [
            ("name", topic.name),
            ("partitions", topic.partitions),
            ("queues", ", ".join(topic.queues)),
            ("save", f"{definition.save} (subscriptions: {definition.subscription_save})"),
        ]
    )


def _queue_json(text: str) -> dict[str, Any]:
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise argparse.ArgumentTypeError(f"not valid JSON: {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object (a queue's definition)")
    return value


TOPIC = Family(
    "topic",
    "create, list, show and drop topics of several partitions (each partition a queue, NAME~N)",
    (
        Command(
            "create",
            "create a topic, or add partitions and update their definition",
            save_topic,
            text=lambda args, saved: print(
                f"topic {saved.value.name} {created(saved.created)}: {saved.value.partitions} partitions"
            ),
            json=lambda args, saved: saved.value,
            args=(
                arg("name"),
                arg(
                    "--partitions",
                    type=int,
                    required=True,
                    metavar="N",
                    help="how many partitions (1-1000); can grow, never shrink",
                ),
                arg(
                    "--queue-json",
                    type=_queue_json,
                    metavar="JSON",
                    help='every partition\'s queue definition, as for PUT /v1/queues ({"save": "mark"})',
                ),
            ),
        ),
        Command("list", "list topics", lambda args, client: client.topics(), text=print_topics),
        Command(
            "show",
            "show a topic's partitions and definition",
            lambda args, client: client.topic(args.name),
            text=print_topic,
            args=(arg("name"),),
        ),
        drop(
            "topic",
            "delete a topic, its partition queues and all their messages",
            lambda args, client: client.drop_topic(args.name),
            question="drop topic {name}, its partition queues and all their messages?",
        ),
    ),
)
