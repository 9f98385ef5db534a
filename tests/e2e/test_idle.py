"""An idle server holds only what its configuration uses: no module it does not need, and no
task for a queue that has nothing to do (docs/benchmarks.md, idle memory)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path
from typing import Any

from support.clock import Clock
from support.configs import file_config
from support.servers import ServerProcess, free_port, running
from support.wait import until, until_blocking

from capella.core.cluster import Cluster
from capella.core.message import Draft, SaveMode

# What the default configuration does not use; each is imported when a feature needs it.
NOT_NEEDED = (
    "capella.client",
    "capella.handlers.copy",
    "capella.handlers.push",
    "capella.handlers.postgres",
    "capella.handlers.pg_inbox",
    "capella.handlers.pg_outbox",
    "capella.api.original",  # the original protocol, off by default ([compat] original)
    "capella.api.original.endpoint",
    "capella.shared",  # shared queues: only with [shared]
    "capella.kafka",  # the Kafka listener: only with [kafka]
    "kafka",  # kafka-python, its codec
    "cramjam",
    "zstandard",
    "boto3",
    "asyncpg",
    "difflib",  # did-you-mean for a bad key: loaded on the mistake
    "gzip",  # the console's files are gzip'd by zlib
)

# `capella serve` in this process; once it is ready a thread writes a message, then records
# which modules the server has loaded and stops it.
SERVE_AND_LIST = textwrap.dedent(
    """
    import json, os, signal, sys, threading, time, urllib.request
    from capella.cli import main

    url, out = sys.argv[1], sys.argv[2]

    def call(method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=5) as resp:
            return resp.status

    def probe():
        # Polls by hand: importing the tests' support package would count among the modules.
        for _ in range(600):
            try:
                if call("GET", "/readyz") == 200:
                    break
            except OSError:
                time.sleep(0.05)
        call("PUT", "/v1/queues/orders", {})
        call("POST", "/v1/queues/orders/messages?save=wait", {"messages": [{"data": "a"}]})
        with open(out, "w") as f:
            json.dump(sorted(sys.modules), f)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=probe, daemon=True).start()
    sys.exit(main(sys.argv[3:]))
    """
)


def test_the_default_server_imports_only_what_it_uses(tmp_path: Path) -> None:
    port = free_port()
    out = tmp_path / "modules.json"
    command = [sys.executable, "-c", SERVE_AND_LIST, f"http://127.0.0.1:{port}", str(out)]
    command += ["serve", "--data-dir", str(tmp_path / "data"), "--listen", f"127.0.0.1:{port}"]
    done = subprocess.run(command, capture_output=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr.decode()
    modules = set(json.loads(out.read_text()))
    assert "capella.server" in modules
    loaded = sorted(
        m
        for m in modules
        if m.split(".")[0] in {"boto3", "asyncpg", "zstandard", "kafka", "cramjam"}
        or m in NOT_NEEDED
        or m.startswith(("capella.shared.", "capella.kafka."))
    )
    assert loaded == []


def call(url: str, method: str, path: str, body: object = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url + path, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        return json.loads(resp.read() or b"null")


def test_a_copy_handler_created_on_a_running_server_works(tmp_path: Path) -> None:
    for server in running(ServerProcess(tmp_path / "data")):
        url = server.url
        call(url, "PUT", "/v1/queues/edge", {})
        call(url, "PUT", "/v1/queues/dc", {})
        call(url, "POST", "/v1/queues/edge/messages?save=wait", {"messages": [{"data": "a"}, {"data": "b"}]})
        call(url, "PUT", "/v1/handlers/up", {"type": "copy", "queues": ["edge"], "params": {"to": "dc"}})

        def texts(url: str = url) -> list[str]:
            return [m["data"] for m in call(url, "GET", "/v1/queues/dc/messages?after=0")["messages"]]

        until_blocking(lambda: texts() == ["a", "b"], within=20, what="both messages copied")
        assert texts() == ["a", "b"]
        assert call(url, "GET", "/v1/handlers/up")["status"]["last_error"] is None


def queue_tasks(name: str) -> list[str]:
    return sorted(
        t.get_name() for t in asyncio.all_tasks() if t.get_name().endswith(f":{name}") and not t.done()
    )


async def test_an_idle_queue_has_no_task_and_a_write_after_idleness_is_saved_and_sealed(
    tmp_path: Path, clock: Clock
) -> None:
    config = file_config(tmp_path, block={"max_messages": 10})
    cluster = await Cluster.open(config, clock=clock)
    try:
        queues = [(await cluster.put_queue(f"q{i}", {}))[0] for i in range(50)]
        q = queues[0]
        assert [queue_tasks(f"q{i}") for i in range(50)] == [[]] * 50
        await q.append([Draft(payload=b"first")], SaveMode.WAIT)
        await until(lambda: queue_tasks("q0") == [])
        # After idleness: a full block is written, sealed, and the loops end again.
        await q.append([Draft(payload=f"m{i}".encode()) for i in range(9)], SaveMode.WAIT)
        await until(lambda: q.stats()["blocks"]["by_state"]["sealed"] == 1)
        await until(lambda: queue_tasks("q0") == [])
        await q.append([Draft(payload=b"last")], SaveMode.IMMEDIATE)
        # A delayed message keeps the releaser running until it is released.
        await q.append([Draft(payload=b"later", deliver_at=clock.now + 30)], SaveMode.WAIT)
        assert queue_tasks("q0") == ["release:q0"]
        clock.now += 31
        q.schedule.changed.set()
        await until(lambda: q.last_id == 13)
        await until(lambda: queue_tasks("q0") == [])
        assert all(queue_tasks(f"q{i}") == [] for i in range(1, 50))
    finally:
        await cluster.close()
    # Everything answered is on disk: a fresh process reads it back.
    cluster = await Cluster.open(config, clock=clock)
    try:
        page = await cluster.queue("q0").read_after(0, 100)
        payloads = [m.payload for m in page.messages]
        assert payloads == [b"first", *(f"m{i}".encode() for i in range(9)), b"last", b"later"]
    finally:
        await cluster.close()
