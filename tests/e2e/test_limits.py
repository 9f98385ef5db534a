"""The server's own process settings: limits it lifts before they run out, and how malloc
keeps its heaps (docs/benchmarks.md, peak RSS)."""

from __future__ import annotations

import asyncio
import platform
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.servers import ServerProcess

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


# Threads that each allocate and free buffers of the sizes a server's worker threads use, then
# glibc's own account of its heaps (malloc_info).
HEAPS_AFTER_THREADS = textwrap.dedent(
    """
    import ctypes, sys, threading
    from capella.server import tune_malloc
    if sys.argv[1] == "tuned":
        tune_malloc()
    def work():
        for _ in range(50):
            held = [bytearray(300_000) for _ in range(4)]
            del held
    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    libc = ctypes.CDLL("libc.so.6")
    libc.fopen.restype = ctypes.c_void_p
    libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    out = libc.fopen(sys.argv[2].encode(), b"w")
    libc.malloc_info(0, out)
    libc.fclose(out)
    """
)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the heaps are glibc's")
def test_malloc_keeps_two_heaps_for_all_threads(tmp_path: Path) -> None:
    heaps = {}
    for mode in ("default", "tuned"):
        info = tmp_path / f"{mode}.xml"
        subprocess.run([sys.executable, "-c", HEAPS_AFTER_THREADS, mode, str(info)], check=True, timeout=60)
        heaps[mode] = info.read_text().count("<heap nr=")
    assert heaps["default"] > 2, "without tuning, the threads should have had heaps of their own"
    assert heaps["tuned"] <= 2
