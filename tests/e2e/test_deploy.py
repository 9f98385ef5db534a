"""The deployment files work: docker/compose.yaml, its configs and set-up script, the systemd unit.

These machines have no container runtime, so the compose file is checked for what it says
(it parses, names files that exist, takes every credential from the env file), and each
service's command and configuration are started as plain processes with the same arguments:
only where the data lives, the port, and the network the egress policy lets clusters reach (the
compose network becomes loopback) are changed. The set-up service's script then wires them
exactly as in a container, and a reading produced on the edge arrives in both datacenters.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import pg
from support.servers import S3_ACCESS_KEY, S3_SECRET_KEY, S3Server, ServerProcess
from support.wait import until_blocking

from capella.client import Client
from capella.config import load_config

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
COMPOSE = DOCKER / "compose.yaml"
UNIT = ROOT / "deploy" / "capella.service"
BROKERS = ("dc1", "dc2", "edge")
SHARED_NODES = ("shared-1", "shared-2", "shared-3")
CONFIG_IN_CONTAINER = "/etc/capella/capella.toml"
VARIABLE = re.compile(r"\$\{(\w+)(?::?[?-][^}]*)?\}")
COPY_TIMEOUT = 20.0


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return loaded


def example_env() -> dict[str, str]:
    """The variables of docker/capella.env.example."""
    pairs = (line.split("=", 1) for line in (DOCKER / "capella.env.example").read_text().splitlines())
    return {key.strip(): value.strip() for key, *rest in pairs if not key.startswith("#") for value in rest}


def interpolated(environment: dict[str, str], values: dict[str, str]) -> dict[str, str]:
    """A service's ``environment`` with ``${VAR:?...}`` taken from the env file, as compose does."""
    return {key: VARIABLE.sub(lambda m: values[m.group(1)], str(value)) for key, value in environment.items()}


def mounted(service: dict[str, Any], target: str) -> Path:
    """The file of this directory a service mounts at ``target``."""
    for volume in service["volumes"]:
        source, _, rest = volume.partition(":")
        if rest.split(":")[0] == target:
            return (DOCKER / source).resolve()
    raise AssertionError(f"nothing is mounted at {target}")


def test_the_compose_file_parses_and_names_files_that_exist() -> None:
    services = compose()["services"]
    assert set(BROKERS) | {"setup"} <= set(services)
    for name, service in services.items():
        build = service.get("build")
        if build:
            assert (DOCKER / build["context"] / build["dockerfile"]).resolve().is_file(), name
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DOCKER / source).is_file(), f"{name} mounts {source}, which does not exist"
    for broker in BROKERS:
        assert services[broker]["command"][-1] == CONFIG_IN_CONTAINER
        assert mounted(services[broker], CONFIG_IN_CONTAINER).is_file()


def test_every_credential_comes_from_the_env_file_and_none_is_real() -> None:
    values = example_env()
    assert values, "docker/capella.env.example declares no variable"
    assert all(value.startswith("change-me") for value in values.values()), "only placeholders are committed"
    for name, service in compose()["services"].items():
        for value in service.get("environment", {}).values():
            for variable in VARIABLE.findall(str(value)):
                assert variable in values, f"{name} uses {variable}, which capella.env.example lacks"
    assert "docker/capella.env" in (ROOT / ".gitignore").read_text().split()


def test_each_broker_has_its_own_name_auth_and_the_compose_network_in_egress() -> None:
    subnet = compose()["networks"]["capella"]["ipam"]["config"][0]["subnet"]
    names = set()
    for broker in BROKERS:
        service = compose()["services"][broker]
        path = mounted(service, CONFIG_IN_CONTAINER)
        config = load_config(path, {})  # a bad key or value fails here, naming it
        names.add(tomllib.loads(path.read_text())["cluster"]["name"])
        assert config.auth.enabled, f"{path.name}: auth must be on beyond loopback"
        assert config.auth.bootstrap_password_env in service["environment"]
        assert subnet in config.egress.allow, f"{path.name}: clusters cannot reach the compose network"
        for secret in config.secrets.values():
            assert secret.env in service["environment"], f"{path.name}: {secret.env} is not passed in"
    assert len(names) == len(BROKERS), "clusters that copy into each other need different names"


@pytest.fixture
def brokers(tmp_path: Path) -> Iterator[dict[str, ServerProcess]]:
    """Each broker service of compose.yaml as a process: its command, config and environment."""
    values = example_env()
    services = compose()["services"]
    started: dict[str, ServerProcess] = {}
    try:
        for broker in BROKERS:
            service = services[broker]
            table = tomllib.loads(mounted(service, CONFIG_IN_CONTAINER).read_text())
            config = tmp_path / f"{broker}.toml"
            config.write_text(_loopback(mounted(service, CONFIG_IN_CONTAINER).read_text(), table))
            command = service["command"]
            assert command[:2] == ["capella", "serve"], f"{broker} does not run capella serve"
            process = ServerProcess(
                tmp_path / broker, config=config, env=interpolated(service["environment"], values)
            )
            # ServerProcess runs `capella serve --data-dir D --config F --listen L`: the compose
            # command's own arguments, with the container's paths and port moved here.
            assert command[2:] == ["--config", CONFIG_IN_CONTAINER]
            started[broker] = process
        for process in started.values():
            process.wait_ready()
        yield started
    finally:
        for process in started.values():
            process.stop()


def _loopback(text: str, table: dict[str, Any]) -> str:
    """The config with the container's network replaced by loopback: clusters go to 127.0.0.1."""
    allow = [*table["egress"]["allow"], "127.0.0.0/8"]
    text = re.sub(r"(?m)^allow = .*$", f"allow = {allow!r}".replace("'", '"'), text)
    return re.sub(r'(?m)^data_dir = "/data"$', 'data_dir = "unused"', text)


def test_the_services_run_as_processes_and_an_edge_reading_reaches_both_datacenters(
    brokers: dict[str, ServerProcess],
) -> None:
    values = example_env()
    setup = compose()["services"]["setup"]
    assert setup["command"] == ["sh", "/etc/capella/setup.sh"]
    script = mounted(setup, "/etc/capella/setup.sh")
    env = {
        **os.environ,
        **interpolated(setup["environment"], values),
        **{f"{broker.upper()}_URL": process.url for broker, process in brokers.items()},
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    for name in ("CAPELLA_URL", "CAPELLA_USER", "CAPELLA_PASSWORD", "CAPELLA_TOKEN"):
        env.pop(name, None)
    for attempt in ("first", "again"):
        done = subprocess.run(["sh", str(script)], env=env, capture_output=True, timeout=120, check=False)
        assert done.returncode == 0, (
            f"setup ({attempt}) failed:\n{done.stdout.decode()}\n{done.stderr.decode()}"
        )

    with Client(brokers["edge"].url, username="admin", password=values["EDGE_ADMIN_PASSWORD"]) as edge:
        edge.produce("telemetry", [{"data": "t=21.5", "source": "gw-7", "external_id": 1}])
    for dc in ("dc1", "dc2"):
        password = values[f"{dc.upper()}_ADMIN_PASSWORD"]
        with Client(brokers[dc].url, username="admin", password=password) as client:
            until_blocking(
                lambda client=client: client.read("telemetry", after=0).messages,
                within=COPY_TIMEOUT,
                every=0.2,
                what=f"the message copied to {dc}",
            )
            messages = client.read("telemetry", after=0).messages
            assert [(m.source, m.external_id, m.payload) for m in messages] == [("gw-7", 1, b"t=21.5")], dc


def test_the_shared_cluster_s_nodes_share_a_name_a_database_and_a_bucket() -> None:
    services = compose()["services"]
    configs = {node: load_config(mounted(services[node], CONFIG_IN_CONTAINER), {}) for node in SHARED_NODES}
    assert {config.cluster_name for config in configs.values()} == {"shared"}
    shared = {node: config.shared for node, config in configs.items()}
    assert all(settings is not None for settings in shared.values()), "a node without [shared]"
    assert sorted(s.node for s in shared.values() if s is not None) == list(SHARED_NODES)
    assert {(s.mount, s.dsn, s.dsn_secret) for s in shared.values() if s is not None} == {
        ("s3main", None, "shared-dsn")
    }
    setup = " ".join(services["s3-setup"]["command"])
    for node, config in configs.items():
        service = services[node]
        mount = config.mounts["s3main"]
        assert mount.provider == "s3"
        assert mount.options["endpoint_url"] == "http://s3:9000", node
        assert f"shared/{mount.options['bucket']}" in setup, f"{node}: s3-setup makes another bucket"
        # The keys come from boto3's environment chain, never from the file.
        assert "access_key_id" not in mount.options and "AWS_SECRET_ACCESS_KEY" in service["environment"]
        secret = config.secrets["shared-dsn"]
        assert secret.env in service["environment"] and secret.hosts == ("postgres",)
        assert "@postgres:5432/" in service["environment"][secret.env]
        assert config.auth.enabled and config.auth.bootstrap_password_env in service["environment"]
        assert service["depends_on"] == {
            "postgres": {"condition": "service_healthy"},
            "s3-setup": {"condition": "service_completed_successfully"},
        }
    # Only the commits of PostgreSQL hold a shared queue's uncompacted tail.
    command = services["postgres"]["command"]
    assert "synchronous_commit=on" in command and "fsync=on" in command
    assert services["postgres"]["image"].startswith("postgres:15")
    dockerfile = (DOCKER / "Dockerfile").read_text()
    assert "postgres" in re.search(r"pip install '\.\[([^]]*)\]'", dockerfile).group(1).split(","), (
        "the image lacks asyncpg (the postgres extra): a shared node cannot start"
    )


@pytest.fixture
def shared_nodes(tmp_path: Path, s3_server: S3Server) -> Iterator[list[ServerProcess]]:
    """The shared cluster's node services as processes: their configs on this machine's
    PostgreSQL and moto instead of the compose file's (endpoint, bucket, the DSN's host)."""
    missing = pg.available()
    if missing is not None:
        pytest.skip(f"shared queues need PostgreSQL: {missing}")
    values = example_env()
    services = compose()["services"]
    database = pg.PgServer()
    started: list[ServerProcess] = []
    try:
        dsn = database.create_database("shared")
        bucket = s3_server.create_bucket()
        for node in SHARED_NODES:
            service = services[node]
            text = mounted(service, CONFIG_IN_CONTAINER).read_text()
            text = re.sub(r'(?m)^endpoint_url = "http://s3:9000"$', f'endpoint_url = "{s3_server.url}"', text)
            text = re.sub(r'(?m)^bucket = ".*"$', f'bucket = "{bucket}"', text)
            text = re.sub(r'(?m)^hosts = \["postgres"\]$', 'hosts = ["127.0.0.1"]', text)
            text = re.sub(r'(?m)^data_dir = "/data"$', 'data_dir = "unused"', text)
            config = tmp_path / f"{node}.toml"
            config.write_text(text)
            env = interpolated(service["environment"], values)
            assert env["SHARED_DSN"].startswith("postgresql://capella:change-me")
            env["SHARED_DSN"] = dsn
            env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"] = S3_ACCESS_KEY, S3_SECRET_KEY
            started.append(ServerProcess(tmp_path / node, config=config, env=env))
        for process in started:
            process.wait_ready()
        yield started
    finally:
        for process in started:
            process.stop()
        database.close()


def test_the_shared_nodes_run_as_processes_and_a_shared_queue_is_one_queue_on_all_three(
    shared_nodes: list[ServerProcess],
) -> None:
    auth = {"username": "admin", "password": example_env()["SHARED_ADMIN_PASSWORD"]}
    first, second, third = shared_nodes
    with Client(first.url, **auth) as client:
        assert client.put_queue("orders", storage="shared").definition.storage == "shared"
    with Client(second.url, **auth) as client:
        until_blocking(
            lambda: "orders" in {queue.name for queue in client.queues()},
            within=COPY_TIMEOUT,
            every=0.2,
            what="the definition on the second node",
        )
        client.produce("orders", [{"data": "o-1", "source": "shop", "external_id": 1}], save="wait")
    with Client(third.url, **auth) as client:
        until_blocking(
            lambda: client.read("orders", after=0).messages, within=COPY_TIMEOUT, every=0.2, what="the order"
        )
        messages = client.read("orders", after=0).messages
        assert [(m.id, m.source, m.external_id, m.payload) for m in messages] == [(1, "shop", 1, b"o-1")]


def test_the_dockerfile_comment_gives_a_run_that_passes_the_admin_password() -> None:
    dockerfile = (DOCKER / "Dockerfile").read_text()
    runs = [line for line in dockerfile.splitlines() if line.startswith("#") and "docker run" in line]
    variable = tomllib.loads((DOCKER / "capella.toml").read_text())["auth"]["bootstrap_password_env"]
    assert runs and all(variable in line for line in runs), (
        "docker run exits at once without the admin password"
    )


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_the_systemd_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    # verify checks that ExecStart's program exists: give it one at the unit's path.
    unit = tmp_path / UNIT.name
    text = UNIT.read_text()
    program = re.search(r"(?m)^ExecStart=(\S+)", text)
    assert program is not None
    fake = tmp_path / "capella"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    unit.write_text(text.replace(program.group(1), str(fake)))
    done = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(unit)], capture_output=True, timeout=60, check=False
    )
    # Without a running systemd (a container), verify still parses the unit and reports its errors.
    errors = [line for line in done.stderr.decode().splitlines() if _unit_problem(line, unit.name)]
    assert not errors, "\n".join(errors)


def _unit_problem(line: str, name: str) -> bool:
    return name in line and not any(
        benign in line for benign in ("Failed to create", "not found", "Cannot access", "bus")
    )


def test_the_systemd_unit_is_hardened() -> None:
    settings: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and not key.startswith("#"):
            settings.setdefault(key, []).append(value)
    assert settings.get("DynamicUser") == ["yes"] or "User" in settings
    for key, want in {
        "ProtectSystem": "strict",
        "StateDirectory": "capella",
        "NoNewPrivileges": "yes",
        "PrivateTmp": "yes",
        "ProtectHome": "yes",
        "CapabilityBoundingSet": "",  # empty: no capabilities at all
        "SystemCallFilter": "@system-service",
    }.items():
        assert want in settings.get(key, []), f"the unit lacks {key}={want}"
    assert "RestrictAddressFamilies" in settings
    assert "LoadCredential" in settings or "EnvironmentFile" in settings
