"""A queue's ``block`` limits (when a block is sealed), and ``limits``, their old name: still read
in bodies, in ``[queue_defaults.limits]`` and in definitions stored before the rename."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from support.clock import Clock
from support.configs import file_config

from capella.config import parse_config
from capella.core.cluster import Cluster
from capella.core.definition import SealLimits, default_definition
from capella.core.message import Draft
from capella.errors import InvalidConfig

OLD_REGISTRY = {
    "queues": {
        "old": {
            "definition": {
                "limits": {"max_count": 3, "max_bytes": 4096, "max_age": 60.0},
                "save": "wait",
                "subscription_save": "immediate",
                "segments": None,
                "mounts": {"meta": "default", "marks": {"0": "default"}},
            },
            "state": "active",
        }
    }
}


def registry(tmp_path: Path) -> Path:
    return tmp_path / "data" / "queues" / ".capella" / "queues.json"


async def test_a_definition_stored_as_limits_still_loads(tmp_path: Path, clock: Clock) -> None:
    # The registry exists (and the queue's directory) as a version before the rename left them.
    cluster = await Cluster.open(file_config(tmp_path), clock=clock)
    await cluster.put_queue("old", {})
    await cluster.close()
    registry(tmp_path).write_text(json.dumps(OLD_REGISTRY))

    cluster = await Cluster.open(file_config(tmp_path), clock=clock)
    try:
        queue = cluster.queue("old")
        assert queue.definition.block == SealLimits(max_messages=3, max_bytes=4096, max_age=60.0)
        assert queue.definition_dict()["block"] == {"max_messages": 3, "max_bytes": 4096, "max_age": 60.0}
        await queue.append([Draft(payload=b"x") for _ in range(4)])
        states = queue.stats()["blocks"]["by_state"]
        assert states["open"] + states["sealing"] + states["sealed"] == 2  # the first full at three
    finally:
        await cluster.close()


async def test_new_definitions_are_stored_as_block(tmp_path: Path, clock: Clock) -> None:
    cluster = await Cluster.open(file_config(tmp_path), clock=clock)
    try:
        await cluster.put_queue("new", {"limits": {"max_count": 7}})
    finally:
        await cluster.close()

    stored = json.loads(registry(tmp_path).read_text())["queues"]["new"]["definition"]
    assert "limits" not in stored
    assert stored["block"]["max_messages"] == 7


async def test_limits_is_an_alias_answered_as_block(api: TestClient) -> None:
    resp = await api.put(
        "/v1/queues/q", json={"limits": {"max_count": 5, "max_bytes": "4KiB", "max_age": "1m"}}
    )

    assert resp.status == 201
    definition = (await resp.json())["definition"]
    assert definition["block"] == {"max_messages": 5, "max_bytes": 4096, "max_age": 60.0}
    assert "limits" not in definition


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        (
            {"block": {"max_messages": 5}, "limits": {"max_count": 5}},
            "limits",
            "give block or its deprecated name limits, not both",
        ),
        ({"limits": {"max_count": 0}}, "limits.max_count", "limits.max_count must be an integer"),
        ({"block": {"max_mesages": 5}}, "block.max_mesages", "did you mean 'block.max_messages'?"),
        ({"block": {"max_bytes": "lots"}}, "block.max_bytes", "block.max_bytes: expected a size"),
    ],
)
async def test_bad_block_limits_are_400_naming_the_field(
    api: TestClient, body: dict[str, Any], field: str, message: str
) -> None:
    resp = await api.put("/v1/queues/q", json=body)

    assert resp.status == 400
    error = (await resp.json())["error"]
    assert (error["code"], error["field"]) == ("invalid_request", field)
    assert message in error["message"]


@pytest.mark.parametrize(
    "defaults",
    [{"block": {"max_messages": 3}}, {"limits": {"max_count": 3}}],
    ids=["block", "deprecated-limits"],
)
def test_queue_defaults_take_block_or_the_old_limits(tmp_path: Path, defaults: dict[str, Any]) -> None:
    config = parse_config({"queue_defaults": defaults}, {}, base=tmp_path)

    definition = default_definition(config.queue_defaults, config.default_mount, set(config.mounts))

    assert definition.block.max_messages == 3


def test_queue_defaults_with_both_block_and_limits_are_refused(tmp_path: Path) -> None:
    config = parse_config(
        {"queue_defaults": {"block": {"max_messages": 3}, "limits": {"max_count": 3}}}, {}, base=tmp_path
    )

    with pytest.raises(InvalidConfig, match="queue_defaults: give block or its deprecated name limits"):
        default_definition(config.queue_defaults, config.default_mount, set(config.mounts))
