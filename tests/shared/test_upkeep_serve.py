"""Upkeep inside real ``capella serve`` nodes: the compactor and the janitor run as the node's
own loops (short settings), an expire handler works on a shared queue, and the metrics count it.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest
from support.shared import SharedRig
from support.wait import until_blocking

pytestmark = pytest.mark.slow

UPKEEP = {
    "compact_after": "200ms",
    "compact_interval": "300ms",
    "garbage_grace": "500ms",
}


def call(method: str, url: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10.0) as resp:
        text = resp.read()
        return (
            json.loads(text) if resp.headers.get("Content-Type", "").startswith("application/json") else text
        )


def metric(url: str, name: str) -> float:
    for line in call("GET", f"{url}/metrics").decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


@pytest.mark.shared_rig(flush_interval="20ms", shared=UPKEEP)
def test_nodes_compact_sweep_and_expire_by_themselves(shared_rig: SharedRig) -> None:
    a, b = shared_rig.start(2)
    call("PUT", f"{a.url}/v1/queues/kept", {"storage": "shared", "block": {"max_messages": 100}})
    for n in range(40):  # through both nodes, one object a write
        node = (a, b)[n % 2]
        body = {"messages": [{"data": f"m{10 * n + i}"} for i in range(10)]}
        call("POST", f"{node.url}/v1/queues/kept/messages?save=immediate", body)
    before = call("GET", f"{b.url}/v1/queues/kept/messages?after=0&limit=1000")["messages"]
    assert [m["id"] for m in before] == list(range(1, 401))

    def compacted() -> bool:
        blocks = sum(metric(node.url, "capella_shared_compactions_total") for node in (a, b))
        return blocks == 4  # four full blocks of 100

    until_blocking(compacted, 30.0, "the nodes' compactors wrote four blocks")
    until_blocking(
        lambda: sum(metric(node.url, "capella_shared_garbage_objects_total") for node in (a, b)) >= 40,
        30.0,
        "the janitor deleted the compacted objects",
    )
    after = call("GET", f"{a.url}/v1/queues/kept/messages?after=0&limit=1000")["messages"]
    assert after == before

    # expire on a shared queue: at most 150 kept, whole blocks: 301..400 stay
    call(
        "PUT",
        f"{a.url}/v1/handlers/trim",
        {"type": "expire", "queues": ["kept"], "params": {"max_messages": 150, "interval": "300ms"}},
    )
    until_blocking(
        lambda: call("GET", f"{b.url}/v1/queues/kept")["stats"]["first_id"] == 301,
        30.0,
        "node b sees the new first id",
    )
    left = call("GET", f"{b.url}/v1/queues/kept/messages?after=0&limit=1000")["messages"]
    assert left == before[300:]
