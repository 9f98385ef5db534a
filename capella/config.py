"""The only reader of TOML and the environment: ``Config`` and its parts, with defaults.

``capella serve`` with no file runs on ``DEFAULT_TOML``: data in ``./capella-data``,
HTTP on ``127.0.0.1:8676``, one ``file`` mount for everything.
"""

from __future__ import annotations

import ipaddress
import math
import re
import socket
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capella.errors import InvalidConfig

DEFAULT_TOML = """
[cluster]
data_dir = "./capella-data"

[server]
listen = "127.0.0.1:8676"

[mounts.default]
provider = "file"
path = "queues"
"""

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ns|us|ms|s|m|h|d)?\s*$")
_DURATION_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
    "d": 86400.0,
    None: 1.0,
}
# Sizes end up in stored JSON definitions, and orjson writes no integer past 64 bits.
MAX_SIZE = 2**63 - 1
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "b": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4}


def parse_duration(value: object, what: str = "duration") -> float:
    """Seconds from ``"30s"``, ``"10m"``, ``"32d"``, ``"250ms"`` or a number of seconds."""
    if isinstance(value, bool):
        raise InvalidConfig(f"{what}: expected a duration, got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION.match(value)):
        seconds = float(m.group(1)) * _DURATION_UNITS[m.group(2)]
    else:
        raise InvalidConfig(f"{what}: expected a duration like '30s', '10m' or '2d', got {value!r}")
    # Enough digits overflow to inf, which JSON cannot hold: a stored definition would read back null.
    if not math.isfinite(seconds):
        raise InvalidConfig(f"{what}: must be a finite duration")
    if seconds < 0:
        raise InvalidConfig(f"{what}: must not be negative")
    return seconds


def parse_size(value: object, what: str = "size") -> int:
    """Bytes from ``"16MiB"``, ``"8MB"``, ``"512k"`` or a number of bytes."""
    if isinstance(value, bool):
        raise InvalidConfig(f"{what}: expected a size, got {value!r}")
    if isinstance(value, int):
        size = value
    elif isinstance(value, str) and (m := _SIZE.match(value)):
        unit = (m.group(2) or "").lower()
        base = 1024 if "i" in unit else 1000
        letter = unit[:1] if unit not in ("b", "") else ""
        power = " kmgt".index(letter) if letter else 0
        scaled = float(m.group(1)) * (base**power)
        # Checked before int(): enough digits make the float inf, and int(inf) raises.
        if scaled > MAX_SIZE:
            raise InvalidConfig(f"{what}: larger than {MAX_SIZE} bytes")
        size = int(scaled)
    else:
        raise InvalidConfig(f"{what}: expected a size like '16MiB' or '512k', got {value!r}")
    if size < 0:
        raise InvalidConfig(f"{what}: must not be negative")
    if size > MAX_SIZE:
        raise InvalidConfig(f"{what}: larger than {MAX_SIZE} bytes")
    return size


@dataclass(frozen=True, slots=True)
class MountConfig:
    """A named place for blocks and metadata: a provider and its options."""

    name: str
    provider: str
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TlsSettings:
    """HTTPS: the server's certificate and key, and the CA that client certificates must chain to.

    With ``client_ca_file`` set, every client must present a certificate signed by that CA
    (mutual TLS). The files are only checked to exist here; ``server.py`` loads them.
    """

    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """HTTP listener and the limits that keep bad or slow clients harmless."""

    host: str = "127.0.0.1"
    port: int = 8676
    tls: TlsSettings | None = None
    max_connections: int = 1024
    header_timeout: float = 10.0
    max_header_size: int = 8 * 1024
    max_headers: int = 100
    max_json_depth: int = 32
    keepalive_timeout: float = 75.0
    max_body_size: int = 16 * 1024 * 1024
    max_message_size: int = 1024 * 1024
    max_batch: int = 10_000
    body_timeout: float = 30.0
    max_wait: float = 60.0
    max_limit: int = 10_000
    shutdown_timeout: float = 10.0


@dataclass(frozen=True, slots=True)
class StorageSettings:
    """How often ``mark`` writes are saved and how long ``wait`` may batch."""

    flush_interval: float = 1.0
    wait_max_delay: float = 0.0
    id_lease: int = 100_000
    # The longest a write waits inside the broker (a flush, the sealer, the write lock)
    # before it is answered 503 storage_timeout instead.
    write_timeout: float = 10.0


@dataclass(frozen=True, slots=True)
class AuthSettings:
    """Who may connect: users and tokens in ``<data_dir>/auth``, checked when ``enabled``."""

    enabled: bool = False
    # How long a verified Basic password is remembered (keyed digest, memory only).
    cache_ttl: float = 300.0
    token_ttl: float = 86400.0
    token_max_ttl: float = 365 * 86400.0
    # A verified TLS client certificate whose subject CN names a user logs in as that user.
    tls_client_users: bool = False
    # Creates this admin at start when no user exists yet, password from the environment.
    bootstrap_user: str | None = None
    bootstrap_password_env: str | None = None


@dataclass(frozen=True, slots=True)
class Config:
    cluster_name: str
    data_dir: Path
    server: ServerSettings
    storage: StorageSettings
    mounts: dict[str, MountConfig]
    default_mount: str = "default"
    queue_defaults: dict[str, Any] = field(default_factory=dict)
    auth: AuthSettings = field(default_factory=AuthSettings)


def load_config(path: Path | None = None, overrides: dict[str, Any] | None = None) -> Config:
    """Read ``path`` (or the embedded default) and apply command-line ``overrides``.

    ``overrides`` may hold ``data_dir`` and ``listen``.
    """
    text = DEFAULT_TOML
    if path is not None:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise InvalidConfig(f"cannot read config file {path}: {exc.strerror}") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InvalidConfig(f"config {path or '<default>'}: {exc}") from None
    return parse_config(raw, overrides or {}, base=path.parent if path else Path.cwd())


def parse_config(raw: dict[str, Any], overrides: dict[str, Any], base: Path) -> Config:
    known = {"cluster", "server", "storage", "mounts", "queue_defaults", "auth"}
    if unknown := set(raw) - known:
        raise InvalidConfig(f"unknown config section(s): {', '.join(sorted(unknown))}")
    cluster = _table(raw, "cluster")
    data_dir = Path(overrides.get("data_dir") or cluster.get("data_dir", "./capella-data"))
    if not data_dir.is_absolute():
        data_dir = (base / data_dir).resolve()
    name = str(cluster.get("name") or socket.gethostname() or "capella")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}", name):
        raise InvalidConfig(f"cluster.name {name!r}: use letters, digits, '_', '.', '-'")

    srv = _table(raw, "server")
    listen = str(overrides.get("listen") or srv.get("listen", "127.0.0.1:8676"))
    host, port = parse_listen(listen)
    defaults = ServerSettings()
    server = ServerSettings(
        host=host,
        port=port,
        tls=_tls(srv.get("tls"), base),
        max_connections=_positive_int(
            srv.get("max_connections", defaults.max_connections), "server.max_connections"
        ),
        header_timeout=_positive_duration(
            srv.get("header_timeout", defaults.header_timeout), "server.header_timeout"
        ),
        max_header_size=_positive_size(
            srv.get("max_header_size", defaults.max_header_size), "server.max_header_size"
        ),
        max_headers=_positive_int(srv.get("max_headers", defaults.max_headers), "server.max_headers"),
        max_json_depth=_positive_int(
            srv.get("max_json_depth", defaults.max_json_depth), "server.max_json_depth"
        ),
        keepalive_timeout=parse_duration(
            srv.get("keepalive_timeout", defaults.keepalive_timeout), "server.keepalive_timeout"
        ),
        max_body_size=parse_size(srv.get("max_body_size", defaults.max_body_size), "server.max_body_size"),
        max_message_size=parse_size(
            srv.get("max_message_size", defaults.max_message_size), "server.max_message_size"
        ),
        max_batch=_positive_int(srv.get("max_batch", defaults.max_batch), "server.max_batch"),
        body_timeout=parse_duration(srv.get("body_timeout", defaults.body_timeout), "server.body_timeout"),
        max_wait=parse_duration(srv.get("max_wait", defaults.max_wait), "server.max_wait"),
        max_limit=_positive_int(srv.get("max_limit", defaults.max_limit), "server.max_limit"),
        shutdown_timeout=parse_duration(
            srv.get("shutdown_timeout", defaults.shutdown_timeout), "server.shutdown_timeout"
        ),
    )

    st = _table(raw, "storage")
    sdef = StorageSettings()
    storage = StorageSettings(
        flush_interval=parse_duration(
            st.get("flush_interval", sdef.flush_interval), "storage.flush_interval"
        ),
        wait_max_delay=parse_duration(
            st.get("wait_max_delay", sdef.wait_max_delay), "storage.wait_max_delay"
        ),
        id_lease=_positive_int(st.get("id_lease", sdef.id_lease), "storage.id_lease"),
        write_timeout=parse_duration(st.get("write_timeout", sdef.write_timeout), "storage.write_timeout"),
    )
    if storage.flush_interval <= 0:
        raise InvalidConfig("storage.flush_interval: must be greater than 0")
    if storage.write_timeout <= 0:
        raise InvalidConfig("storage.write_timeout: must be greater than 0")

    mounts: dict[str, MountConfig] = {}
    for mount_name, table in _table(raw, "mounts").items():
        if not isinstance(table, dict):
            raise InvalidConfig(f"mounts.{mount_name}: expected a table")
        options = dict(table)
        provider = str(options.pop("provider", ""))
        if not provider:
            raise InvalidConfig(f"mounts.{mount_name}: 'provider' is required")
        if provider == "file":
            mount_path = Path(str(options.pop("path", mount_name)))
            options["root"] = mount_path if mount_path.is_absolute() else data_dir / mount_path
        mounts[mount_name] = MountConfig(name=mount_name, provider=provider, options=options)
    if not mounts:
        mounts["default"] = MountConfig("default", "file", {"root": data_dir / "queues"})
    _check_distinct(mounts)
    default_mount = str(st.get("default_mount", "default" if "default" in mounts else next(iter(mounts))))
    if default_mount not in mounts:
        raise InvalidConfig(f"storage.default_mount {default_mount!r} is not a configured mount")
    auth = _auth_settings(_table(raw, "auth"))
    if not auth.enabled and not is_loopback(server.host):
        raise InvalidConfig(
            f"refusing to listen on {listen} without authentication: anyone who can reach it could "
            "read, write and delete every queue. Set [auth] enabled = true and create an admin "
            "(`capella user add NAME --admin --data-dir DIR` while the server is stopped, or "
            "[auth] bootstrap_user + bootstrap_password_env), or listen on 127.0.0.1 / [::1]."
        )
    return Config(
        cluster_name=name,
        data_dir=data_dir,
        server=server,
        storage=storage,
        mounts=mounts,
        default_mount=default_mount,
        queue_defaults=_table(raw, "queue_defaults"),
        auth=auth,
    )


def _auth_settings(table: dict[str, Any]) -> AuthSettings:
    known = {
        "enabled",
        "cache_ttl",
        "token_ttl",
        "token_max_ttl",
        "tls_client_users",
        "bootstrap_user",
        "bootstrap_password_env",
    }
    if unknown := sorted(set(table) - known):
        raise InvalidConfig(f"auth.{unknown[0]}: unknown setting")
    defaults = AuthSettings()
    for flag in ("enabled", "tls_client_users"):
        if not isinstance(table.get(flag, False), bool):
            raise InvalidConfig(f"auth.{flag}: expected true or false")
    for text in ("bootstrap_user", "bootstrap_password_env"):
        if table.get(text) is not None and not (isinstance(table[text], str) and table[text]):
            raise InvalidConfig(f"auth.{text}: expected a non-empty string")
    if ("bootstrap_user" in table) != ("bootstrap_password_env" in table):
        raise InvalidConfig("auth.bootstrap_user and auth.bootstrap_password_env go together")
    settings = AuthSettings(
        enabled=table.get("enabled", False),
        cache_ttl=parse_duration(table.get("cache_ttl", defaults.cache_ttl), "auth.cache_ttl"),
        token_ttl=parse_duration(table.get("token_ttl", defaults.token_ttl), "auth.token_ttl"),
        token_max_ttl=parse_duration(
            table.get("token_max_ttl", defaults.token_max_ttl), "auth.token_max_ttl"
        ),
        tls_client_users=table.get("tls_client_users", False),
        bootstrap_user=table.get("bootstrap_user"),
        bootstrap_password_env=table.get("bootstrap_password_env"),
    )
    if not 0 < settings.token_ttl <= settings.token_max_ttl:
        raise InvalidConfig("auth.token_ttl: must be greater than 0 and at most auth.token_max_ttl")
    return settings


def is_loopback(host: str) -> bool:
    """Whether ``host`` is only reachable from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name that could resolve anywhere


def _check_distinct(mounts: dict[str, MountConfig]) -> None:
    # Two mounts on one place would make a block move overwrite, then delete, its only copy.
    seen: dict[tuple[object, ...], str] = {}
    for mount in mounts.values():
        options = mount.options
        if mount.provider == "file":
            place: tuple[object, ...] = ("file", Path(options["root"]).resolve())
        elif mount.provider == "s3":
            place = (
                "s3",
                options.get("endpoint_url"),
                options.get("bucket"),
                str(options.get("prefix", "")).strip("/"),
            )
        else:
            continue
        if place in seen:
            raise InvalidConfig(f"mounts.{mount.name} and mounts.{seen[place]} point at the same place")
        seen[place] = mount.name


def parse_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[V6]:PORT`` → (host, port)."""
    host, sep, port_text = listen.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise InvalidConfig(f"listen address {listen!r}: expected HOST:PORT")
    return host.strip("[]") or "127.0.0.1", int(port_text)


def _table(raw: dict[str, Any], name: str) -> dict[str, Any]:
    value = raw.get(name, {})
    if not isinstance(value, dict):
        raise InvalidConfig(f"[{name}] must be a table")
    return value


def _tls(table: object, base: Path) -> TlsSettings | None:
    if table is None:
        return None
    if not isinstance(table, dict):
        raise InvalidConfig("[server.tls] must be a table")
    if unknown := sorted(set(table) - {"cert_file", "key_file", "client_ca_file"}):
        raise InvalidConfig(f"server.tls: unknown key(s): {', '.join(unknown)}")
    missing = [key for key in ("cert_file", "key_file") if table.get(key) is None]
    if missing:
        raise InvalidConfig(f"server.tls: {' and '.join(missing)} must be given (PEM files)")
    client_ca = table.get("client_ca_file")
    return TlsSettings(
        cert_file=_existing_file(table["cert_file"], base, "server.tls.cert_file"),
        key_file=_existing_file(table["key_file"], base, "server.tls.key_file"),
        client_ca_file=None
        if client_ca is None
        else _existing_file(client_ca, base, "server.tls.client_ca_file"),
    )


def _existing_file(value: object, base: Path, what: str) -> Path:
    if not isinstance(value, str) or not value:
        raise InvalidConfig(f"{what}: expected a file path, got {value!r}")
    path = Path(value)
    if not path.is_absolute():
        path = (base / path).resolve()
    if not path.is_file():
        raise InvalidConfig(f"{what}: no such file {str(path)!r}")
    return path


def _positive_duration(value: object, what: str) -> float:
    seconds = parse_duration(value, what)
    if seconds <= 0:
        raise InvalidConfig(f"{what}: must be greater than 0")
    return seconds


def _positive_size(value: object, what: str) -> int:
    size = parse_size(value, what)
    if size <= 0:
        raise InvalidConfig(f"{what}: must be greater than 0")
    return size


def _positive_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidConfig(f"{what}: expected a positive integer, got {value!r}")
    return value
