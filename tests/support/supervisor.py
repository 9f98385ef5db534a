"""A started handler supervisor for the length of a block.

``async with started(cluster) as supervisor:`` builds it (with any keyword ``Supervisor`` takes),
starts it (it loads the persisted handlers) and closes it after the block, whatever happens.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from capella.core.cluster import Cluster
from capella.handlers.supervisor import Supervisor


@contextlib.asynccontextmanager
async def started(cluster: Cluster, **kwargs: Any) -> AsyncIterator[Supervisor]:
    """``Supervisor(cluster, **kwargs)``, started, closed after the block."""
    supervisor = Supervisor(cluster, **kwargs)
    await supervisor.start()
    try:
        yield supervisor
    finally:
        await supervisor.close()
