"""``/v1/clusters/{name}/v1/...``: an edge reaching a datacenter through its gateway, on real servers.

Three Capella processes with authentication: ``edge`` has ``gw`` as an external cluster (as
user ``edge``), ``gw`` has ``dc`` (as user ``gw``) and ``dc`` has ``edge`` back (for a loop). Each hop needs
``external_cluster relay`` on its cluster, for the user the request arrives as.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.servers import ServerProcess

pytestmark = pytest.mark.slow

PASSWORD = "relay-pass-1"


def config(tmp: Path, name: str) -> Path:
    path = tmp / f"{name}.toml"
    path.write_text(
        f'[cluster]\nname = "{name}"\n[server]\nmax_body_size = "64KiB"\n'
        '[auth]\nenabled = true\nbootstrap_user = "admin"\nbootstrap_password_env = "RELAY_PWD"\n'
        '[egress]\nallow = ["127.0.0.1/32"]\n'
    )
    return path


def http(
    url: str, method: str = "GET", body: object = None, user: str = "admin", password: str = PASSWORD
) -> tuple[int, Any]:
    data = None if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=20) as resp:
            raw = resp.read()
            return resp.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as exc:
        with exc:
            raw = exc.read()
            return exc.code, json.loads(raw) if raw else None


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ServerProcess]]:
    tmp = tmp_path_factory.mktemp("relay")
    servers = {
        name: ServerProcess(tmp / name, config=config(tmp, name), env={"RELAY_PWD": PASSWORD})
        for name in ("edge", "gw", "dc")
    }
    try:
        for server in servers.values():
            server.wait_ready()
        edge, gw, dc = servers["edge"].url, servers["gw"].url, servers["dc"].url
        # The cluster users: each may relay on through its own next cluster, and no more.
        rules = {
            "gw": ["allow:external_cluster:relay:to_dc"],
            "dc": ["allow:queue:*:orders", "allow:external_cluster:relay:to_edge"],
        }
        assert http(f"{gw}/v1/users/edge", "PUT", {"password": PASSWORD, "rules": rules["gw"]})[0] == 201
        assert http(f"{dc}/v1/users/gw", "PUT", {"password": PASSWORD, "rules": rules["dc"]})[0] == 201
        assert http(f"{dc}/v1/users/back", "PUT", {"password": PASSWORD, "admin": True})[0] == 201
        assert http(f"{dc}/v1/queues/orders", "PUT", {})[0] == 201
        for here, name, there, user in (
            (edge, "to_gw", gw, "edge"),
            (gw, "to_dc", dc, "gw"),
            (dc, "to_edge", edge, "admin"),
        ):
            definition = {"url": there, "username": user, "password": PASSWORD}
            assert http(f"{here}/v1/clusters/{name}", "PUT", definition)[0] == 201
        yield servers
    finally:
        for server in servers.values():
            server.stop()


def test_an_edge_reaches_the_datacenter_through_its_gateway(sites: dict[str, ServerProcess]) -> None:
    far = f"{sites['edge'].url}/v1/clusters/to_gw/v1/clusters/to_dc/v1"
    status, answer = http(f"{far}/queues/orders/messages", "POST", {"messages": [{"data": "from the edge"}]})
    assert status == 200, answer
    status, answer = http(f"{far}/queues/orders/messages?after=0")
    assert status == 200 and [m["data"] for m in answer["messages"]] == ["from the edge"]
    # The far side's own answers come back as they are: its 404, its 403 for the cluster's user.
    assert http(f"{far}/queues/missing/messages?after=0")[0] == 403  # gw's user may touch only orders
    status, answer = http(f"{far}/queues/orders/nope")
    assert status == 404
    status, answer = http(f"{far}/queues/orders")
    assert status == 200 and answer["name"] == "orders"


def test_every_hop_needs_external_cluster_relay(sites: dict[str, ServerProcess]) -> None:
    edge = sites["edge"].url
    # write (what a copy handler needs) and admin on the cluster do not relay.
    rules = {"password": PASSWORD, "rules": ["allow:external_cluster:admin:*", "allow:queue:*:*"]}
    assert http(f"{edge}/v1/users/reader", "PUT", rules)[0] == 201
    status, answer = http(f"{edge}/v1/clusters/to_gw/v1/queues", user="reader")
    assert status == 403 and answer["error"]["code"] == "forbidden"
    assert answer["error"]["action"] == "relay"
    # gw's cluster user may relay only to to_dc: asking gw for another cluster is gw's 403 (or 404).
    status, answer = http(f"{edge}/v1/clusters/to_gw/v1/clusters/elsewhere/v1/queues")
    assert status == 403
    status, answer = http(f"{edge}/v1/clusters/nowhere/v1/queues")
    assert status == 404 and answer["error"]["code"] == "cluster_not_found"


def test_loops_and_long_paths_are_refused(sites: dict[str, ServerProcess]) -> None:
    edge = sites["edge"].url
    loop = "/v1/clusters/to_gw/v1/clusters/to_dc/v1/clusters/to_edge/v1/clusters/to_gw/v1/queues"
    status, answer = http(f"{edge}{loop}")
    # Every hop allows it (dc's cluster user on edge is admin): edge refuses, seeing itself in Capella-Hops.
    assert status == 400 and answer["error"]["code"] == "call_loop", (status, answer)
    # A path whose last hop is a plain /v1 request back at edge: dc will not send it there.
    back = "/v1/clusters/to_gw/v1/clusters/to_dc/v1/clusters/to_edge/v1/queues"
    status, answer = http(f"{edge}{back}")
    assert status == 400 and answer["error"]["code"] == "call_loop", (status, answer)
    assert "leads back to cluster" in answer["error"]["message"]
    request = urllib.request.Request(f"{edge}/v1/clusters/to_gw/v1/queues")
    request.add_header("Authorization", "Basic " + base64.b64encode(f"admin:{PASSWORD}".encode()).decode())
    request.add_header("Capella-Hops", "a,b,c,d")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=10)
    with info.value:
        assert info.value.code == 400 and json.loads(info.value.read())["error"]["code"] == "too_many_hops"


def test_bodies_are_bounded_and_wrong_cluster_credentials_are_a_502(sites: dict[str, ServerProcess]) -> None:
    edge, gw = sites["edge"].url, sites["gw"].url
    big = json.dumps({"messages": [{"data": "x" * (80 * 1024)}]}).encode()
    status, answer = http(
        f"{edge}/v1/clusters/to_gw/v1/clusters/to_dc/v1/queues/orders/messages", "POST", big
    )
    assert status == 413
    definition = {"url": gw, "username": "edge", "password": "wrong-password"}
    assert http(f"{edge}/v1/clusters/bad_gw", "PUT", definition)[0] == 201
    status, answer = http(f"{edge}/v1/clusters/bad_gw/v1/queues")
    assert status == 502 and answer["error"]["code"] == "unreachable"
