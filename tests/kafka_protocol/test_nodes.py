"""The brokers of a shared cluster (capella/kafka/nodes.py): node ids from names, and a group's
coordinator by rendezvous hash, the same on every node, moving only the groups it must."""

from __future__ import annotations

import hashlib
import logging
from collections import Counter

import pytest

from capella.kafka.nodes import KafkaNode, coordinator_of, live, node_id

GROUPS = [f"group-{n}" for n in range(3000)]


def nodes(*names: str) -> list[KafkaNode]:
    return [KafkaNode(node_id(name), "127.0.0.1", 9092 + i, name) for i, name in enumerate(names)]


def owners(members: list[KafkaNode]) -> dict[str, str]:
    return {group: coordinator_of(group, members).name for group in GROUPS}


def test_a_node_id_is_a_non_negative_int32_that_depends_on_the_name_only() -> None:
    ids = {node_id(f"node-{n}") for n in range(1000)}
    assert len(ids) == 1000
    assert all(0 <= i < 2**31 for i in ids)
    # Fixed by the name's hash, not by process or order: a restart keeps it.
    assert node_id("node-a") == int.from_bytes(hashlib.sha256(b"node-a").digest()[:4]) & (2**31 - 1)


def test_groups_spread_over_the_nodes_and_every_order_of_the_list_agrees() -> None:
    three = nodes("node-0", "node-1", "node-2")
    counts = Counter(owners(three).values())
    assert set(counts) == {"node-0", "node-1", "node-2"}
    assert all(800 <= count <= 1200 for count in counts.values()), counts
    assert owners(list(reversed(three))) == owners(three)


def test_a_node_gone_moves_only_its_own_groups_and_one_come_back_takes_only_its_own() -> None:
    three = nodes("node-0", "node-1", "node-2")
    before = owners(three)
    after = owners([n for n in three if n.name != "node-1"])
    for group, owner in before.items():
        if owner == "node-1":
            assert after[group] in ("node-0", "node-2")
        else:
            assert after[group] == owner, group
    assert owners(three) == before  # back again: each group where it was


def test_one_node_coordinates_everything() -> None:
    (only,) = nodes("node-0")
    assert {coordinator_of(group, [only]) for group in GROUPS} == {only}


def test_two_names_of_one_id_list_the_first_only(caplog: pytest.LogCaptureFixture) -> None:
    seen: dict[int, str] = {}
    pair: tuple[str, str] | None = None
    for n in range(400_000):  # a 31-bit collision by the birthday bound: ~55,000 names
        name = f"n{n}"
        taken = seen.setdefault(node_id(name), name)
        if taken != name:
            pair = (taken, name)
            break
    assert pair is not None
    first, second = sorted(pair)
    with caplog.at_level(logging.ERROR, logger="capella.kafka.nodes"):
        listed = live([(first, "127.0.0.1", 1), (second, "127.0.0.1", 2), ("other", "127.0.0.1", 3)])
    assert [n.name for n in listed] == [first, "other"]
    assert second in caplog.text


def test_two_nodes_advertising_one_address_are_listed_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="capella.kafka.nodes"):
        listed = live([("a", "lb.example", 9092), ("b", "lb.example", 9092), ("c", "c.example", 9092)])
    assert [n.name for n in listed] == ["a", "b", "c"]
    assert "lb.example:9092 of shared node b is also a's" in caplog.text
    assert "c.example" not in caplog.text
