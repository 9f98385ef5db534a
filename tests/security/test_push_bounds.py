"""What one push definition may make the broker hold, and what its failures may reveal in the log.

A definition is refused past 10,000 messages in flight (concurrency x batch) or a 60 s timeout;
a webhook URL's query string and user info (where its secret often is) never reach the log or
the handler's status.
"""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import msgspec
import pytest
from support.supervisor import build_push, started

from capella.config import Config, parse_config
from capella.core.cluster import Cluster
from capella.core.message import Draft, SaveMode
from capella.errors import InvalidRequest


@pytest.fixture
def cluster_config(tmp_path: Path) -> Config:
    return parse_config({"cluster": {"name": "dc1", "data_dir": str(tmp_path / "data")}}, {}, base=tmp_path)


@pytest.fixture
async def cluster(cluster: Cluster) -> Cluster:
    """The conftest's cluster, with the queue "orders"."""
    await cluster.put_queue("orders", {})
    return cluster


@pytest.mark.parametrize(
    ("params", "field", "limit"),
    [
        ({"concurrency": 100, "batch": 101}, "params.batch", "10000"),
        ({"concurrency": 1000, "batch": 11}, "params.batch", "10000"),
        ({"timeout": "61s"}, "params.timeout", "60"),
        ({"timeout": "1h"}, "params.timeout", "60"),
    ],
)
async def test_a_definition_past_the_caps_is_refused(
    cluster: Cluster, params: dict[str, object], field: str, limit: str
) -> None:
    async with started(cluster) as supervisor:
        with pytest.raises(InvalidRequest) as info:
            await supervisor.put(
                "p", {"type": "push", "queue": "orders", "params": {"url": "http://x", **params}}
            )

    assert info.value.details.get("field") == field
    assert limit in info.value.message


@pytest.mark.parametrize(
    "params",
    [
        {"concurrency": 100, "batch": 100},
        {"ordering": "ordered", "concurrency": 1000, "batch": 10_000},
        {"timeout": "60s"},
    ],
)
def test_definitions_at_the_caps_are_taken(cluster: Cluster, params: dict[str, object]) -> None:
    build_push(cluster, ["orders"], {"url": "http://x", **params}, "p")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_a_failing_url_is_logged_and_shown_without_its_query_or_user_info(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    await cluster.queue("orders").append([Draft(b"m")], SaveMode.WAIT)
    url = f"http://127.0.0.1:{closed_port()}/hook?token=abc&sig=abc#abc"
    _, handler = build_push(
        cluster, ["orders"], {"url": url, "wait": 0, "delay": "1h", "max_delay": "1h"}, "p"
    )

    with caplog.at_level(logging.DEBUG):
        await handler.run_once()

    status = msgspec.to_builtins(handler.status())  # as the API renders it
    assert status["failed"] == 1
    assert "abc" not in status["last_delivery_error"]["message"]
    failed = [r.getMessage() for r in caplog.records if "push failed" in r.getMessage()]
    assert failed
    assert "/hook" in failed[0]
    assert all("abc" not in r.getMessage() for r in caplog.records)
