"""Copy handlers between two real clusters, each behind its own HTTP server on loopback."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from support.supervisor import launched
from support.wait import parked, until

from capella.api import create_app
from capella.auth.authenticator import Authenticator
from capella.auth.rule import AccessRule
from capella.auth.secret import Secrets
from capella.auth.store import AuthStore
from capella.config import AuthSettings, SecretSettings, ServerSettings, parse_config
from capella.core.cluster import Cluster
from capella.core.message import Draft, SaveMode
from capella.handlers.supervisor import Supervisor
from capella.links.registry import Links


@dataclass
class Node:
    cluster: Cluster
    supervisor: Supervisor
    url: str


@pytest.fixture
async def nodes(
    tmp_path: Path, aiohttp_server: Callable[[web.Application], Awaitable[TestServer]]
) -> AsyncIterator[dict[str, Node]]:
    made: dict[str, Node] = {}
    for name in ("edge", "dc"):
        config = parse_config(
            {
                "cluster": {"name": name, "data_dir": str(tmp_path / name)},
                "queue_defaults": {"block": {"max_messages": 40}},
            },
            {},
            base=tmp_path,
        )
        cluster = await Cluster.open(config)
        # The operator declares the clusters' secret; the cluster names it (password_secret).
        secrets = Secrets({"secure-dc": SecretSettings(env="SECURE_DC_PASSWORD")})
        supervisor = await launched(cluster, links=Links(cluster, secrets=secrets), secrets=secrets)
        server = await aiohttp_server(create_app(cluster, ServerSettings(), supervisor))
        made[name] = Node(cluster, supervisor, str(server.make_url("")).rstrip("/"))
    for node in made.values():
        for other_name, other in made.items():
            if other is not node:
                await node.supervisor.links.put(other_name, {"url": other.url})
    yield made
    for node in made.values():
        await node.supervisor.close()
        await node.cluster.close()


async def stored(node: Node, queue: str) -> list[tuple[str, int, bytes]]:
    page = await node.cluster.queue(queue).read_after(0, 10_000)
    return [(m.source, m.external_id, m.payload) for m in page.messages]


async def test_edge_to_datacenter_then_back_without_duplicates_or_loops(nodes: dict[str, Node]) -> None:
    edge, dc = nodes["edge"], nodes["dc"]
    await edge.cluster.put_queue("events", {})
    await dc.cluster.put_queue("events", {})
    await edge.cluster.queue("events").append([Draft(f"e{i}".encode()) for i in range(100)], SaveMode.WAIT)
    await dc.cluster.queue("events").append([Draft(f"d{i}".encode()) for i in range(30)], SaveMode.WAIT)

    push = {"type": "copy", "queues": ["events"], "params": {"to": "dc/events", "wait": 0}, "started": False}
    pull = {"type": "copy", "params": {"from": "dc/events", "to": "events", "wait": 0}, "started": False}
    await edge.supervisor.put("push", push)
    await edge.supervisor.put("pull", pull)
    for _ in range(3):
        for name in ("push", "pull"):
            state = await edge.supervisor.run_now(name)
            assert state.last_error is None, state.last_error
    edge_events, dc_events = await stored(edge, "events"), await stored(dc, "events")
    assert sorted(edge_events) == sorted(dc_events)
    assert len(edge_events) == 130 == len(set(edge_events))
    # Per-source order is kept on both sides.
    for events in (edge_events, dc_events):
        assert [e for e in events if e[0] == "edge"] == [
            ("edge", i + 1, f"e{i}".encode()) for i in range(100)
        ]
    # Quiet: further passes store nothing.
    before = (len(await stored(edge, "events")), len(await stored(dc, "events")))
    for name in ("push", "pull"):
        await edge.supervisor.run_now(name)
    assert (len(await stored(edge, "events")), len(await stored(dc, "events"))) == before == (130, 130)
    # The cursor on the datacenter side is a replica subscription there.
    remote_cursor = dc.cluster.queue("events").subscription("copy-to-events")
    assert remote_cursor.replica and remote_cursor.last_id == dc.cluster.queue("events").last_id


async def test_a_missing_remote_queue_shows_in_the_status_and_copying_resumes(nodes: dict[str, Node]) -> None:
    edge, dc = nodes["edge"], nodes["dc"]
    await edge.cluster.put_queue("events", {})
    await edge.cluster.queue("events").append([Draft(b"kept")], SaveMode.WAIT)
    await edge.supervisor.put(
        "push",
        {"type": "copy", "queues": ["events"], "params": {"to": "dc/events", "wait": 0}, "started": False},
    )
    state = await edge.supervisor.run_now("push")
    assert state.last_error is not None and "queue_not_found" in state.last_error.message
    assert edge.cluster.queue("events").subscription("copy-to-dc.events").last_id == 0
    await dc.cluster.put_queue("events", {})
    state = await edge.supervisor.run_now("push")
    assert state.last_error is None and state.items == 1
    assert await stored(dc, "events") == [("edge", 1, b"kept")]


async def test_an_unreachable_cluster_is_an_error_and_nothing_is_lost(nodes: dict[str, Node]) -> None:
    edge, dc = nodes["edge"], nodes["dc"]
    await edge.cluster.put_queue("events", {})
    await dc.cluster.put_queue("events", {})
    await edge.supervisor.links.put("gone", {"url": "http://127.0.0.1:9", "connect_timeout": 1, "timeout": 2})
    await edge.supervisor.put(
        "push",
        {"type": "copy", "queues": ["events"], "params": {"to": "gone/events", "wait": 0}, "started": False},
    )
    await edge.cluster.queue("events").append([Draft(b"x")], SaveMode.WAIT)
    state = await edge.supervisor.run_now("push")
    assert state.last_error is not None and "unreachable" in state.last_error.message
    # The code as the API shows it: the JSON answer is rendered from this struct.
    assert msgspec.to_builtins(state.info())["status"]["last_error"]["code"] == "unreachable"
    assert edge.cluster.queue("events").subscription("copy-to-gone.events").last_id == 0
    await edge.supervisor.links.put("gone", {"url": dc.url})
    state = await edge.supervisor.run_now("push")
    assert state.last_error is None and await stored(dc, "events") == [("edge", 1, b"x")]


async def test_a_started_copy_delivers_a_receipt_to_the_producer(nodes: dict[str, Node]) -> None:
    edge, dc = nodes["edge"], nodes["dc"]
    await edge.cluster.put_queue("events", {})
    await dc.cluster.put_queue("events", {})
    await edge.supervisor.put("push", {"type": "copy", "queues": ["events"], "params": {"to": "dc/events"}})
    answers = await edge.cluster.queue("events").append([Draft(b"important")], SaveMode.WAIT)
    holders = await edge.cluster.queue("events").wait_replicas(answers[0].id, 1, 5.0)
    assert holders == ["copy-to-dc.events"]

    async def arrived() -> bool:
        return await stored(dc, "events") == [("edge", 1, b"important")]

    await until(arrived, what="the copy stored in dc")
    assert await stored(dc, "events") == [("edge", 1, b"important")]


@pytest.fixture
async def secure_dc(
    tmp_path: Path, aiohttp_server: Callable[[web.Application], Awaitable[TestServer]]
) -> AsyncIterator[Node]:
    """A datacenter with authentication on: user ``replicator`` may write ``events`` only."""
    config = parse_config(
        {"cluster": {"name": "secure", "data_dir": str(tmp_path / "secure")}}, {}, base=tmp_path
    )
    users = AuthStore(tmp_path / "secure" / "auth")
    users.add_user("root", "root-password", admin=True)
    users.add_user("replicator", "replicator-password", rules=(AccessRule.parse("allow:queue:write:events"),))
    cluster = await Cluster.open(config)
    supervisor = await launched(cluster, users=users)
    authenticator = Authenticator(users, AuthSettings(enabled=True))
    server = await aiohttp_server(
        create_app(cluster, ServerSettings(), supervisor, authenticator=authenticator)
    )
    yield Node(cluster, supervisor, str(server.make_url("")).rstrip("/"))
    await supervisor.close()
    await cluster.close()


async def test_wrong_credentials_show_in_the_status_and_copying_resumes_once_fixed(
    nodes: dict[str, Node], secure_dc: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    edge = nodes["edge"]
    await edge.cluster.put_queue("events", {})
    await secure_dc.cluster.put_queue("events", {})
    await secure_dc.cluster.put_queue("other", {})
    monkeypatch.setenv("SECURE_DC_PASSWORD", "not-the-password")
    await edge.supervisor.links.put(
        "secure", {"url": secure_dc.url, "username": "replicator", "password_secret": "secure-dc"}
    )
    await edge.cluster.queue("events").append([Draft(f"m{i}".encode()) for i in range(5)], SaveMode.WAIT)
    push = {
        "type": "copy",
        "queues": ["events"],
        "params": {"to": "secure/events", "wait": 0},
        "started": False,
    }
    await edge.supervisor.put("push", push)

    state = await edge.supervisor.run_now("push")
    assert state.last_error is not None and "unauthorized" in state.last_error.message
    assert edge.cluster.queue("events").subscription("copy-to-secure.events").last_id == 0
    assert await stored(secure_dc, "events") == []

    # Right password, but a queue the user may not write: a clear "forbidden".
    monkeypatch.setenv("SECURE_DC_PASSWORD", "replicator-password")
    await edge.supervisor.links.put(
        "secure", {"url": secure_dc.url, "username": "replicator", "password_secret": "secure-dc"}
    )
    await edge.supervisor.put("push", {**push, "params": {"to": "secure/other", "wait": 0}})
    state = await edge.supervisor.run_now("push")
    assert state.last_error is not None and "forbidden" in state.last_error.message

    await edge.supervisor.put("push", push)
    await edge.cluster.queue("events").append([Draft(b"m5")], SaveMode.WAIT)
    state = await edge.supervisor.run_now("push")
    assert state.last_error is None
    assert await stored(secure_dc, "events") == [("edge", i + 1, f"m{i}".encode()) for i in range(6)]
    assert await stored(secure_dc, "other") == []


@pytest.mark.parametrize(
    "copy",
    [
        {"type": "copy", "queues": ["events"], "params": {"to": "stuck/events", "wait": 0}},
        {"type": "copy", "params": {"from": "stuck/events", "to": "events", "wait": 0}},
    ],
    ids=["to", "from"],
)
async def test_a_copy_stuck_connecting_to_a_cluster_stops_at_once(
    nodes: dict[str, Node], copy: dict[str, object]
) -> None:
    edge = nodes["edge"]
    await edge.cluster.put_queue("events", {})
    await edge.cluster.queue("events").append([Draft(b"x")], SaveMode.WAIT)
    loop = asyncio.get_running_loop()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        # The one connection its backlog holds: a connect after it waits for an accept that
        # never comes, as to a host that drops packets.
        with socket.create_connection(listener.getsockname()):
            url = f"http://127.0.0.1:{listener.getsockname()[1]}"
            # Its name check gives up after 3 s; the pass's connect would wait 60.
            await edge.supervisor.links.put("stuck", {"url": url, "connect_timeout": 60, "timeout": 60})
            await edge.supervisor.put("out", copy)
            state = edge.supervisor.handler("out")
            await until(lambda: state.running and state.handler.interruptible, what="the pass connecting")
            await parked("BaseConnector.connect")  # aiohttp's connect is under way
            started = loop.time()
            await edge.supervisor.stop_handler("out")
            # A call to another cluster is repeated by the next pass: no grace to sit out.
            assert loop.time() - started < 1.0
    assert not state.running
    if "queues" in copy:  # nothing was sent, so the local cursor did not move
        assert edge.cluster.queue("events").subscription("copy-to-stuck.events").last_id == 0
    assert [m.payload for m in (await edge.cluster.queue("events").read_after(0, 10)).messages] == [b"x"]
