"""moto's S3 server (``python -m moto.server``) on 127.0.0.1, for the ``s3`` mount.

moto keeps every object in its own Python process's memory, so a figure measured against it
is Capella's side plus moto's, never AWS. Credentials are dummies passed as mount options.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.result import BenchmarkFailed
from benchmarks.server import cpu_seconds, exited, free_port

READY_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
REGION = "us-east-1"
ACCESS_KEY = "capella-bench"
SECRET_KEY = "capella-bench-secret"


class MotoServer:
    """One moto server process and a bucket of the benchmark's own on it."""

    def __init__(self, proc: subprocess.Popen[bytes], url: str, log_path: Path) -> None:
        self.proc = proc
        self.url = url
        self.log_path = log_path
        self.bucket = f"capella-bench-{uuid.uuid4().hex[:12]}"

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.proc.pid)

    def mount_toml(self, name: str) -> str:
        """A ``[mounts.NAME]`` table for an ``s3`` mount on this server's bucket."""
        return (
            f"[mounts.{name}]\n"
            'provider = "s3"\n'
            f'bucket = "{self.bucket}"\n'
            'prefix = "capella"\n'
            f'endpoint_url = "{self.url}"\n'
            f'region = "{REGION}"\n'
            f'access_key_id = "{ACCESS_KEY}"\n'
            f'secret_access_key = "{SECRET_KEY}"\n'
            'read_timeout = "30s"\n'
        )

    def create_bucket(self) -> None:
        client = self._client()
        try:
            client.create_bucket(Bucket=self.bucket)
        finally:
            client.close()

    def objects(self) -> tuple[int, int]:
        """How many objects the bucket holds and their total size."""
        client = self._client()
        count = size = 0
        try:
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket):
                for item in page.get("Contents", []):
                    count += 1
                    size += item["Size"]
        finally:
            client.close()
        return count, size

    def _client(self) -> Any:
        import boto3  # the dev extra; only the s3 scenarios need it

        return boto3.client(
            "s3",
            endpoint_url=self.url,
            region_name=REGION,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
        )

    async def wait_ready(self) -> None:
        deadline = time.perf_counter() + READY_TIMEOUT
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
            while time.perf_counter() < deadline:
                if self.proc.poll() is not None:
                    raise BenchmarkFailed(
                        f"moto server exited with {self.proc.returncode}:\n{self.log_tail()}"
                    )
                try:
                    async with session.get(f"{self.url}/moto-api/") as resp:
                        if resp.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.05)
        raise BenchmarkFailed(f"moto server not ready after {READY_TIMEOUT:g} s:\n{self.log_tail()}")

    async def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                stopped = await exited(self.proc, STOP_TIMEOUT)
            except asyncio.CancelledError:
                self.proc.kill()
                raise
            if not stopped:
                self.proc.kill()
                self.proc.wait()

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


@contextlib.asynccontextmanager
async def running_moto(log_path: Path) -> AsyncIterator[MotoServer]:
    """A moto server with an empty bucket (``.bucket``), stopped on the way out."""
    port = free_port()
    command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    with log_path.open("ab") as log:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    moto = MotoServer(proc, f"http://127.0.0.1:{port}", log_path)
    try:
        await moto.wait_ready()
        await asyncio.to_thread(moto.create_bucket)
        yield moto
    finally:
        await moto.stop()
