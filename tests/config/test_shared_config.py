"""``[shared]``: a node's shared-queue settings are read, checked and refused with the key that is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from capella.config import SharedSettings, load_config
from capella.errors import InvalidConfig

MOUNTS = """
[mounts.default]
provider = "file"
path = "queues"

[mounts.s3main]
provider = "s3"
bucket = "capella-shared"
endpoint_url = "http://127.0.0.1:9000"
"""


def load(tmp_path: Path, shared: str, extra: str = "") -> SharedSettings | None:
    path = tmp_path / "capella.toml"
    path.write_text(f'[cluster]\nname = "shared-test"\n{MOUNTS}\n{shared}\n{extra}')
    return load_config(path).shared


def test_a_server_without_the_table_has_no_shared_settings(tmp_path: Path) -> None:
    assert load(tmp_path, "") is None


def test_the_defaults_are_a_100_ms_window_and_4_mib(tmp_path: Path) -> None:
    shared = load(tmp_path, '[shared]\nnode = "node-a"\nmount = "s3main"\ndsn = "postgresql://pg/capella"\n')
    assert shared == SharedSettings(node="node-a", mount="s3main", dsn="postgresql://pg/capella")
    assert (shared.flush_interval, shared.flush_bytes, shared.dsn_secret) == (0.1, 4 * 1024 * 1024, None)


def test_durations_and_sizes_are_read_in_their_units(tmp_path: Path) -> None:
    shared = load(
        tmp_path,
        '[shared]\nnode = "n"\nmount = "s3main"\ndsn = "postgresql://pg/c"\n'
        'flush_interval = "250ms"\nflush_bytes = "8MiB"\n',
    )
    assert shared is not None
    assert (shared.flush_interval, shared.flush_bytes) == (0.25, 8 * 1024 * 1024)


def test_upkeep_defaults_and_units(tmp_path: Path) -> None:
    base = '[shared]\nnode = "n"\nmount = "s3main"\ndsn = "postgresql://pg/c"\n'
    shared = load(tmp_path, base)
    assert shared is not None
    assert (
        shared.compact_after,
        shared.compact_min,
        shared.compact_interval,
        shared.garbage_grace,
        shared.orphan_after,
    ) == (60.0, 4 * 1024 * 1024, 10.0, 600.0, 3600.0)
    shared = load(
        tmp_path,
        base + 'compact_after = "2s"\ncompact_min = "64KiB"\ncompact_interval = "500ms"\n'
        'garbage_grace = "1m"\norphan_after = "30s"\n',
    )
    assert shared is not None
    assert (
        shared.compact_after,
        shared.compact_min,
        shared.compact_interval,
        shared.garbage_grace,
        shared.orphan_after,
    ) == (2.0, 64 * 1024, 0.5, 60.0, 30.0)


def test_a_declared_secret_may_hold_the_dsn(tmp_path: Path) -> None:
    shared = load(
        tmp_path,
        '[shared]\nnode = "n"\nmount = "s3main"\ndsn_secret = "shared-dsn"\n',
        '[secrets.shared-dsn]\nenv = "SHARED_DSN"\n',
    )
    assert shared is not None and (shared.dsn, shared.dsn_secret) == (None, "shared-dsn")


@pytest.mark.parametrize(
    ("table", "extra", "message"),
    [
        (
            'mount = "nowhere"\ndsn = "postgresql://pg/c"',
            "",
            "shared.mount 'nowhere' is not a configured mount",
        ),
        ('mount = "default"\ndsn = "postgresql://pg/c"', "", "shared.mount 'default' is a file mount"),
        (
            'mount = "s3main"\ndsn = "postgresql://pg/c"\ndsn_secret = "shared-dsn"',
            '[secrets.shared-dsn]\nenv = "SHARED_DSN"\n',
            "give one of dsn and dsn_secret",
        ),
        ('mount = "s3main"', "", "give one of dsn and dsn_secret"),
        (
            'mount = "s3main"\ndsn_secret = "undeclared"',
            "",
            "shared.dsn_secret 'undeclared' is not a declared",
        ),
        ('dsn = "postgresql://pg/c"', "", "shared: mount must be given"),
        ('mount = "s3main"\ndsn = "postgresql://pg/c"\nflush_interval = "0s"', "", "shared.flush_interval"),
        ('mount = "s3main"\ndsn = "postgresql://pg/c"\nflush_interval = "2min"', "", "shared.flush_interval"),
        ('mount = "s3main"\ndsn = "postgresql://pg/c"\nflush_bytes = "1KB"', "", "shared.flush_bytes"),
        ('mount = "s3main"\ndsn = "postgresql://pg/c"\ncompact_min = "0"', "", "shared.compact_min"),
        ('mount = "s3main"\ndsn = "postgresql://pg/c"\ncompact_interval = "0s"', "", "compact_interval"),
        ('mount = "s3main"\ndsn = "postgresql://pg/c"\norphan_after = "500ms"', "", "shared.orphan_after"),
        (
            'mount = "s3main"\ndsn = "postgresql://pg/c"\norphan_after = "5s"',
            '[storage]\nwrite_timeout = "10s"\n',
            "shared.orphan_after (5s) must be longer than storage.write_timeout (10s)",
        ),
        (
            'mount = "s3main"\ndsn = "postgresql://pg/c"\nflush_byte = "1MiB"',
            "",
            "unknown key shared.flush_byte (did you mean shared.flush_bytes?)",
        ),
    ],
)
def test_a_wrong_shared_table_is_refused_naming_the_key(
    tmp_path: Path, table: str, extra: str, message: str
) -> None:
    with pytest.raises(InvalidConfig, match=r"capella\.toml: ") as refused:
        load(tmp_path, f'[shared]\nnode = "node-a"\n{table}\n', extra)
    assert message in str(refused.value)


@pytest.mark.parametrize("node", ["", "a/b", "node a", "ü"])
def test_a_node_name_is_a_declared_name(tmp_path: Path, node: str) -> None:
    with pytest.raises(InvalidConfig, match=r"shared\.node"):
        load(tmp_path, f'[shared]\nnode = "{node}"\nmount = "s3main"\ndsn = "postgresql://pg/c"\n')


def test_a_node_needs_its_name(tmp_path: Path) -> None:
    with pytest.raises(InvalidConfig, match="shared: node must be given"):
        load(tmp_path, '[shared]\nmount = "s3main"\ndsn = "postgresql://pg/c"\n')
