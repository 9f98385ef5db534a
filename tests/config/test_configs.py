"""Every shipped configuration file parses, and its mounts and queue defaults are valid; the
[server] transport limits and [server.tls] are read and checked."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from capella.config import ServerSettings, TlsSettings, load_config, parse_config
from capella.core.definition import default_definition
from capella.errors import InvalidConfig
from capella.storage import open_storage

ROOT = Path(__file__).resolve().parents[2]
FILES = [*sorted((ROOT / "configs").glob("*.toml")), *sorted((ROOT / "docker").glob("*.toml"))]


def test_the_example_configs_are_there() -> None:
    names = {path.name for path in FILES}
    assert {"edge.toml", "datacenter.toml", "capella.toml"} <= names


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_shipped_config_loads(path: Path) -> None:
    config = load_config(path)

    # The image's config leaves the name to the broker (generated, kept on the volume); the
    # examples of several brokers name theirs.
    assert config.cluster_name or path == ROOT / "docker" / "capella.toml"
    assert config.default_mount in config.mounts
    for mount in config.mounts.values():
        open_storage(mount.provider, mount.options)
    default_definition(config.queue_defaults, config.default_mount, set(config.mounts))


def test_command_line_overrides_apply_to_a_shipped_config(tmp_path: Path) -> None:
    config = load_config(
        ROOT / "docker" / "capella.toml", {"data_dir": str(tmp_path), "listen": "127.0.0.1:0"}
    )

    assert config.data_dir == tmp_path
    assert (config.server.host, config.server.port) == ("127.0.0.1", 0)


def test_the_edge_config_waits_for_flushes_on_a_zstd_mount() -> None:
    config = load_config(ROOT / "configs" / "edge.toml")

    assert config.mounts["default"].options["compression"] == "zstd"
    assert config.queue_defaults["save"] == "wait"


def test_the_datacenter_config_has_hot_and_cold_mounts() -> None:
    config = load_config(ROOT / "configs" / "datacenter.toml")

    assert set(config.mounts) == {"hot", "cold"}
    assert config.mounts["cold"].options["compression"] == "zstd"
    definition = default_definition(config.queue_defaults, config.default_mount, set(config.mounts))
    assert definition.marks == {0: "hot", 1: "cold"}


def test_two_mounts_on_the_same_directory_are_refused(tmp_path: Path) -> None:
    raw = {
        "cluster": {"data_dir": str(tmp_path)},
        "mounts": {
            "hot": {"provider": "file", "path": "blocks"},
            "warm": {"provider": "file", "path": str(tmp_path / "blocks"), "compression": "zstd"},
        },
    }
    with pytest.raises(InvalidConfig, match="same place"):
        parse_config(raw, {}, base=tmp_path)


def test_a_mount_named_nothing_is_refused(tmp_path: Path) -> None:
    # Queues name their mounts, and the document says a mount's name is not empty (issue 34).
    raw = {"cluster": {"data_dir": str(tmp_path)}, "mounts": {"": {"provider": "memory"}}}
    with pytest.raises(InvalidConfig, match="needs a name"):
        parse_config(raw, {}, base=tmp_path)


def test_the_tiers_config_maps_four_marks_and_keeps_meta_appendable() -> None:
    config = load_config(ROOT / "configs" / "tiers.toml")

    assert [config.mounts[name].provider for name in ("hot", "warm", "cold", "s3")] == ["file"] * 3 + ["s3"]
    assert config.mounts["s3"].options["endpoint_url"].startswith("http://")
    definition = default_definition(config.queue_defaults, config.default_mount, set(config.mounts))
    assert definition.marks == {0: "hot", 1: "warm", 2: "cold", 3: "s3"}
    assert config.mounts[definition.meta_mount].provider == "file"


# --- [server] limits and [server.tls] ----------------------------------------------------------


def server_config(tmp_path: Path, **server: object) -> ServerSettings:
    raw = {"cluster": {"data_dir": str(tmp_path)}, "server": server}
    return parse_config(raw, {}, base=tmp_path).server


def test_the_transport_limits_have_safe_defaults(tmp_path: Path) -> None:
    server = server_config(tmp_path)

    assert server.tls is None
    assert server.max_connections == 1024
    assert server.header_timeout == 10.0
    assert server.max_header_size == 8192
    assert server.max_headers == 100
    assert server.max_json_depth == 32


def test_the_transport_limits_are_read(tmp_path: Path) -> None:
    server = server_config(
        tmp_path,
        max_connections=20,
        header_timeout="1500ms",
        max_header_size="16KiB",
        max_headers=50,
        max_json_depth=8,
    )

    assert (server.max_connections, server.header_timeout) == (20, 1.5)
    assert (server.max_header_size, server.max_headers, server.max_json_depth) == (16384, 50, 8)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("max_connections", 0, "server.max_connections: expected a positive integer"),
        ("header_timeout", "0s", "server.header_timeout: must be greater than 0"),
        ("header_timeout", "soon", "server.header_timeout: expected a duration"),
        ("max_header_size", 0, "server.max_header_size: must be greater than 0"),
        ("max_headers", -1, "server.max_headers: expected a positive integer"),
        ("max_json_depth", "deep", "server.max_json_depth: expected a positive integer"),
    ],
)
def test_bad_transport_limits_are_refused(tmp_path: Path, key: str, value: object, message: str) -> None:
    with pytest.raises(InvalidConfig, match=re.escape(message)):
        server_config(tmp_path, **{key: value})


def test_tls_files_are_found_next_to_the_config_file(tmp_path: Path) -> None:
    for name in ("server.pem", "server.key", "clients.pem"):
        (tmp_path / name).write_text("PEM\n")
    config = tmp_path / "capella.toml"
    config.write_text(
        '[server.tls]\ncert_file = "server.pem"\nkey_file = "server.key"\nclient_ca_file = "clients.pem"\n'
    )

    tls = load_config(config).server.tls

    assert tls == TlsSettings(tmp_path / "server.pem", tmp_path / "server.key", tmp_path / "clients.pem")


def test_tls_without_a_client_ca_asks_for_no_client_certificate(tmp_path: Path) -> None:
    (tmp_path / "server.pem").write_text("PEM\n")
    (tmp_path / "server.key").write_text("PEM\n")

    tls = server_config(tmp_path, tls={"cert_file": "server.pem", "key_file": "server.key"}).tls

    assert tls is not None and tls.client_ca_file is None


@pytest.mark.parametrize(
    ("tls", "message"),
    [
        ("on", "server.tls: expected a table"),
        ({"cert_file": "server.pem"}, "server.tls: key_file must be given"),
        ({}, "server.tls: cert_file and key_file must be given"),
        ({"cert_file": "server.pem", "key_file": "missing.key"}, "server.tls.key_file: no such file"),
        ({"cert_file": "server.pem", "key_file": 1}, "server.tls.key_file: expected a file path"),
        (
            {"cert_file": "server.pem", "key_file": "server.pem", "client_ca_file": "ca.pem"},
            "server.tls.client_ca_file: no such file",
        ),
        (
            {"cert_file": "server.pem", "key_file": "server.pem", "ca_file": "x"},
            "unknown key server.tls.ca_file",
        ),
    ],
)
def test_bad_tls_settings_are_refused(tmp_path: Path, tls: object, message: str) -> None:
    (tmp_path / "server.pem").write_text("PEM\n")

    with pytest.raises(InvalidConfig, match=re.escape(message)):
        server_config(tmp_path, tls=tls)
