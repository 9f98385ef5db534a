"""Every shipped configuration file parses, and its mounts and queue defaults are valid."""

from __future__ import annotations

from pathlib import Path

import pytest

from capella.config import load_config, parse_config
from capella.core.definition import default_definition
from capella.errors import InvalidConfig
from capella.storage import open_storage

ROOT = Path(__file__).resolve().parent.parent
FILES = [*sorted((ROOT / "configs").glob("*.toml")), ROOT / "docker" / "capella.toml"]


def test_the_example_configs_are_there() -> None:
    names = {path.name for path in FILES}
    assert {"edge.toml", "datacenter.toml", "capella.toml"} <= names


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_shipped_config_loads(path: Path) -> None:
    config = load_config(path)

    assert config.cluster_name
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


def test_the_tiers_config_maps_four_marks_and_keeps_meta_appendable() -> None:
    config = load_config(ROOT / "configs" / "tiers.toml")

    assert [config.mounts[name].provider for name in ("hot", "warm", "cold", "s3")] == ["file"] * 3 + ["s3"]
    assert config.mounts["s3"].options["endpoint_url"].startswith("http://")
    definition = default_definition(config.queue_defaults, config.default_mount, set(config.mounts))
    assert definition.marks == {0: "hot", 1: "warm", 2: "cold", 3: "s3"}
    assert config.mounts[definition.meta_mount].provider == "file"
