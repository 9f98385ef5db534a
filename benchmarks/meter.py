"""Wall time and CPU time of both sides over a measured stretch.

CPU shares show which side was the limit: a server near 100 % of one core is saturated
(it runs one event loop); a client near 100 % means the figure is the client's.
"""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass

from benchmarks.server import Server


def _client_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass(slots=True)
class Meter:
    """``start()`` then ``stop()``; then read ``wall`` and the CPU shares."""

    server: Server
    wall: float = 0.0
    server_cpu: float = 0.0
    client_cpu: float = 0.0

    def start(self, at: float | None = None) -> None:
        self.wall = time.perf_counter() if at is None else at
        self.server_cpu = self.server.cpu_seconds()
        self.client_cpu = _client_cpu()

    def stop(self, at: float | None = None) -> None:
        self.wall = (time.perf_counter() if at is None else at) - self.wall
        self.server_cpu = self.server.cpu_seconds() - self.server_cpu
        self.client_cpu = _client_cpu() - self.client_cpu

    def to_dict(self) -> dict[str, float]:
        wall = self.wall or float("nan")
        return {
            "wall_s": self.wall,
            "server_cpu_s": self.server_cpu,
            "client_cpu_s": self.client_cpu,
            "server_cpu_pct": 100 * self.server_cpu / wall,
            "client_cpu_pct": 100 * self.client_cpu / wall,
        }
