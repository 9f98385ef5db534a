"""Topics of several partitions: define or grow (PUT), describe (GET), list, drop (DELETE).

A topic's partitions are queues (``<topic>~<n>``), so acting on a topic is acting on each of
them: defining or dropping one needs ``queue admin`` on the topic's name and on every
partition's queue name (``allow:queue:admin:orders*`` covers both; ``allow:queue:admin:orders``
alone makes no partition), and reading one ``queue read`` on its name.
"""

from __future__ import annotations

from aiohttp import web

from capella.api.access import identity
from capella.api.openapi import answer, json_content, ref
from capella.api.request import CLUSTER, json_response, read_struct
from capella.api.route import Need, Route
from capella.core.topic import Topic, partition_names
from capella.wire.topics import TopicDefinition, TopicInfo, TopicList

TOPIC_PATH = "/v1/topics/{topic}"


def on_topic(action: str) -> Need:
    return Need("queue", action, "{topic}")


def topic_info(topic: Topic) -> TopicInfo:
    return TopicInfo(topic.name, topic.partitions, topic.queues, topic.definition.to_wire())


def check_partitions(request: web.Request, names: list[str]) -> None:
    who = identity(request)
    for name in names:
        who.check("queue", "admin", name)


async def list_topics(request: web.Request) -> web.Response:
    who = identity(request)
    readable = [t for t in request.app[CLUSTER].topics() if who.can("queue", "read", t.name)]
    return json_response(TopicList([topic_info(t) for t in readable]))


async def put_topic(request: web.Request) -> web.Response:
    name = request.match_info["topic"]
    body = await read_struct(request, TopicDefinition)
    check_partitions(request, partition_names(name, body.partitions))
    topic, created = await request.app[CLUSTER].define_topic(name, body)
    return json_response(topic_info(topic), 201 if created else 200)


async def get_topic(request: web.Request) -> web.Response:
    return json_response(topic_info(request.app[CLUSTER].topic(request.match_info["topic"])))


async def drop_topic(request: web.Request) -> web.Response:
    cluster = request.app[CLUSTER]
    name = request.match_info["topic"]
    check_partitions(request, cluster.topic(name).queues)
    await cluster.drop_topic(name)
    return web.Response(status=204)


ROUTES = [
    Route(
        "GET",
        "/v1/topics",
        list_topics,
        need=(),
        op="listTopics",
        summary="List topics of several partitions",
        tag="topics",
        answers={200: answer("Topics", ref("TopicList"))},
    ),
    Route(
        "PUT",
        TOPIC_PATH,
        put_topic,
        need=(on_topic("admin"),),
        op="putTopic",
        summary="Create (201) a topic and its partition queues, or add partitions and update them (200)",
        tag="topics",
        answers={200: answer("Updated", ref("TopicInfo")), 201: answer("Created", ref("TopicInfo"))},
        fails=(400, 408, 409, 413),
        body={"required": True, "content": json_content(ref("TopicDefinition"))},
    ),
    Route(
        "GET",
        TOPIC_PATH,
        get_topic,
        need=(on_topic("read"),),
        op="getTopic",
        summary="Describe a topic",
        tag="topics",
        answers={200: answer("The topic", ref("TopicInfo"))},
        fails=(404,),
    ),
    Route(
        "DELETE",
        TOPIC_PATH,
        drop_topic,
        need=(on_topic("admin"),),
        op="dropTopic",
        summary="Drop a topic, its partition queues and all their messages",
        tag="topics",
        answers={204: answer("Dropped")},
        fails=(404,),
    ),
]
