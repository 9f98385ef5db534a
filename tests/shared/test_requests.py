"""What a shared queue costs in S3 requests (design note §8, D9): a busy node PUTs at most one
object per window and an idle one none, and tail reads of a node's own writes need no GET.

The nodes reach moto through the rig's counting proxy (``SharedRig(proxy=True)``), so every
request they make is counted by kind on the wire.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from support.shared import SharedRig
from support.shared_cluster import clients
from support.wait import holds

pytestmark = [pytest.mark.slow, pytest.mark.shared_rig(proxy=True, flush_interval="100ms")]

WINDOW = 0.1


async def test_a_busy_node_puts_one_object_per_window_and_an_idle_one_none(shared_rig: SharedRig) -> None:
    shared_rig.start(1)
    proxy = shared_rig.proxy
    assert proxy is not None
    async with clients(shared_rig.urls) as (c,):
        await c.put_queue("costs", storage="shared")
        # Eight producers writing without pause for two seconds: a window's writes, one object.
        puts_before = proxy.calls["PUT"]
        stop = time.monotonic() + 2.0
        answered = 0

        async def produce(n: int) -> None:
            nonlocal answered
            while time.monotonic() < stop:
                await c.produce("costs", [f"p{n}"] * 10, save="wait")
                answered += 1

        started = time.monotonic()
        await asyncio.gather(*(produce(n) for n in range(8)))
        busy = time.monotonic() - started
        puts = proxy.calls["PUT"] - puts_before
        assert answered >= 8
        # At most one object per window (and one for the window still open when the clock ran out).
        assert 1 <= puts <= busy / WINDOW + 1, (puts, busy)
        assert puts < answered  # writes of one window share their object

        # The tail of what this node wrote is read from its memory: no GET.
        gets_before = proxy.calls["GET"] + proxy.calls["GET range"]
        page = await c.read("costs", after=0, limit=10_000)
        assert len(page.messages) == 10 * answered
        assert proxy.calls["GET"] + proxy.calls["GET range"] == gets_before

        # Idle: nothing to flush, no PUT (the compactor's defaults leave young segments alone).
        idle_before = proxy.calls["PUT"]
        await holds(lambda: proxy.calls["PUT"] == idle_before, 1.0, "no PUT while idle")
