"""Nodes of a shared cluster come and go: a node killed with -9 comes back on its own and
serves what was stored; a second live node under a name in use refuses to start; a write
waiting in a node's buffer while its queue is dropped through another node is told so.

A module rig of three nodes (node 2 is the one killed); the last test has a rig of its own
with a 2 s window, so that the drop surely comes inside it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from support.shared import SharedRig
from support.shared_cluster import clients, module_rig, read_all
from support.wait import until

from capella.client import AsyncClient
from capella.errors import QueueNotFound

pytestmark = pytest.mark.slow

NOTICE = 1.5


@pytest.fixture(scope="module")
def rig(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedRig]:
    yield from module_rig(request, tmp_path_factory)


async def defined_everywhere(cs: list[AsyncClient], name: str, within: float = NOTICE) -> None:
    async def seen() -> bool:
        for c in cs:
            try:
                await c.queue(name)
            except QueueNotFound:
                return False
        return True

    await until(seen, within, f"{name} on every node")


# --- nodes come and go -------------------------------------------------------------------------


async def test_a_node_killed_with_minus_9_comes_back_and_serves_what_was_stored(rig: SharedRig) -> None:
    async with clients(rig.urls) as cs:
        await cs[0].put_queue("revived", storage="shared")
        await defined_everywhere(cs, "revived")
        stored = await cs[2].produce("revived", [f"before {n}" for n in range(50)], save="wait")
    rig.kill(2)
    started = time.monotonic()
    rig.restart(2)
    back = time.monotonic() - started
    print(f"\nnode restarted after kill -9: ready in {back:.1f}s")
    async with clients(rig.urls) as cs:
        found = await read_all(cs[2], "revived")
        assert [m.id for m in found] == [r.id for r in stored]
        (after,) = await cs[2].produce("revived", ["after"], save="wait")
        assert after.id == stored[-1].id + 1
        assert [m.payload for m in await read_all(cs[0], "revived")][-1] == b"after"


def test_a_second_live_node_with_one_node_name_refuses_to_start(rig: SharedRig) -> None:
    # Node index 3 (a data dir and port of its own) under node 0's name, while node 0 runs.
    text = rig.config_text(3, shared={"node": rig.node_name(0)})
    started = time.monotonic()
    code, output = rig.refusal(3, text)
    print(f"\nsecond node-0 refused after {time.monotonic() - started:.1f}s")
    assert code == 2, output
    assert "shared.node 'node-0' is the name of a node that is running" in output
    assert rig.node(0).url in output
    assert not rig.running(3)


@pytest.mark.shared_rig(flush_interval="2s")
async def test_a_write_waiting_while_its_queue_is_dropped_elsewhere_is_answered_queue_not_found(
    shared_rig: SharedRig,
) -> None:
    """The flush commits after the drop: nothing of it is stored, and the producer hears so
    (it was answered 200 with id -1, which the client could not even decode)."""
    shared_rig.start(2)
    async with clients(shared_rig.urls) as cs:
        for name in ("dropped-meanwhile", "kept-meanwhile"):
            await cs[0].put_queue(name, storage="shared")
            await defined_everywhere(cs, name)
        doomed = asyncio.create_task(cs[0].produce("dropped-meanwhile", ["a", "b"], save="wait"))
        kept = asyncio.create_task(cs[0].produce("kept-meanwhile", ["c"], save="wait"))
        await cs[1].drop_queue("dropped-meanwhile")  # inside the 2 s window of both writes
        assert not doomed.done() and not kept.done()
        with pytest.raises(QueueNotFound) as refused:
            await doomed
        assert "dropped before these messages were committed" in refused.value.message
        assert [r.id for r in await kept] == [1]  # the same object's other queue is stored
        assert [m.payload for m in await read_all(cs[1], "kept-meanwhile")] == [b"c"]
