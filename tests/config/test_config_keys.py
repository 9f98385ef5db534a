"""Every table of the configuration file takes only its own keys: a misspelt key stops the start
with the file, the dotted key and the key it was probably meant to be. Defaults stay as they were."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from capella.config import (
    MOUNT_KEYS,
    AuthSettings,
    CorsSettings,
    ServerSettings,
    StorageSettings,
    TlsSettings,
    load_config,
)
from capella.core.definition import default_definition
from capella.errors import InvalidConfig
from capella.storage import PROVIDERS
from capella.units import parse_duration, parse_size


def load(tmp_path: Path, text: str) -> None:
    path = tmp_path / "capella.toml"
    path.write_text(text)
    config = load_config(path)
    default_definition(config.queue_defaults, config.default_mount, set(config.mounts), config.source)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[clustre]\n", "unknown key clustre (did you mean cluster?)"),
        ('[cluster]\nnmae = "a"\n', "unknown key cluster.nmae (did you mean cluster.name?)"),
        (
            "[server]\nmax_conections = 10\n",
            "unknown key server.max_conections (did you mean server.max_connections?)",
        ),
        (
            '[server.tls]\ncert_file = "c.pem"\nkey_fiel = "k.pem"\n',
            "unknown key server.tls.key_fiel (did you mean server.tls.key_file?)",
        ),
        (
            '[storage]\nflush_intervall = "5s"\n',
            "unknown key storage.flush_intervall (did you mean storage.flush_interval?)",
        ),
        ("[auth]\nenabeld = true\n", "unknown key auth.enabeld (did you mean auth.enabled?)"),
        (
            '[mounts.hot]\nprovider = "file"\npth = "hot"\n',
            "unknown key mounts.hot.pth (did you mean mounts.hot.path?)",
        ),
        (
            '[mounts.cold]\nprovider = "s3"\nbucket = "b"\nendpoint = "http://x"\n',
            "unknown key mounts.cold.endpoint (did you mean mounts.cold.endpoint_url?)",
        ),
        (
            '[mounts.hot]\nprovider = "fiel"\n',
            "mounts.hot.provider: unknown provider 'fiel' (did you mean 'file'?)",
        ),
        (
            '[queue_defaults]\nsav = "wait"\n',
            "unknown key queue_defaults.sav (did you mean queue_defaults.save?)",
        ),
        (
            "[queue_defaults.limits]\nmax_cont = 10\n",
            "unknown key queue_defaults.limits.max_cont (did you mean queue_defaults.limits.max_count?)",
        ),
        (
            "[queue_defaults.block]\nmax_mesages = 10\n",
            "unknown key queue_defaults.block.max_mesages (did you mean queue_defaults.block.max_messages?)",
        ),
        (
            '[queue_defaults.mounts]\nmeat = "default"\n',
            "unknown key queue_defaults.mounts.meat (did you mean queue_defaults.mounts.meta?)",
        ),
        ("[server]\nzzz = 1\n", "unknown key server.zzz"),
    ],
)
def test_an_unknown_key_is_refused_with_its_dotted_name(tmp_path: Path, text: str, message: str) -> None:
    for name in ("c.pem", "k.pem"):
        (tmp_path / name).write_text("PEM\n")

    with pytest.raises(InvalidConfig) as caught:
        load(tmp_path, text)

    assert caught.value.message == f"{tmp_path / 'capella.toml'}: {message}"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[server]\nmax_batch = 0\n", "server.max_batch: expected a positive integer, got 0"),
        ('[server]\nmax_body_size = "lots"\n', "server.max_body_size: expected a size like '16MiB'"),
        ("[storage]\nflush_interval = 0\n", "storage.flush_interval: must be greater than 0"),
        ('[auth]\nenabled = "yes"\n', "auth.enabled: expected true or false, got 'yes'"),
        ('[auth]\nbootstrap_user = ""\n', "auth.bootstrap_user: expected a non-empty string"),
        ('server = "x"\n', "server: expected a table, got 'x'"),
        ("[mounts.hot]\npath = 'x'\n", "mounts.hot: provider must be given"),
    ],
)
def test_a_bad_value_names_the_file_and_the_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(InvalidConfig, match=re.escape(f"capella.toml: {message}")):
        load(tmp_path, text)


def serve(config: Path, data_dir: Path) -> subprocess.CompletedProcess[str]:
    """A real ``capella serve --config`` process, expected to refuse the file and exit."""
    command = [sys.executable, "-m", "capella", "serve", "--config", str(config), "--data-dir", str(data_dir)]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '[storage]\nflush_intervall = "5s"\n',
            "unknown key storage.flush_intervall (did you mean storage.flush_interval?)",
        ),
        (
            # Checked when the cluster opens, by the queue definition's own fields.
            "[queue_defaults.limits]\nmax_cont = 10\n",
            "unknown key queue_defaults.limits.max_cont (did you mean queue_defaults.limits.max_count?)",
        ),
    ],
)
def test_serve_with_an_unknown_key_exits_2_and_says_which(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "capella.toml"
    path.write_text(text)

    done = serve(path, tmp_path / "data")

    assert done.returncode == 2
    assert done.stderr.strip() == f"capella: {path}: {message}"


def test_the_defaults_are_unchanged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)

    config = load_config()

    assert config.data_dir == tmp_path / "capella-data"
    assert (config.server.host, config.server.port, config.server.tls) == ("127.0.0.1", 8676, None)
    assert config.mounts["default"].provider == "file"
    assert config.mounts["default"].options == {"root": tmp_path / "capella-data" / "queues"}
    assert config.default_mount == "default"
    assert config.server == ServerSettings(
        max_connections=1024,
        header_timeout=10.0,
        max_header_size=8192,
        max_headers=100,
        max_json_depth=32,
        keepalive_timeout=75.0,
        max_body_size=16 * 1024 * 1024,
        max_message_size=1024 * 1024,
        max_batch=10_000,
        body_timeout=30.0,
        max_wait=60.0,
        max_limit=10_000,
        shutdown_timeout=10.0,
    )
    assert config.storage == StorageSettings(flush_interval=1.0, wait_max_delay=0.0, id_lease=100_000)
    assert config.storage.write_timeout == 10.0
    assert config.auth == AuthSettings(
        enabled=False, cache_ttl=300.0, token_ttl=86400.0, token_max_ttl=365 * 86400.0
    )
    assert config.queue_defaults == {}


def test_mount_keys_are_the_providers_arguments() -> None:
    from capella.storage.file import FileStorage
    from capella.storage.memory import MemoryStorage
    from capella.storage.s3 import S3Storage

    def arguments(cls: type) -> set[str]:
        return set(inspect.signature(cls.__init__).parameters) - {"self"}

    assert set(MOUNT_KEYS) == set(PROVIDERS)
    assert MOUNT_KEYS["s3"] == arguments(S3Storage)
    assert MOUNT_KEYS["memory"] == arguments(MemoryStorage)
    assert arguments(FileStorage) == {"root"}  # written as `path`, relative to data_dir
    assert MOUNT_KEYS["file"] == {"path"}


@pytest.mark.parametrize(
    ("text", "seconds"), [("250ms", 0.25), ("30s", 30.0), ("10m", 600.0), ("2d", 172800.0), (5, 5.0)]
)
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("text", "size"),
    # 7865.0: a whole number with a point, which JSON Schema counts as an integer (schemathesis sent it).
    # "0.5": a positive size under one byte is one byte ("0" stays 0).
    [
        ("512k", 512_000),
        ("16MiB", 16 * 1024**2),
        ("8MB", 8 * 10**6),
        (7, 7),
        (7865.0, 7865),
        ("0.5", 1),
        ("0.0001k", 1),
        ("1.5", 1),
        ("0", 0),
    ],
)
def test_sizes(text: object, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("bad", [7.5, float("inf"), float("nan"), True, -1])
def test_a_bad_size_is_a_value_error(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_size(bad)


@pytest.mark.parametrize("bad", ["soon", True, -1, "1e400s", "9" * 400])
def test_a_bad_duration_is_a_value_error_without_a_field_name(bad: object) -> None:
    with pytest.raises(ValueError, match=r"^(expected|must)"):
        parse_duration(bad)


@pytest.mark.parametrize(
    ("table", "settings"),
    [
        ("server", ServerSettings),
        ("server.cors", CorsSettings),
        ("server.tls", TlsSettings),
        ("auth", AuthSettings),
        ("storage", StorageSettings),
    ],
)
def test_every_key_is_in_the_configuration_document(table: str, settings: type[msgspec.Struct]) -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    section = text.split(f"## `[{table}]`", 1)[1].split("\n## ", 1)[0]
    nested = {"tls", "cors"}  # tables of their own
    missing = [
        f.name
        for f in msgspec.structs.fields(settings)
        if f.name not in nested and f"| `{f.name}` |" not in section
    ]
    assert not missing, f"docs/configuration.md [{table}] lacks {missing}"
