"""A real ``capella serve`` subprocess on 127.0.0.1 with its own data directory.

``running_server`` starts it, waits for ``/readyz`` (that wait is the start-up time), and
always stops it on the way out: SIGTERM and a wait for a clean exit, then SIGKILL if it
hangs. ``profiled`` attaches py-spy to it for the length of a block.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp

from benchmarks.result import BenchmarkFailed

READY_TIMEOUT = 60.0
STOP_TIMEOUT = 60.0
_TICKS = 100  # clock ticks per second in /proc/PID/stat (USER_HZ, 100 on Linux)


class Server:
    """One server process; read its memory and CPU from ``/proc`` while it runs."""

    def __init__(self, proc: subprocess.Popen[bytes], url: str, data_dir: Path, log_path: Path) -> None:
        self.proc = proc
        self.url = url
        self.data_dir = data_dir
        self.log_path = log_path
        self.startup = float("nan")
        self.exit_code: int | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    @classmethod
    async def start(cls, data_dir: Path, log_path: Path, config: Path | None = None) -> Server:
        port = free_port()
        command = [
            sys.executable,
            "-m",
            "capella",
            "serve",
            "--data-dir",
            str(data_dir),
            "--listen",
            f"127.0.0.1:{port}",
        ]
        if config is not None:
            command += ["--config", str(config)]
        with log_path.open("ab") as log:
            spawned = time.perf_counter()
            proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        server = cls(proc, f"http://127.0.0.1:{port}", data_dir, log_path)
        try:
            await server._wait_ready()
        except BaseException:
            await server.stop()
            raise
        server.startup = time.perf_counter() - spawned
        return server

    async def _wait_ready(self) -> None:
        deadline = time.perf_counter() + READY_TIMEOUT
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
            while time.perf_counter() < deadline:
                if self.proc.poll() is not None:
                    raise BenchmarkFailed(f"server exited with {self.proc.returncode}:\n{self.log_tail()}")
                try:
                    async with session.get(f"{self.url}/readyz") as resp:
                        if resp.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.005)
        raise BenchmarkFailed(f"server not ready after {READY_TIMEOUT:g} s:\n{self.log_tail()}")

    def status_kb(self, field: str) -> int:
        """A ``kB`` field of ``/proc/PID/status``: ``VmRSS`` (now) or ``VmHWM`` (peak)."""
        with open(f"/proc/{self.pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
        raise BenchmarkFailed(f"/proc/{self.pid}/status has no {field}")

    def rss_mb(self) -> float:
        return self.status_kb("VmRSS") / 1024

    def peak_rss_mb(self) -> float:
        return self.status_kb("VmHWM") / 1024

    def cpu_seconds(self) -> float:
        """User plus system CPU time of every thread of the server so far."""
        return cpu_seconds(self.pid)

    def kill(self) -> None:
        """SIGKILL, as a crash: nothing is flushed, nothing closed."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.exit_code = self.proc.returncode

    async def stop(self) -> float:
        """SIGTERM, then wait for the exit (SIGKILL after ``STOP_TIMEOUT``); the seconds it took."""
        started = time.perf_counter()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                stopped = await exited(self.proc, STOP_TIMEOUT)
            except asyncio.CancelledError:
                self.proc.kill()  # interrupted again while waiting: leave nothing behind
                raise
            if not stopped:
                self.proc.kill()
                self.proc.wait()
                raise BenchmarkFailed(f"server ignored SIGTERM for {STOP_TIMEOUT:g} s and was killed")
        self.exit_code = self.proc.returncode
        return time.perf_counter() - started

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of every thread of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


@contextlib.asynccontextmanager
async def running_server(data_dir: Path, log_path: Path, config: Path | None = None) -> AsyncIterator[Server]:
    """A started server (``config``: a TOML file for ``--config``), stopped on the way out."""
    server = await Server.start(data_dir, log_path, config)
    try:
        yield server
    finally:
        await server.stop()


@contextlib.asynccontextmanager
async def profiled(server: Server, output: Path | None) -> AsyncIterator[None]:
    """Sample the server with ``py-spy record`` (raw collapsed stacks) while the block runs."""
    if output is None:
        yield
        return
    py_spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if py_spy is None:
        raise BenchmarkFailed("--profile needs py-spy (pip install '.[bench]')")
    command = [
        py_spy,
        "record",
        "--pid",
        str(server.pid),
        "--rate",
        "250",
        "--format",
        "raw",
        "--threads",
        "--nonblocking",  # do not pause the server to sample it: less distortion
        "--output",
        str(output),
    ]
    with output.with_suffix(".log").open("wb") as log:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    await asyncio.sleep(0.5)  # let it attach before the measured part starts
    try:
        yield
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        if not await exited(proc, 30.0):
            proc.kill()
            proc.wait()


async def exited(proc: subprocess.Popen[bytes], within: float) -> bool:
    try:
        await asyncio.to_thread(proc.wait, within)
    except subprocess.TimeoutExpired:
        return False
    return True


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
