"""``capella serve`` with the Kafka listener on, for tests that drive real Kafka clients.

``KafkaServer`` writes a configuration with ``[kafka]`` on a free loopback port (plus any
tables a test adds) and starts a ``ServerProcess`` on it; ``bootstrap`` is what a client's
``bootstrap.servers`` takes. ``kafka_server`` is the fixture form: ``yield from``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from support.servers import ServerProcess, free_port, running


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML for {value!r}")


def toml(tables: dict[str, dict[str, Any]]) -> str:
    """A TOML document of tables of plain values (dotted names for nested tables)."""
    lines: list[str] = []
    for name, table in tables.items():
        lines.append(f"[{name}]")
        lines += [f"{key} = {toml_value(value)}" for key, value in table.items()]
        lines.append("")
    return "\n".join(lines)


class KafkaServer(ServerProcess):
    """A broker with ``[kafka] listen`` on its own free port."""

    def __init__(
        self,
        root: Path,
        *,
        kafka: dict[str, Any] | None = None,
        tables: dict[str, dict[str, Any]] | None = None,
        env: dict[str, str] | None = None,
        port: int | None = None,
        kafka_port: int | None = None,
    ) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.kafka_port = kafka_port or free_port()
        self.config_path = root / "capella.toml"
        doc = {
            "cluster": {"name": "kafka-test"},
            "kafka": {"listen": f"127.0.0.1:{self.kafka_port}", **(kafka or {})},
            **(tables or {}),
        }
        self.config_path.write_text(toml(doc))
        super().__init__(root / "data", port, config=self.config_path, env=env)
        self.root = root

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.kafka_port}"

    def again(self) -> KafkaServer:
        """The same broker started again on its data, ports and configuration (after a kill)."""
        server = KafkaServer.__new__(KafkaServer)
        server.kafka_port = self.kafka_port
        server.config_path = self.config_path
        server.root = self.root
        ServerProcess.__init__(server, self.data_dir, self.port, config=self.config_path)
        return server


def kafka_server(root: Path, **options: Any) -> Iterator[KafkaServer]:
    """For fixtures: a started ``KafkaServer``, stopped afterwards."""
    server = KafkaServer(root, **options)
    yield from running(server)
