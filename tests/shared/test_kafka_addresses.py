"""Where each node of a shared cluster serves Kafka clients (migration 003): an address
published with the node lease, listed by every node from PostgreSQL, gone with the node.

Two ``SharedNode``s in this process (tests/support/upkeep.py) on the rig's PostgreSQL and moto;
the listener's side (brokers, coordinators) is tests/kafka_protocol/test_shared.py.
"""

from __future__ import annotations

from support.shared import SharedRig
from support.upkeep import shared_node
from support.wait import holds, until

from capella.shared.node import NODES_POLL


async def test_an_address_published_after_the_start_is_listed_by_every_node_until_it_leaves(
    shared_rig: SharedRig,
) -> None:
    async with shared_node(shared_rig, 0) as (one, _):
        assert one.kafka_nodes() == []  # no listener published an address: no list is read
        one.publish_kafka("127.0.0.1", 9101)  # after the claim: renewed with it at once
        await until(lambda: one.kafka_nodes() == [("node-0", "127.0.0.1", 9101)], 5, "node-0 listed")
        async with shared_node(shared_rig, 1) as (two, _):
            two.publish_kafka("10.1.2.3", 9102)
            both = [("node-0", "127.0.0.1", 9101), ("node-1", "10.1.2.3", 9102)]
            await until(lambda: one.kafka_nodes() == two.kafka_nodes() == both, 5, "both listed by both")
            # Read every second, but the same list while nothing changes: the listener looks
            # at its groups again only for another list.
            listed = one.kafka_nodes()
            await holds(lambda: one.kafka_nodes() is listed, NODES_POLL * 2.5, "one list object")
        # node-1 stopped: it released its lease, and node-0 lists it no more within a poll.
        await until(
            lambda: one.kafka_nodes() == [("node-0", "127.0.0.1", 9101)], NODES_POLL * 3, "node-1 gone"
        )
