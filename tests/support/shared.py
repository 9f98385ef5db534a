"""A shared cluster on loopback: one PostgreSQL, one moto S3 server, N ``capella serve`` nodes.

``SharedRig`` owns a fresh database and a fresh bucket, and writes each node's configuration:
the same ``[cluster] name``, a ``file`` mount ``default`` in the node's own data dir, an ``s3``
mount ``s3main`` on the bucket, and ``[shared]`` naming the node ``node-<i>``, that mount and
the database's DSN. Node ``i`` keeps its port, data dir and configuration across ``kill`` (kill
-9) and ``restart``, so a restarted node is the same node coming back.

PostgreSQL and moto are the rig's own (started here, stopped by ``close``) unless given: the
``shared_rig`` fixture (tests/shared/conftest.py) passes the session's servers, which is
cheap; a test that kills or restarts PostgreSQL builds a rig of its own with
``durable=True`` (``fsync`` and ``synchronous_commit`` on). Never kill the moto server: it
keeps objects in memory only.

    rig = SharedRig(tmp_path, flush_interval="50ms", durable=True)
    try:
        rig.start(3)
        post(rig.node(0).url + "/v1/queues/orders/messages", ...)
        rig.kill(1); rig.restart(1)
        rig.pg.stop("immediate"); rig.pg.start()
    finally:
        rig.close()
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from support.faults import FaultProxy
from support.pg import PgServer
from support.servers import SERVER_START_TIMEOUT, S3Server, ServerProcess, free_port

CLUSTER = "shared-test"
MOUNT = "s3main"
REFUSAL_TIMEOUT = 30.0

Value = str | int | float | bool


def toml_value(value: Value) -> str:
    """A TOML scalar (a JSON string is a TOML basic string for everything a test writes)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(value)


def toml_table(name: str, values: dict[str, Value]) -> str:
    lines = [f"[{name}]", *(f"{key} = {toml_value(value)}" for key, value in values.items())]
    return "\n".join(lines) + "\n"


class SharedRig:
    """One PostgreSQL database, one bucket, and the nodes of a shared cluster on them."""

    def __init__(
        self,
        root: Path,
        *,
        flush_interval: str = "100ms",
        durable: bool = False,
        pg: PgServer | None = None,
        s3: S3Server | None = None,
        shared: dict[str, Value] | None = None,
        extra: str = "",
        proxy: bool = False,
        s3_endpoint: str | None = None,
        pg_port: int | None = None,
    ) -> None:
        """``shared``: more keys of each node's ``[shared]`` table; ``extra``: more TOML tables;
        ``proxy``: the nodes reach S3 through a ``FaultProxy`` of the rig's own (``self.proxy``),
        which counts their calls by kind and can fail, reset or blackhole them; ``s3_endpoint``
        and ``pg_port``: where the nodes reach moto and PostgreSQL instead (a ``TcpProxy`` a test
        can cut, tests/support/tcp_proxy.py)."""
        if pg is not None and durable and not pg.durable:
            raise ValueError("a durable rig needs a durable PgServer (or none: it starts its own)")
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.flush_interval = flush_interval
        self.shared_options = dict(shared or {})
        self.extra = extra
        self.s3_endpoint = s3_endpoint
        self.pg_port = pg_port
        self._own_pg = pg is None
        self._own_s3 = s3 is None
        self._nodes: dict[int, ServerProcess] = {}
        self._ports: dict[int, int] = {}
        self.proxy: FaultProxy | None = None
        self.pg = pg if pg is not None else PgServer(durable=durable)
        try:
            if s3 is None:
                s3 = S3Server(root / "moto.log")
                self.s3 = s3
                s3.wait_ready()
            self.s3 = s3
            self.bucket = s3.create_bucket()
            if proxy:
                self.proxy = FaultProxy(s3.url)
                self.proxy.start()
            self.database = f"shared_{uuid.uuid4().hex[:12]}"
            self.dsn = self.pg.create_database(self.database)
        except BaseException:
            self._close_servers()
            raise

    # --- configuration -------------------------------------------------------------------

    def node_name(self, i: int) -> str:
        return f"node-{i}"

    def data_dir(self, i: int) -> Path:
        return self.root / self.node_name(i)

    def config_path(self, i: int) -> Path:
        return self.root / f"{self.node_name(i)}.toml"

    @property
    def node_dsn(self) -> str:
        """The DSN the nodes are given: the database's, through ``pg_port`` when set."""
        if self.pg_port is None:
            return self.dsn
        return self.pg.dsn(self.database).replace(f":{self.pg.port}/", f":{self.pg_port}/")

    def port(self, i: int) -> int:
        """Node ``i``'s port, chosen once and kept across restarts."""
        if i not in self._ports:
            self._ports[i] = free_port()
        return self._ports[i]

    def config_text(
        self, i: int, *, shared: dict[str, Value | None] | None = None, mounts: str | None = None
    ) -> str:
        """Node ``i``'s TOML. ``shared`` replaces, adds or (None) drops ``[shared]`` keys;
        ``mounts`` replaces the ``[mounts.*]`` tables."""
        table: dict[str, Value | None] = {
            "node": self.node_name(i),
            "mount": MOUNT,
            "dsn": self.node_dsn,
            "flush_interval": self.flush_interval,
            **self.shared_options,
            **(shared or {}),
        }
        endpoint = self.s3_endpoint or (self.proxy.url if self.proxy is not None else self.s3.url)
        s3_options: dict[str, Any] = self.s3.mount_options(self.bucket, endpoint_url=endpoint)
        parts = [
            toml_table("cluster", {"name": CLUSTER}),
            mounts
            if mounts is not None
            else toml_table("mounts.default", {"provider": "file", "path": "queues"})
            + toml_table(f"mounts.{MOUNT}", {"provider": "s3", **s3_options}),
            toml_table("shared", {key: value for key, value in table.items() if value is not None}),
            self.extra,
        ]
        return "\n".join(parts)

    def write_config(self, i: int, text: str | None = None) -> Path:
        path = self.config_path(i)
        path.write_text(self.config_text(i) if text is None else text)
        return path

    # --- what the cluster stored -------------------------------------------------------------

    def objects(self, prefix: str = "shared/") -> list[str]:
        """The keys in the rig's bucket under ``prefix``, sorted (straight from moto, not proxied)."""
        client = self.s3.client()
        try:
            pages = client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
            return sorted(item["Key"] for page in pages for item in page.get("Contents", []))
        finally:
            client.close()

    def sql(self, query: str) -> str:
        """``query``'s rows in the rig's database, as ``psql -At`` prints them."""
        return self.pg.psql(self.database, query)

    # --- nodes ---------------------------------------------------------------------------

    def start(self, n: int) -> list[ServerProcess]:
        """Start nodes ``0 .. n-1`` that are not running, all at once; wait until each is ready."""
        started = [self._spawn(i) for i in range(n) if not self.running(i)]
        for node in started:
            node.wait_ready(SERVER_START_TIMEOUT * 2)  # several start at once on 2 cores
        return [self._nodes[i] for i in range(n)]

    def node(self, i: int) -> ServerProcess:
        """Node ``i``'s process (``.url``, ``.log()``, ``.process``)."""
        return self._nodes[i]

    @property
    def urls(self) -> list[str]:
        return [self._nodes[i].url for i in sorted(self._nodes)]

    def running(self, i: int) -> bool:
        node = self._nodes.get(i)
        return node is not None and node.process.poll() is None

    def kill(self, i: int) -> None:
        """``kill -9`` node ``i``: no flush, no clean-up."""
        self._nodes[i].kill()

    def stop(self, i: int) -> int:
        """SIGTERM node ``i`` and wait for it; its exit code."""
        return self._nodes[i].stop()

    def restart(self, i: int) -> ServerProcess:
        """Node ``i`` again, on its port, data dir and configuration (stopped first if it still runs)."""
        if self.running(i):
            self._nodes[i].stop()
        node = self._spawn(i)
        node.wait_ready()
        return node

    def launch(self, i: int) -> ServerProcess:
        """Start node ``i`` without waiting for ``/readyz`` (it may not become ready soon)."""
        return self._spawn(i)

    def refusal(
        self, i: int, text: str, *, data_dir: Path | None = None, port: int | None = None
    ) -> tuple[int, str]:
        """Start node ``i`` with the configuration ``text``, which it should refuse: exit code,
        output. ``data_dir`` and ``port`` replace node ``i``'s (a second process beside it)."""
        path = self.write_config(i, text)
        done = subprocess.run(
            [sys.executable, "-m", "capella", "serve", "--data-dir", str(data_dir or self.data_dir(i)),
             "--config", str(path), "--listen", f"127.0.0.1:{port or self.port(i)}"],
            capture_output=True, text=True, timeout=REFUSAL_TIMEOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        return done.returncode, done.stdout + done.stderr

    def close(self) -> None:
        """Stop every node, then the servers the rig started itself."""
        try:
            for node in self._nodes.values():
                node.stop()
        finally:
            self._close_servers()

    def _spawn(self, i: int) -> ServerProcess:
        path = self.config_path(i)
        if not path.exists():
            self.write_config(i)
        node = ServerProcess(self.data_dir(i), port=self.port(i), config=path)
        self._nodes[i] = node
        return node

    def _close_servers(self) -> None:
        try:
            if self.proxy is not None:
                self.proxy.stop()
            if self._own_s3 and getattr(self, "s3", None) is not None:
                self.s3.stop()
        finally:
            if self._own_pg:
                self.pg.close()
