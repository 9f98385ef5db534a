"""Replication scenarios with real `capella serve` processes on loopback.

Every cluster is its own process with its own data directory and name; copy handlers and
clusters are created over HTTP as an operator would. Each wait is bounded.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from support.servers import ServerProcess, free_port
from support.wait import eventually, holds, until

from capella.client import AsyncClient
from capella.wire.messages import StoredMessage

pytestmark = pytest.mark.slow

CONVERGE_TIMEOUT = 30.0


class Node:
    """One cluster process that can be stopped, killed and started again on its port."""

    def __init__(self, root: Path, name: str) -> None:
        self.name = name
        self.port = free_port()
        self.data_dir = root / name
        self.config = root / f"{name}.toml"
        self.config.write_text(f'[cluster]\nname = "{name}"\n[queue_defaults.block]\nmax_messages = 100\n')
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: ServerProcess | None = None
        self.client = AsyncClient(self.url, timeout=10)

    async def start(self) -> None:
        self.process = ServerProcess(self.data_dir, self.port, self.config)
        await asyncio.to_thread(self.process.wait_ready)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process = None

    async def messages(self, queue: str = "events") -> list[StoredMessage]:
        out: list[StoredMessage] = []
        after = 0
        while True:
            page = await self.client.read(queue, after=after, limit=5000)
            if not page.messages:
                return out
            out.extend(page.messages)
            after = page.last_id

    async def identities(self, queue: str = "events") -> list[tuple[str, int]]:
        return [(m.source, m.external_id) for m in await self.messages(queue)]

    async def cluster_and_copy(self, other: Node, queue: str = "events") -> None:
        await self.client.put_cluster(other.name, url=other.url, timeout="5s", connect_timeout="1s")
        await self.client.put_handler(
            f"to-{other.name}", "copy", queues=[queue], params={"to": f"{other.name}/{queue}", "wait": "1s"}
        )


@pytest.fixture
async def cluster_nodes(tmp_path: Path) -> AsyncIterator[dict[str, Node]]:
    nodes = {name: Node(tmp_path, name) for name in ("a", "b", "c")}
    try:
        yield nodes
    finally:
        for node in nodes.values():
            node.stop()
            await node.client.close()


async def started(*nodes: Node) -> None:
    """Each node running, with an empty queue "events"."""
    for node in nodes:
        await node.start()
        await node.client.put_queue("events")


async def produce(node: Node, prefix: str, count: int, queue: str = "events") -> None:
    for start in range(0, count, 100):
        batch = [f"{prefix}{i}" for i in range(start, min(count, start + 100))]
        await node.client.produce(queue, batch, save="wait")


async def converged(nodes: list[Node], expected: int) -> list[list[tuple[str, int]]]:
    """Every node's identities once each has ``expected`` (or as they are at the deadline)."""
    views: list[list[tuple[str, int]]] = []

    async def caught_up() -> bool:
        nonlocal views
        views = [await n.identities() for n in nodes]
        return all(len(v) >= expected for v in views)

    await eventually(caught_up, within=CONVERGE_TIMEOUT, every=0.2)
    return views


async def quiet(nodes: list[Node], expected: int) -> None:
    """For 2.5 s nothing more appears on any node (no loop)."""

    async def still() -> bool:
        return [len(await n.identities()) for n in nodes] == [expected] * len(nodes)

    await holds(still, 2.5, "every node without a message more", every=0.5)


def copying(node: Node, after: int) -> Callable[[], Awaitable[bool]]:
    """Whether ``node`` has taken a copied message past id ``after``."""

    async def check() -> bool:
        return bool((await node.client.read("events", after=after, limit=1)).messages)

    return check


def assert_union(views: list[list[tuple[str, int]]], expected: int) -> None:
    for view in views:
        assert len(view) == expected, f"{len(view)} messages, expected {expected}"
        assert len(set(view)) == expected, "an identity is stored twice"
        assert sorted(view) == sorted(views[0])
        for source in {s for s, _ in view}:
            ids = [e for s, e in view if s == source]
            assert ids == sorted(ids), f"order of {source} not kept"


async def test_edge_keeps_writing_while_the_datacenter_is_down(cluster_nodes: dict[str, Node]) -> None:
    edge, dc = cluster_nodes["a"], cluster_nodes["b"]
    await edge.start()
    await edge.client.put_queue("events")
    await edge.cluster_and_copy(dc)
    await produce(edge, "e", 450)
    status = (await edge.client.handler("to-b")).status

    async def failing() -> bool:
        nonlocal status
        status = (await edge.client.handler("to-b")).status
        return bool(status.last_error)

    await eventually(failing, every=0.1)
    assert status.last_error and "unreachable" in status.last_error.message

    await dc.start()
    await dc.client.put_queue("events")
    [edge_view, dc_view] = await converged([edge, dc], 450)
    assert_union([edge_view, dc_view], 450)
    assert [m.data for m in await dc.messages()] == [f"e{i}" for i in range(450)]
    # The datacenter has everything: the edge may now free its disk.
    await edge.client.put_handler(
        "trim", "expire", queues=["events"], params={"max_messages": 1}, started=False
    )
    await edge.client.run_handler("trim")
    assert len(await edge.messages()) < 100
    assert len(await dc.messages()) == 450


async def test_two_datacenters_both_write_through_a_cut_and_converge(cluster_nodes: dict[str, Node]) -> None:
    a, b = cluster_nodes["a"], cluster_nodes["b"]
    await started(a, b)
    await a.cluster_and_copy(b)
    await b.cluster_and_copy(a)
    await produce(a, "a", 200)
    await produce(b, "b", 150)
    b.stop()  # the cluster is cut: a keeps taking writes
    await produce(a, "a-cut", 120)
    await b.start()
    await produce(b, "b-after", 80)
    views = await converged([a, b], 550)
    assert_union(views, 550)
    await quiet([a, b], 550)
    assert [len(await n.identities()) for n in (a, b)] == [550, 550]


@pytest.mark.parametrize("topology", ["ring", "mesh"])
async def test_three_clusters_converge_in_a_ring_and_in_a_mesh(
    cluster_nodes: dict[str, Node], topology: str
) -> None:
    nodes = [cluster_nodes[n] for n in ("a", "b", "c")]
    await started(*nodes)
    for i, node in enumerate(nodes):
        targets = [nodes[(i + 1) % 3]] if topology == "ring" else [n for n in nodes if n is not node]
        for other in targets:
            await node.cluster_and_copy(other)
    for node in nodes:
        await produce(node, node.name, 100)
    views = await converged(nodes, 300)
    assert_union(views, 300)
    await quiet(nodes, 300)
    assert [len(await n.identities()) for n in nodes] == [300, 300, 300]


async def test_kill_minus_9_of_either_side_while_copying(cluster_nodes: dict[str, Node]) -> None:
    a, b = cluster_nodes["a"], cluster_nodes["b"]
    await started(a, b)
    await a.cluster_and_copy(b)
    total = 0
    for victim in (b, a, b):
        await produce(a, f"round{total}-", 300)
        total += 300
        await until(copying(b, after=total - 300), what="copying under way")
        victim.kill()
        await victim.start()
    views = await converged([a, b], total)
    assert_union(views, total)
