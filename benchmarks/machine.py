"""What the figures were measured on: CPU, memory, disk kind, Python."""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path
from typing import Any


def describe(data_root: Path) -> dict[str, Any]:
    return {
        "nproc": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)),
        "cpu_model": _cpu_model(),
        "ram_gb": round(_mem_total_kb() / 1024 / 1024, 1),
        "disk": _disk(data_root),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_total_kb() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _disk(path: Path) -> str:
    """The block device holding ``path``, and whether the kernel calls it rotational."""
    try:
        device = os.stat(path).st_dev
        sysfs = Path(f"/sys/dev/block/{os.major(device)}:{os.minor(device)}")
        name = sysfs.resolve().name
        queue = sysfs / "queue"
        if not queue.exists():  # a partition: the queue belongs to the parent disk
            queue = sysfs.resolve().parent / "queue"
        rotational = (queue / "rotational").read_text().strip() == "1"
        return f"{name} ({'rotational' if rotational else 'non-rotational'})"
    except OSError:
        return "unknown"
