"""The server's own process limits: it lifts what would run out before its configured caps."""

from __future__ import annotations

import asyncio
import resource
from pathlib import Path

import pytest
from conftest import ServerProcess

LOW = 256


async def test_the_server_lifts_its_open_files_limit_to_the_hard_one(tmp_path: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard <= LOW:
        pytest.skip(f"the hard limit on open files ({hard}) leaves nothing to lift")
    # Started with a low soft limit (inherited from here), as a service manager may give it.
    resource.setrlimit(resource.RLIMIT_NOFILE, (LOW, hard))
    try:
        server = ServerProcess(tmp_path / "data")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        await asyncio.to_thread(server.wait_ready)
        limits = await asyncio.to_thread(Path(f"/proc/{server.process.pid}/limits").read_text)
        line = next(line for line in limits.splitlines() if line.startswith("Max open files"))
        assert line.split()[3:5] == [str(hard), str(hard)]
        assert f"open files limit raised from {LOW} to {hard}" in server.log()
    finally:
        assert server.stop() == 0
