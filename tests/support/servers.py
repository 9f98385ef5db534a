"""Real servers in subprocesses on free loopback ports: ``capella serve`` and moto's S3.

Every wait is bounded; a process is stopped with SIGTERM, then killed. ``running`` is the one
way a fixture starts a broker: ``yield from running(ServerProcess(...))``.
"""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from support.wait import until_blocking

SERVER_START_TIMEOUT = 20.0
SERVER_STOP_TIMEOUT = 10.0
S3_START_TIMEOUT = 20.0
S3_STOP_TIMEOUT = 10.0
S3_ACCESS_KEY = "capella-test"
S3_SECRET_KEY = "capella-test-secret"
S3_REGION = "us-east-1"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    """``capella serve`` in a subprocess, with its data dir and log file."""

    # How readiness is checked over https:// (a TLS server sets its client context).
    context: ssl.SSLContext | None = None

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        config: Path | None = None,
        env: dict[str, str] | None = None,
        stdin: int = subprocess.DEVNULL,
    ) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = data_dir.parent / f"{data_dir.name}.log"
        self._log = self.log_path.open("ab")
        command = [sys.executable, "-m", "capella", "serve", "--data-dir", str(data_dir)]
        if config is not None:
            command += ["--config", str(config)]
        self.process = subprocess.Popen(
            [*command, "--listen", f"127.0.0.1:{self.port}"],
            # A pipe nobody writes to (subprocess.PIPE) is what Docker gives a service.
            stdin=stdin,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=None if env is None else {**os.environ, **env},
        )

    def wait_ready(self, timeout: float = SERVER_START_TIMEOUT) -> None:
        answering(self.process, f"{self.url}/readyz", "capella serve", self.log, timeout, self.context)

    def kill(self) -> None:
        """``kill -9``: no flush, no clean-up, as in a crash."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(SERVER_STOP_TIMEOUT)
        self._log.close()
        if self.process.stdin is not None:
            self.process.stdin.close()

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(SERVER_STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(SERVER_STOP_TIMEOUT)
        self._log.close()
        if self.process.stdin is not None:
            self.process.stdin.close()
        return self.process.returncode

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")


def answering(
    process: subprocess.Popen[bytes],
    url: str,
    name: str,
    log: Callable[[], str],
    timeout: float,
    context: ssl.SSLContext | None = None,
) -> None:
    """Wait until ``url`` answers 200; fail at once, with the log, if ``process`` exits first."""

    def ready() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode}:\n{log()}")
        try:
            with urllib.request.urlopen(url, timeout=1.0, context=context) as resp:
                return bool(resp.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    try:
        until_blocking(ready, timeout, every=0.05)
    except AssertionError:
        raise RuntimeError(f"{name} not ready after {timeout}s:\n{log()}") from None


def running(server: ServerProcess) -> Iterator[ServerProcess]:
    """For fixtures: ``yield from running(ServerProcess(...))`` waits for it, then stops it."""
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


class S3Server:
    """A moto server process on 127.0.0.1 and how to reach it."""

    def __init__(self, log_path: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log = log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout: float = S3_START_TIMEOUT) -> None:
        answering(self.process, f"{self.url}/moto-api/", "moto server", self.log, timeout)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(S3_STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(S3_STOP_TIMEOUT)
        self._log.close()

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def mount_options(self, bucket: str, **options: object) -> dict[str, object]:
        """A mount's options for ``bucket`` on this server (``endpoint_url`` may be overridden)."""
        return {
            "bucket": bucket,
            "endpoint_url": self.url,
            "region": S3_REGION,
            "access_key_id": S3_ACCESS_KEY,
            "secret_access_key": S3_SECRET_KEY,
            "connect_timeout": 2,
            "read_timeout": 5,
            "max_attempts": 3,
            **options,
        }

    def client(self) -> Any:
        """A plain boto3 client, to look at buckets the way an operator's tools would."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.url,
            region_name=S3_REGION,
            aws_access_key_id=S3_ACCESS_KEY,
            aws_secret_access_key=S3_SECRET_KEY,
        )

    def create_bucket(self) -> str:
        bucket = f"capella-{uuid.uuid4().hex[:16]}"
        client = self.client()
        try:
            client.create_bucket(Bucket=bucket)
        finally:
            client.close()
        return bucket
