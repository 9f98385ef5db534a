"""Identities that cannot collide, and the numbers an operator reads about copy handlers.

Real clusters on loopback: generated cluster names kept in the data directory, clusters refused
to a far side with our own name, two clusters on one host copying both ways without losing a
message produced without a source, and copy lag / handler times while the far side is down.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from support.servers import free_port
from support.supervisor import launched

from capella import metrics
from capella.api import create_app
from capella.cluster_name import FILE, generated_name
from capella.config import ServerSettings, parse_config
from capella.core.cluster import Cluster
from capella.core.message import Draft, SaveMode
from capella.errors import SameClusterName
from capella.handlers.supervisor import Supervisor
from capella.links.registry import Links

ServerFactory = Callable[..., Awaitable[TestServer]]
ClientFactory = Callable[[web.Application], Awaitable[TestClient[web.Request, web.Application]]]


@dataclass
class Node:
    cluster: Cluster
    supervisor: Supervisor
    url: str


def unnamed(data_dir: Path) -> dict[str, Any]:
    """A configuration without cluster.name, as the two-datacenter tutorial once had."""
    return {"cluster": {"data_dir": str(data_dir)}, "mounts": {"default": {"provider": "memory"}}}


async def node(
    tmp_path: Path, data: str, aiohttp_server: ServerFactory, port: int | None = None, name: str | None = None
) -> Node:
    raw = unnamed(tmp_path / data)
    if name is not None:
        raw["cluster"]["name"] = name
    cluster = await Cluster.open(parse_config(raw, {}, base=tmp_path))
    supervisor = await launched(cluster, links=Links(cluster))
    app = create_app(cluster, ServerSettings(), supervisor)
    server = await (aiohttp_server(app) if port is None else aiohttp_server(app, port=port))
    return Node(cluster, supervisor, str(server.make_url("")).rstrip("/"))


@pytest.fixture
async def here(tmp_path: Path, aiohttp_server: ServerFactory) -> AsyncIterator[Node]:
    """This side: a node named dc1 (as its twins are), closed after the test."""
    made = await node(tmp_path, "here", aiohttp_server, name="dc1")
    yield made
    await close(made)


async def stopped_copy(here: Node, far: str) -> None:
    """Handler "up" on ``here``: a copy of "orders" to ``far``'s "orders", run by hand (``run_now``)."""
    copy = {
        "type": "copy",
        "queues": ["orders"],
        "params": {"to": f"{far}/orders", "wait": 0},
        "started": False,
    }
    await here.supervisor.put("up", copy)


async def close(*nodes: Node) -> None:
    for n in nodes:
        await n.supervisor.close()
        await n.cluster.close()


# --- generated names -------------------------------------------------------------------------


def test_an_unconfigured_name_is_generated_once_kept_and_private(tmp_path: Path) -> None:
    config = parse_config(unnamed(tmp_path / "a"), {}, base=tmp_path)
    assert config.cluster_name is None
    assert not (tmp_path / "a").exists()  # parsing writes nothing

    first = generated_name(tmp_path / "a")
    other = generated_name(tmp_path / "b")

    assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*-[a-z2-7]{6}", first), first
    assert first != other
    assert generated_name(tmp_path / "a") == first  # a restart reads it back
    assert (tmp_path / "a" / FILE).stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [FILE]  # no temporary left


async def test_two_clusters_on_one_host_get_different_names_that_survive_a_restart(tmp_path: Path) -> None:
    configs = [parse_config(unnamed(tmp_path / d), {}, base=tmp_path) for d in ("dc1", "dc2")]
    names = []
    for config in configs:
        cluster = await Cluster.open(config)
        names.append(cluster.name)
        await cluster.close()
    again = await Cluster.open(configs[0])
    await again.close()

    assert names[0] != names[1]
    assert again.name == names[0]


async def test_a_configured_name_wins_and_is_not_written(tmp_path: Path) -> None:
    raw = unnamed(tmp_path / "d")
    generated_name(tmp_path / "d")
    raw["cluster"]["name"] = "dc1"
    cluster = await Cluster.open(parse_config(raw, {}, base=tmp_path))
    await cluster.close()

    assert cluster.name == "dc1"
    assert (tmp_path / "d" / FILE).read_text().strip() != "dc1"


# --- same-named clusters --------------------------------------------------------------------------


async def test_itself_or_a_same_named_cluster_as_an_external_cluster_is_refused(
    tmp_path: Path, aiohttp_server: ServerFactory, here: Node, aiohttp_client: ClientFactory
) -> None:
    twin = await node(tmp_path, "twin", aiohttp_server, name="dc1")
    other = await node(tmp_path, "other", aiohttp_server, name="dc2")
    try:
        api = await aiohttp_client(create_app(here.cluster, ServerSettings(), here.supervisor))
        for name, url in (("self", here.url), ("twin", twin.url)):
            resp = await api.put(f"/v1/clusters/{name}", json={"url": url})
            body = await resp.json()
            assert resp.status == 409, body
            assert body["error"]["code"] == "same_cluster_name"
            assert "'dc1'" in body["error"]["message"] and url in body["error"]["message"]
            assert (await api.get(f"/v1/clusters/{name}")).status == 404  # not stored
        resp = await api.put("/v1/clusters/dc2", json={"url": other.url})
        assert resp.status == 201
        assert (await resp.json())["name_check"] == {"checked": True, "cluster": "dc2", "error": None}
    finally:
        await close(twin, other)


async def test_an_unreachable_cluster_is_kept_unchecked_and_its_ping_refuses_a_same_name_later(
    tmp_path: Path, aiohttp_server: ServerFactory, here: Node, aiohttp_client: ClientFactory
) -> None:
    port = free_port()
    api = await aiohttp_client(create_app(here.cluster, ServerSettings(), here.supervisor))
    resp = await api.put("/v1/clusters/far", json={"url": f"http://127.0.0.1:{port}"})
    body = await resp.json()
    # An edge device adds one while offline: accepted, and the answer says it was not checked.
    assert resp.status == 201, body
    assert body["name_check"]["checked"] is False
    assert body["name_check"]["error"]["code"] == "unreachable"

    far = await node(tmp_path, "far", aiohttp_server, port=port, name="dc1")
    try:
        ping = await (await api.post("/v1/clusters/far/ping")).json()
        assert ping["ok"] is False and ping["error"]["code"] == "same_cluster_name", ping
        # A copy through it fails with that error, and copies nothing.
        await here.cluster.put_queue("orders", {})
        await here.cluster.queue("orders").append([Draft(b"a")], SaveMode.WAIT)
        await far.cluster.put_queue("orders", {})
        await stopped_copy(here, "far")
        state = await here.supervisor.run_now("up")
        assert state.last_error is not None and "same_cluster_name" in state.last_error.message
        assert far.cluster.queue("orders").last_id == 0
    finally:
        await close(far)


async def test_checked_client_refuses_a_same_named_far_side(
    tmp_path: Path, aiohttp_server: ServerFactory, here: Node
) -> None:
    port = free_port()
    await here.supervisor.links.put("far", {"url": f"http://127.0.0.1:{port}"})
    far = await node(tmp_path, "far", aiohttp_server, port=port, name="dc1")
    try:
        with pytest.raises(SameClusterName):
            await here.supervisor.links.checked_client("far")
    finally:
        await close(far)


# --- the tutorial's shape ----------------------------------------------------------------------


@pytest.fixture
async def two_datacenters(tmp_path: Path, aiohttp_server: ServerFactory) -> AsyncIterator[tuple[Node, Node]]:
    """Two clusters on one host without cluster.name, each the other's external cluster (docs)."""
    dc1 = await node(tmp_path, "dc1", aiohttp_server)
    dc2 = await node(tmp_path, "dc2", aiohttp_server)
    await dc1.supervisor.links.put("dc2", {"url": dc2.url})
    await dc2.supervisor.links.put("dc1", {"url": dc1.url})
    yield dc1, dc2
    await close(dc1, dc2)


async def test_two_clusters_on_one_host_copying_both_ways_lose_nothing(
    two_datacenters: tuple[Node, Node],
) -> None:
    dc1, dc2 = two_datacenters
    for n in (dc1, dc2):
        await n.cluster.put_queue("orders", {})
    # Produced without a source: each gets the identity (its cluster's name, 1).
    await dc1.cluster.queue("orders").append([Draft(b"from dc1")], SaveMode.WAIT)
    await dc2.cluster.queue("orders").append([Draft(b"from dc2")], SaveMode.WAIT)
    await dc1.supervisor.put(
        "to-dc2",
        {"type": "copy", "queues": ["orders"], "params": {"to": "dc2/orders", "wait": 0}, "started": False},
    )
    await dc2.supervisor.put(
        "to-dc1",
        {"type": "copy", "queues": ["orders"], "params": {"to": "dc1/orders", "wait": 0}, "started": False},
    )

    for _ in range(2):
        for n, handler in ((dc1, "to-dc2"), (dc2, "to-dc1")):
            state = await n.supervisor.run_now(handler)
            assert state.last_error is None, state.last_error

    for n in (dc1, dc2):
        page = await n.cluster.queue("orders").read_after(0, 100)
        assert sorted(m.payload for m in page.messages) == [b"from dc1", b"from dc2"]
        assert len({(m.source, m.external_id) for m in page.messages}) == 2


# --- numbers an operator reads ----------------------------------------------------------------


async def test_copy_lag_with_the_destination_down_is_the_cursors_lag_everywhere(
    tmp_path: Path, aiohttp_server: ServerFactory, here: Node, aiohttp_client: ClientFactory
) -> None:
    await here.supervisor.links.put("down", {"url": f"http://127.0.0.1:{free_port()}", "timeout": 2})
    await here.cluster.put_queue("orders", {})
    await stopped_copy(here, "down")
    await here.cluster.queue("orders").append([Draft(b"x") for _ in range(4)], SaveMode.WAIT)

    await here.supervisor.run_now("up")  # fails: nobody listens there
    await here.cluster.queue("orders").append([Draft(b"y")], SaveMode.WAIT)

    cursor = here.cluster.queue("orders").subscription("copy-to-down.orders")
    expected = here.cluster.queue("orders").last_id - cursor.last_id
    assert expected == 5
    api = await aiohttp_client(create_app(here.cluster, ServerSettings(), here.supervisor))
    status = (await (await api.get("/v1/handlers/up")).json())["status"]
    assert (status["lag"], status["lag_by_queue"]) == (5, {"orders": 5})
    text = metrics.render(here.cluster, here.supervisor.handlers())
    assert re.search(r'capella_handler_lag\{handler="up"[^}]*\} 5\b', text), text
    assert re.search(r'capella_subscription_lag\{[^}]*subscription="copy-to-down.orders"[^}]*\} 5\b', text)


async def test_failing_since_stays_at_the_first_failure_and_clears_after_a_success(
    tmp_path: Path, aiohttp_server: ServerFactory, here: Node
) -> None:
    port = free_port()
    await here.supervisor.links.put("far", {"url": f"http://127.0.0.1:{port}", "timeout": 2})
    await here.cluster.put_queue("orders", {})
    await here.cluster.queue("orders").append([Draft(b"x")], SaveMode.WAIT)
    await stopped_copy(here, "far")
    first = msgspec.to_builtins((await here.supervisor.run_now("up")).info())["status"]
    second = msgspec.to_builtins((await here.supervisor.run_now("up")).info())["status"]

    assert first["failing_since"] == first["last_error"]["time"] == first["last_run"]
    assert second["failing_since"] == first["failing_since"] < second["last_error"]["time"]
    assert second["last_run"] == second["last_error"]["time"]
    assert second["last_success"] is None and second["last_complete"] is None

    far = await node(tmp_path, "far", aiohttp_server, port=port, name="dc2")
    try:
        await far.cluster.put_queue("orders", {})
        state, done = await here.supervisor.run_pass_now("up")
        status = msgspec.to_builtins(state.info())["status"]
        assert done.error is None and done.items == 1
        assert status["failing_since"] is None and status["last_error"] is None
        assert status["last_success"] == status["last_complete"] == status["last_run"] == done.finished
        assert status["lag"] == 0
    finally:
        await close(far)


async def test_push_lag_with_the_receiver_down_is_the_backlog_everywhere(
    tmp_path: Path, aiohttp_server: ServerFactory, here: Node, aiohttp_client: ClientFactory
) -> None:
    await here.cluster.put_queue("orders", {})
    url = f"http://127.0.0.1:{free_port()}/hook"  # nobody listens: every request fails
    params = {"url": url, "wait": 0, "timeout": 1, "delay": "1h", "max_delay": "1h", "max_attempts": 5}
    await here.supervisor.put("hook", {"type": "push", "queue": "orders", "params": params, "started": False})
    await here.cluster.queue("orders").append([Draft(b"x") for _ in range(4)], SaveMode.WAIT)

    await here.supervisor.run_now("hook")  # claims all four, and each request fails
    await here.cluster.queue("orders").append([Draft(b"y")], SaveMode.WAIT)

    api = await aiohttp_client(create_app(here.cluster, ServerSettings(), here.supervisor))
    status = (await (await api.get("/v1/handlers/hook")).json())["status"]
    assert (status["lag"], status["delivered"], status["retrying"]) == (5, 0, 4), status
    text = metrics.render(here.cluster, here.supervisor.handlers())
    assert re.search(r'capella_handler_lag\{handler="hook"[^}]*\} 5\b', text), text
    assert re.search(r'capella_push_lag\{[^}]*handler="hook"[^}]*\} 5\b', text), text
