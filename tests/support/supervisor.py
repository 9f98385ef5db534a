"""A started handler supervisor for the length of a block, and a push handler on its own.

``async with started(cluster) as supervisor:`` builds it (with any keyword ``Supervisor`` takes),
starts it (it loads the persisted handlers) and closes it after the block, whatever happens;
``await launched(cluster)`` is the same supervisor for a test that closes it itself.
``refused`` is the error a definition the supervisor must not take raises; ``build_push``
builds a push handler as the supervisor would, without one.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from capella.core.cluster import Cluster
from capella.errors import InvalidRequest
from capella.handlers.base import Handler
from capella.handlers.supervisor import Supervisor, build
from capella.links.reach import Reach
from capella.links.registry import Links
from capella.wire.params import Params


async def launched(cluster: Cluster, **kwargs: Any) -> Supervisor:
    """``Supervisor(cluster, **kwargs)``, started."""
    supervisor = Supervisor(cluster, **kwargs)
    await supervisor.start()
    return supervisor


@contextlib.asynccontextmanager
async def started(cluster: Cluster, **kwargs: Any) -> AsyncIterator[Supervisor]:
    """``Supervisor(cluster, **kwargs)``, started, closed after the block."""
    supervisor = await launched(cluster, **kwargs)
    try:
        yield supervisor
    finally:
        await supervisor.close()


async def refused(supervisor: Supervisor, name: str, body: dict[str, Any]) -> InvalidRequest:
    """The ``InvalidRequest`` that defining ``name`` as ``body`` raises; the test fails if it is taken."""
    with pytest.raises(InvalidRequest) as info:
        await supervisor.put(name, body)
    return info.value


def build_push(
    cluster: Cluster, queues: list[str], raw: object, name: str, reach: Reach | None = None
) -> tuple[Params, Handler]:
    """A push handler on its own (it needs no links)."""
    return build(cluster, "push", queues, raw, reach or Reach(Links(cluster)), name)
