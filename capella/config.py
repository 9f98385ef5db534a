"""The only reader of TOML and the environment: ``Config`` and its parts, with defaults.

Each table of the file is a struct below; its fields are the keys the table takes, and their
defaults are the only place the defaults are written (docs/configuration.md lists them).
``capella serve`` with no file runs on these defaults alone: data in ``./capella-data``, HTTP on
``127.0.0.1:8676``, one ``file`` mount named ``default`` for everything.

An unknown key anywhere, or a bad value, stops the start with ``InvalidConfig`` naming the
file and the dotted key, e.g. ``capella.toml: unknown key server.max_conections (did you mean
server.max_connections?)``. Durations and sizes are read by ``capella.units``.
"""

from __future__ import annotations

import ipaddress
import os
import re
import tomllib
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin

import msgspec

from capella.errors import InvalidConfig
from capella.units import parse_duration, parse_size

# The names the configuration declares, and what takes them: a cluster's ([cluster] name,
# generated ones too: capella/cluster_name.py) and a secret's ([secrets.NAME]), which
# definitions name (capella/wire/params.py, capella/wire/clusters.py).
DECLARED_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}"


@dataclass(frozen=True, slots=True)
class _Read:
    """Marks a field whose TOML value goes through ``read`` before its type is checked."""

    read: Callable[[object], object]


def _path(what: str) -> Callable[[object], Path]:
    def read(value: object) -> Path:
        # Paths come as TOML text, or as Path objects from code that builds the table itself.
        if isinstance(value, Path) or (isinstance(value, str) and value):
            return Path(value)
        raise ValueError(f"expected {what}, got {value!r}")

    return read


def _listen_address(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    _split_listen(value)
    return value


def _origins(value: object) -> tuple[str, ...]:
    """``*``, or web origins as a browser sends them: scheme://host[:port], nothing after."""
    if not isinstance(value, list | tuple):
        raise ValueError(f"expected a list of origins, got {value!r}")
    for origin in value:
        if origin != "*" and not (isinstance(origin, str) and re.fullmatch(r"https?://[^\s/?#@]+", origin)):
            raise ValueError(
                f"expected origins such as https://console.example.com (no path) or *, got {origin!r}"
            )
    return tuple(origin.lower() for origin in value)


def _hosts(value: object) -> tuple[str, ...]:
    """Host names or addresses as a ``Host`` header names them, without the port."""
    if not isinstance(value, list | tuple):
        raise ValueError(f"expected a list of host names, got {value!r}")
    for host in value:
        if not (isinstance(host, str) and re.fullmatch(r"[A-Za-z0-9_.-]+|\[[0-9A-Fa-f:.]+\]", host)):
            raise ValueError(
                f"expected host names such as capella.internal or 10.0.0.5 (no scheme, no port), got {host!r}"
            )
    return tuple(host.lower() for host in value)


Duration = Annotated[float, _Read(parse_duration)]
PositiveDuration = Annotated[float, _Read(parse_duration), msgspec.Meta(gt=0)]
Size = Annotated[int, _Read(parse_size)]
PositiveSize = Annotated[int, _Read(parse_size), msgspec.Meta(gt=0)]
PositiveInt = Annotated[int, msgspec.Meta(ge=1, description="a positive integer")]
Text = Annotated[str, msgspec.Meta(min_length=1, description="a non-empty string")]
FilePath = Annotated[Path, _Read(_path("a file path"))]
Directory = Annotated[Path, _Read(_path("a directory path"))]
Listen = Annotated[str, _Read(_listen_address)]


class ClusterSettings(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """``[cluster]``: who this broker is and where its data lives."""

    name: str | None = None  # None: generated at the first start (capella/cluster_name.py)
    data_dir: Directory = Path("capella-data")


class TlsSettings(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """HTTPS: the server's certificate and key, and the CA that client certificates must chain to.

    With ``client_ca_file`` set, every client must present a certificate signed by that CA
    (mutual TLS). The files are only checked to exist here; ``server.py`` loads them.
    """

    cert_file: FilePath
    key_file: FilePath
    client_ca_file: FilePath | None = None


Origins = Annotated[tuple[str, ...], _Read(_origins)]
Hosts = Annotated[tuple[str, ...], _Read(_hosts)]


class CorsSettings(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """``[server.cors]``: the web origins whose pages may call the API from a browser.

    ``*`` allows any origin, and is refused while authentication is on (a page on any site
    could then act with a signed-in user's browser credentials).
    """

    origins: Origins = ()
    # How long a browser may keep a preflight answer.
    max_age: Duration = 600.0


class _Listening(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """A listener's ``HOST:PORT`` and its parts (HTTP's, and the Kafka listener's)."""

    listen: Listen = "127.0.0.1:8676"

    @property
    def host(self) -> str:
        return _split_listen(self.listen)[0]

    @property
    def port(self) -> int:
        return _split_listen(self.listen)[1]


class ServerSettings(_Listening, forbid_unknown_fields=True, frozen=True):
    """HTTP listener and the limits that keep bad or slow clients harmless."""

    listen: Listen = "127.0.0.1:8676"
    tls: TlsSettings | None = None
    cors: CorsSettings = msgspec.field(default_factory=CorsSettings)
    # With authentication off, the Host names served besides loopback ones (DNS rebinding).
    allowed_hosts: Hosts = ()
    max_connections: PositiveInt = 1024
    # One client address (an IPv6 /64) may hold at most this many of them (at most
    # max_connections), so a few addresses cannot fill the server.
    max_connections_per_address: PositiveInt = 128
    # Idle keep-alive connections one address may keep; past that its oldest idle one closes.
    max_idle_per_address: PositiveInt = 128
    # Requests whose body is still arriving, per address (a stalled upload holds a slot).
    max_bodies_per_address: PositiveInt = 64
    # With authentication on, the Server-Sent Events streams one user may hold at once.
    max_streams_per_user: PositiveInt = 16
    header_timeout: PositiveDuration = 10.0
    max_header_size: PositiveSize = 8 * 1024
    max_headers: PositiveInt = 100
    max_json_depth: PositiveInt = 32
    keepalive_timeout: Duration = 75.0
    max_body_size: Size = 16 * 1024 * 1024
    max_message_size: Size = 1024 * 1024
    # A message's headers are stored with it and pushed with it to every webhook.
    max_message_headers: PositiveInt = 64
    max_message_headers_size: PositiveSize = 16 * 1024
    max_batch: PositiveInt = 10_000
    body_timeout: Duration = 30.0
    max_wait: Duration = 60.0
    max_limit: PositiveInt = 10_000
    shutdown_timeout: Duration = 10.0


class StorageSettings(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """How often ``mark`` writes are saved and how long ``wait`` may batch."""

    flush_interval: PositiveDuration = 1.0
    wait_max_delay: Duration = 0.0
    id_lease: PositiveInt = 100_000
    # The longest a write waits inside the broker (a flush, the sealer, the write lock)
    # before it is answered 503 storage_timeout instead.
    write_timeout: PositiveDuration = 10.0
    # None: the mount named "default", else the first mount (Config.default_mount).
    default_mount: str | None = None


class AuthSettings(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """Who may connect: users and tokens in ``<data_dir>/auth``, checked when ``enabled``."""

    enabled: bool = False
    # How long a verified Basic password is remembered (keyed digest, memory only).
    cache_ttl: Duration = 300.0
    token_ttl: Duration = 86400.0
    token_max_ttl: Duration = 365 * 86400.0
    # A verified TLS client certificate whose subject CN names a user logs in as that user.
    tls_client_users: bool = False
    # Password checks that may fail per client address and per user name within the window
    # (token buckets, refilled evenly); past that, 429 without checking.
    max_failed_logins_per_address: PositiveInt = 10
    max_failed_logins_per_user: PositiveInt = 20
    failed_login_window: PositiveDuration = 60.0
    # Creates this admin at start when no user exists yet, password from the environment.
    bootstrap_user: Text | None = None
    bootstrap_password_env: Text | None = None


def _is_network(entry: str) -> bool:
    try:
        ipaddress.ip_network(entry, strict=False)
    except ValueError:
        return False
    return True


_HOST_NAME = re.compile(r"(\*\.)?[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*")


def _secret_hosts(value: object) -> tuple[str, ...]:
    """Host names, ``*.domain`` patterns, IP addresses or networks a secret may be sent to."""
    if not isinstance(value, list | tuple) or not value:
        raise ValueError(
            f"expected a non-empty list of hosts such as db1.internal or *.example.com, got {value!r}"
        )
    found = []
    for entry in value:
        text = entry.strip("[]").lower().rstrip(".") if isinstance(entry, str) else None
        if text is None or not (_is_network(text) or _HOST_NAME.fullmatch(text)):
            raise ValueError(
                "expected hosts such as db1.internal, *.example.com, 10.0.0.5 or 10.0.0.0/24 "
                f"(no scheme, no port), got {entry!r}"
            )
        found.append(text)
    return tuple(found)


SecretHosts = Annotated[tuple[str, ...], _Read(_secret_hosts)]


class SecretSettings(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """``[secrets.NAME]``: where one secret's value is, read each time it is used.

    Definitions (push, PostgreSQL handlers, external clusters) name the secret, never the
    variable or the file, and using it needs a ``secret use`` rule on its name.
    """

    env: Text | None = None
    file: FilePath | None = None
    # The only hosts a definition may send it to (``SecretSettings.sends_to``); empty: any host
    # the egress policy allows.
    hosts: SecretHosts = ()

    def sends_to(self, host: str) -> bool:
        """Whether a definition may send this secret to ``host`` (a URL's or a DSN's host).

        An entry is a host name (``db1.internal``: that name, any case), ``*.`` and a domain
        (``*.example.com``: any name below it, not the domain itself), an IP address
        (``10.0.0.5``, ``fd00::1``: that address written as such) or a network (``10.0.0.0/24``).
        The host is compared as the definition names it, not as it resolves.
        """
        if not self.hosts:
            return True
        host = host.strip("[]").lower().rstrip(".")
        try:
            address: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
        except ValueError:
            address = None
        for entry in self.hosts:
            if address is not None:
                if _is_network(entry) and address in ipaddress.ip_network(entry, strict=False):
                    return True
            elif entry.startswith("*."):
                if host.endswith(entry[1:]) and len(host) > len(entry) - 1:
                    return True
            elif host == entry:
                return True
        return False

    def value(self) -> str | None:
        """The secret's value now; ``None`` when the variable is unset or the file unreadable."""
        if self.env is not None:
            return os.environ.get(self.env) or None
        assert self.file is not None
        try:
            text = self.file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None
        # A trailing newline is the file's, not the secret's (echo, Docker and Kubernetes secrets).
        return text.removesuffix("\n").removesuffix("\r") or None


def _networks(value: object) -> tuple[str, ...]:
    """CIDR networks or single addresses (``10.0.0.0/8``, ``fd00::/8``, ``203.0.113.7``)."""
    if not isinstance(value, list | tuple):
        raise ValueError(f"expected a list of networks such as 10.0.0.0/8, got {value!r}")
    for network in value:
        try:
            ipaddress.ip_network(network, strict=False)
        except (TypeError, ValueError):
            raise ValueError(f"expected networks such as 10.0.0.0/8 or fd00::/8, got {network!r}") from None
    return tuple(value)


Networks = Annotated[tuple[str, ...], _Read(_networks)]


class EgressSettings(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """``[egress]``: where the broker may connect for a definition (push, PostgreSQL, external clusters).

    With authentication on, only public addresses are allowed, plus the networks in ``allow``;
    with it off (loopback only, one local user) every address is.
    """

    allow: Networks = ()


def _directories(value: object) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or not all(isinstance(d, str) and d for d in value):
        raise ValueError(f"expected a list of directory paths, got {value!r}")
    return tuple(value)


class FilesSettings(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """``[files]``: the directories whose files a definition may name (``capella/file_access.py``).

    A PostgreSQL handler's ``sslrootcert`` and an external cluster's ``ca_file`` must be a
    regular file under one of them unless an admin defines it; with none listed, only admins
    may name files.
    """

    allow: Annotated[tuple[str, ...], _Read(_directories)] = ()


class CompatSettings(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """``[compat]``: the original Capella's RPC endpoint (``POST /cluster``), off unless asked for.

    It is a second, unversioned surface with its own envelope, gzip bodies and ids that
    JavaScript cannot hold exactly (docs/compat.md); a broker that has no original clients
    should not carry it.
    """

    original: bool = False
    # How many external clusters a nested call may pass through (a/b/c/queue is 3).
    max_hops: Annotated[int, msgspec.Meta(ge=1, le=16)] = 4
    # How much of a POST /cluster body is read, and how much it may decompress to, before its
    # sender is signed in (the credentials are inside the body). The original's envelopes
    # are well under 1 KiB; a larger one is read on after sign-in, up to server.max_body_size.
    max_read_before_sign_in: Annotated[int, _Read(parse_size), msgspec.Meta(ge=1024, le=16 * 1024 * 1024)] = (
        64 * 1024
    )


class KafkaSettings(_Listening, forbid_unknown_fields=True, frozen=True):
    """``[kafka]``: the Kafka protocol listener (docs/kafka.md), off unless this table exists.

    Kafka clients connect to ``listen`` and are told to come back to ``advertised`` (this
    address, as they can reach it; ``listen`` when not given). With ``[auth]`` on they sign in
    with SASL/PLAIN as the HTTP API's users; ``tls`` (or ``[server] tls`` when this has none)
    wraps the connections, and a listener beyond loopback needs it, so no password crosses the
    network in the clear. A server without this table imports nothing of capella/kafka/.
    """

    listen: Listen = "127.0.0.1:9092"
    advertised: str | None = None
    # Metadata and Produce for a topic that is no queue create the queue ([queue_defaults]).
    auto_create_topics: bool = False
    tls: TlsSettings | None = None
    # Before a client has signed in, a frame larger than this closes its connection (SASL and
    # ApiVersions frames are a few hundred bytes); after, the limit is server.max_body_size.
    max_frame_before_sign_in: Annotated[int, _Read(parse_size), msgspec.Meta(ge=1024, le=16 << 20)] = 64 << 10
    # A connection that sends nothing for this long is closed (Kafka's connections.max.idle.ms).
    idle_timeout: PositiveDuration = 600.0
    # With [auth] on, a connection that has not signed in this long after it opened (after the
    # TLS handshake, which it also bounds) is closed, as server.header_timeout bounds an HTTP
    # head: strangers cannot hold max_connections by connecting and sending nothing.
    sign_in_timeout: PositiveDuration = 10.0
    max_connections: PositiveInt = 1024
    # Of which one client address (IPv4, or an IPv6 /64) may hold this many, as over HTTP.
    max_connections_per_address: PositiveInt = 128
    # Consumer groups the coordinator holds, and members in one group: a stranger cannot fill memory.
    max_groups: PositiveInt = 10_000
    max_group_members: PositiveInt = 1000

    @property
    def advertised_host(self) -> str:
        return _split_listen(self.advertised or self.listen)[0]

    @property
    def advertised_port(self) -> int:
        return _split_listen(self.advertised or self.listen)[1]


class SharedSettings(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """``[shared]``: where this node's shared queues live (docs/shared.md).

    Every node of a shared cluster names the same PostgreSQL (``dsn``, or ``dsn_secret``: a
    declared secret that holds the DSN) and the same ``s3`` mount, and carries the same
    ``[cluster] name``; ``node`` tells the nodes apart (two live nodes with one name are
    refused at start). A server without this table imports nothing of capella/shared/.
    """

    node: str
    mount: str
    dsn: str | None = None
    dsn_secret: str | None = None
    # A node's writes to every shared queue go to S3 as one object per window, or sooner once
    # this many bytes wait: fewer PUTs per second for a longer window.
    flush_interval: Annotated[float, _Read(parse_duration), msgspec.Meta(ge=0.001, le=60.0)] = 0.1
    flush_bytes: Annotated[int, _Read(parse_size), msgspec.Meta(ge=1024, le=1024 * 1024 * 1024)] = (
        4 * 1024 * 1024
    )
    # Compaction: a queue's segments older than compact_after are rewritten into one ordinary
    # sealed block (up to the queue's block limits) once they span enough objects or
    # compact_min bytes; each node looks every compact_interval, one node per queue at a time.
    compact_after: Annotated[float, _Read(parse_duration), msgspec.Meta(ge=0.01, le=30 * 86400.0)] = 60.0
    compact_min: Annotated[int, _Read(parse_size), msgspec.Meta(ge=1, le=1024 * 1024 * 1024)] = (
        4 * 1024 * 1024
    )
    compact_interval: Annotated[float, _Read(parse_duration), msgspec.Meta(ge=0.01, le=86400.0)] = 10.0
    # The janitor: an object nobody references any more is deleted garbage_grace after it died
    # (readers holding an older segment list still read it meanwhile); an object no commit
    # ever named (its node died between the PUT and the commit) once orphan_after old.
    garbage_grace: Annotated[float, _Read(parse_duration), msgspec.Meta(ge=0.01, le=30 * 86400.0)] = 600.0
    orphan_after: Annotated[float, _Read(parse_duration), msgspec.Meta(ge=1.0, le=30 * 86400.0)] = 3600.0


class _File(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """The tables of a configuration file. ``[mounts.NAME]`` tables are checked by provider
    (``MOUNT_KEYS``); ``[queue_defaults]`` by the queue definition's own fields when the cluster
    opens (``core/definition.py``)."""

    cluster: ClusterSettings = msgspec.field(default_factory=ClusterSettings)
    server: ServerSettings = msgspec.field(default_factory=ServerSettings)
    storage: StorageSettings = msgspec.field(default_factory=StorageSettings)
    mounts: dict[str, Any] = msgspec.field(default_factory=dict)
    queue_defaults: dict[str, Any] = msgspec.field(default_factory=dict)
    auth: AuthSettings = msgspec.field(default_factory=AuthSettings)
    secrets: dict[str, Any] = msgspec.field(default_factory=dict)
    egress: EgressSettings = msgspec.field(default_factory=EgressSettings)
    files: FilesSettings = msgspec.field(default_factory=FilesSettings)
    compat: CompatSettings = msgspec.field(default_factory=CompatSettings)
    shared: SharedSettings | None = None
    kafka: KafkaSettings | None = None


# The keys of a [mounts.NAME] table besides provider, compression and level, by provider: the
# arguments of each provider's class in capella/storage/ (a file mount's `path` becomes `root`).
MOUNT_KEYS: dict[str, frozenset[str]] = {
    "file": frozenset({"path"}),
    "memory": frozenset(),
    "s3": frozenset(
        {
            "bucket",
            "prefix",
            "endpoint_url",
            "region",
            "access_key_id",
            "secret_access_key",
            "session_token",
            "storage_class",
            "connect_timeout",
            "read_timeout",
            "max_attempts",
            "addressing_style",
        }
    ),
}
_ANY_MOUNT_KEYS = frozenset({"provider", "compression", "level"})


class MountConfig(msgspec.Struct, frozen=True):
    """A named place for blocks and metadata: a provider and its options."""

    name: str
    provider: str
    options: dict[str, Any] = msgspec.field(default_factory=dict)


class Config(msgspec.Struct, frozen=True):
    # None when not configured: the name is generated at the first start (capella/cluster_name.py).
    cluster_name: str | None
    data_dir: Path
    server: ServerSettings
    storage: StorageSettings
    mounts: dict[str, MountConfig]
    default_mount: str = "default"
    queue_defaults: dict[str, Any] = msgspec.field(default_factory=dict)
    auth: AuthSettings = msgspec.field(default_factory=AuthSettings)
    secrets: dict[str, SecretSettings] = msgspec.field(default_factory=dict)
    egress: EgressSettings = msgspec.field(default_factory=EgressSettings)
    files: FilesSettings = msgspec.field(default_factory=FilesSettings)
    compat: CompatSettings = msgspec.field(default_factory=CompatSettings)
    shared: SharedSettings | None = None
    kafka: KafkaSettings | None = None
    # Where this configuration came from, to start its error messages: the file as given.
    source: str = "config"


def load_config(path: Path | None = None, overrides: dict[str, Any] | None = None) -> Config:
    """Read ``path`` (or nothing: every default) and apply command-line ``overrides``.

    ``overrides`` may hold ``data_dir`` and ``listen``.
    """
    if path is None:
        return parse_config({}, overrides or {}, base=Path.cwd())
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidConfig(f"cannot read config file {path}: {exc.strerror}") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InvalidConfig(f"{path}: {exc}") from None
    return parse_config(raw, overrides or {}, base=path.parent, source=str(path))


def parse_config(
    raw: dict[str, Any], overrides: dict[str, Any], base: Path, source: str = "config"
) -> Config:
    """The ``Config`` of a parsed TOML document; relative paths are relative to ``base``."""
    try:
        return _config(raw, overrides, base, source)
    except _Refused as exc:
        raise InvalidConfig(f"{source}: {exc}") from None


def unknown_key(path: str, key: str, known: Iterable[str]) -> str:
    """``unknown key server.max_conections (did you mean server.max_connections?)``."""
    prefix = f"{path}." if path else ""
    close = closest(key, known)
    return f"unknown key {prefix}{key}" + (f" (did you mean {prefix}{close}?)" if close else "")


def closest(key: str, known: Iterable[str]) -> str | None:
    """The known key ``key`` was most likely meant to be, if one is close enough."""
    import difflib  # only for a mistake: it is ~140 KB of memory in every idle server

    found = difflib.get_close_matches(key, sorted(known), n=1)
    return found[0] if found else None


def is_loopback(host: str) -> bool:
    """Whether ``host`` is only reachable from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name that could resolve anywhere


class _Refused(Exception):
    """What is wrong, with its dotted key; ``parse_config`` adds the file once."""


def _config(raw: dict[str, Any], overrides: dict[str, Any], base: Path, source: str) -> Config:
    raw = dict(raw)
    for table, key in (("cluster", "data_dir"), ("server", "listen")):
        if overrides.get(key):
            raw[table] = {**_table(raw.get(table, {}), table), key: overrides[key]}
    tables = _read(raw, _File, "")

    data_dir = tables.cluster.data_dir
    if not data_dir.is_absolute():
        data_dir = (base / data_dir).resolve()
    # None: generated and kept in the data directory at the first start (capella/cluster_name.py);
    # parsing writes nothing.
    name = tables.cluster.name
    if name is not None and not re.fullmatch(DECLARED_NAME, name):
        raise _Refused(f"cluster.name {name!r}: use letters, digits, '_', '.', '-'")

    server = tables.server
    if server.tls is not None:
        server = msgspec.structs.replace(server, tls=_found(server.tls, base))
    mounts = _mounts(tables.mounts, data_dir)
    default_mount = tables.storage.default_mount or ("default" if "default" in mounts else next(iter(mounts)))
    if default_mount not in mounts:
        raise _Refused(f"storage.default_mount {default_mount!r} is not a configured mount")

    auth = tables.auth
    if (auth.bootstrap_user is None) != (auth.bootstrap_password_env is None):
        raise _Refused("auth.bootstrap_user and auth.bootstrap_password_env go together")
    if not 0 < auth.token_ttl <= auth.token_max_ttl:
        raise _Refused("auth.token_ttl: must be greater than 0 and at most auth.token_max_ttl")
    if auth.enabled and "*" in server.cors.origins:
        raise _Refused(
            "server.cors.origins: * is refused while [auth] is enabled: any web page could then call the "
            "API with a signed-in user's credentials; list the origins of your own pages instead"
        )
    if not auth.enabled and not is_loopback(server.host):
        raise _Refused(
            f"refusing to listen on {server.listen} without authentication: anyone who can reach it "
            "could read, write and delete every queue. Set [auth] enabled = true and create an admin "
            "(`capella user add NAME --admin --data-dir DIR` while the server is stopped, or "
            "[auth] bootstrap_user + bootstrap_password_env), or listen on 127.0.0.1 / [::1]."
        )
    return Config(
        cluster_name=name,
        data_dir=data_dir,
        server=server,
        storage=tables.storage,
        mounts=mounts,
        default_mount=default_mount,
        queue_defaults=tables.queue_defaults,
        auth=auth,
        secrets=_secrets(tables.secrets, base),
        egress=tables.egress,
        files=_files(tables.files, base),
        compat=tables.compat,
        shared=_shared(tables.shared, mounts, tables.secrets, tables.storage.write_timeout),
        kafka=_kafka(tables.kafka, server, auth.enabled, base),
        source=source,
    )


def _kafka(
    kafka: KafkaSettings | None, server: ServerSettings, auth: bool, base: Path
) -> KafkaSettings | None:
    if kafka is None:
        return None
    if kafka.advertised is not None:
        try:
            _split_listen(kafka.advertised)
        except ValueError as exc:
            raise _Refused(f"kafka.advertised: {exc}") from None
    tls = _found(kafka.tls, base) if kafka.tls is not None else server.tls
    kafka = msgspec.structs.replace(kafka, tls=tls)
    if not is_loopback(kafka.host):
        if not auth:
            raise _Refused(
                f"refusing to listen for Kafka clients on {kafka.listen} without authentication: "
                "anyone who can reach it could read and write every queue. Set [auth] enabled = true "
                "(clients then sign in with SASL/PLAIN), or listen on 127.0.0.1 / [::1]."
            )
        if tls is None:
            raise _Refused(
                f"refusing to listen for Kafka clients on {kafka.listen} without TLS: SASL/PLAIN "
                "would send passwords in the clear. Give [kafka] tls (or [server] tls), or listen "
                "on 127.0.0.1 / [::1]."
            )
    if kafka.port == server.port and kafka.host == server.host:
        raise _Refused(
            f"kafka.listen {kafka.listen} is server.listen too: give the Kafka listener a port of its own"
        )
    return kafka


def _shared(
    shared: SharedSettings | None,
    mounts: dict[str, MountConfig],
    secrets: dict[str, Any],
    write_timeout: float,
) -> SharedSettings | None:
    if shared is None:
        return None
    if shared.orphan_after <= write_timeout:
        # A flush commits within the write timeout; an object younger than that may still be
        # committed, and deleting it would lose what the commit then points at.
        raise _Refused(
            f"shared.orphan_after ({shared.orphan_after:g}s) must be longer than "
            f"storage.write_timeout ({write_timeout:g}s)"
        )
    if not re.fullmatch(DECLARED_NAME, shared.node):
        raise _Refused(f"shared.node {shared.node!r}: use letters, digits, '_', '.', '-'")
    if (shared.dsn is None) == (shared.dsn_secret is None):
        raise _Refused("shared: give one of dsn and dsn_secret (a declared secret holding the DSN)")
    if shared.dsn_secret is not None and shared.dsn_secret not in secrets:
        raise _Refused(f"shared.dsn_secret {shared.dsn_secret!r} is not a declared [secrets.NAME]")
    mount = mounts.get(shared.mount)
    if mount is None:
        raise _Refused(f"shared.mount {shared.mount!r} is not a configured mount")
    if mount.provider != "s3":
        raise _Refused(
            f"shared.mount {shared.mount!r} is a {mount.provider} mount: shared queues need an s3 mount"
        )
    return shared


S = TypeVar("S", bound=msgspec.Struct)


def _read(table: object, cls: type[S], path: str) -> S:
    """``table`` as a ``cls``: every key known, every value read and checked, the rest defaults."""
    table = _table(table, path)
    fields = {f.name: f for f in msgspec.structs.fields(cls)}
    values = {}
    for key, value in table.items():
        if key not in fields:
            raise _Refused(unknown_key(path, key, fields))
        values[key] = _value(value, fields[key].type, f"{path}.{key}" if path else key)
    if missing := [f.name for f in fields.values() if f.required and f.name not in values]:
        raise _Refused(f"{path}: {' and '.join(missing)} must be given")
    return cls(**values)


def _value(value: object, kind: Any, where: str) -> Any:
    if get_origin(kind) in (Union, types.UnionType):  # X | None: TOML has no null, so X
        kind = next(arg for arg in get_args(kind) if arg is not type(None))
    if isinstance(kind, type) and issubclass(kind, msgspec.Struct):
        return _read(value, kind, where)
    metadata = getattr(kind, "__metadata__", ())
    for read in (m.read for m in metadata if isinstance(m, _Read)):
        try:
            value = read(value)
        except ValueError as exc:
            raise _Refused(f"{where}: {exc}") from None
    try:
        return msgspec.convert(value, kind)
    except msgspec.ValidationError as exc:
        described = [m.description for m in metadata if isinstance(m, msgspec.Meta) and m.description]
        reason = f"expected {described[0]}, got {value!r}" if described else _reason(str(exc), value)
        raise _Refused(f"{where}: {reason}") from None


_BOUND = re.compile(r"Expected `\w+` ([<>]=?) (\S+)")
_TYPE = re.compile(r"Expected `(\w+)`")
_KINDS = {"int": "an integer", "float": "a number", "str": "a string", "bool": "true or false"}
_KINDS |= {"object": "a table", "array": "an array"}
_COMPARED = {">": "greater than", ">=": "at least", "<": "less than", "<=": "at most"}


def _reason(problem: str, value: object) -> str:
    """msgspec's finding about one value, in the words of the rest of the file's errors."""
    if bound := _BOUND.match(problem):
        compared, limit = bound.group(1), bound.group(2).removesuffix(".0")
        if (compared, limit) == (">=", "1"):  # how msgspec words an integer's gt=0
            compared, limit = ">", "0"
        return f"must be {_COMPARED[compared]} {limit}"
    if kind := _TYPE.match(problem):
        return f"expected {_KINDS.get(kind.group(1), kind.group(1))}, got {value!r}"
    return problem.partition(" - at ")[0]


def _table(value: object, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _Refused(f"{path}: expected a table, got {value!r}")
    return value


def _mounts(tables: dict[str, Any], data_dir: Path) -> dict[str, MountConfig]:
    mounts: dict[str, MountConfig] = {}
    for name, value in tables.items():
        path = f"mounts.{name}"
        if not name:
            # A queue names its mounts, and the document says a mount's name is not empty.
            raise _Refused('mounts."": a mount needs a name')
        options = dict(_table(value, path))
        provider = options.pop("provider", None)
        if provider is None:
            raise _Refused(f"{path}: provider must be given")
        if provider not in MOUNT_KEYS:
            close = closest(str(provider), MOUNT_KEYS)
            hint = f" (did you mean {close!r}?)" if close else f" (known: {', '.join(MOUNT_KEYS)})"
            raise _Refused(f"{path}.provider: unknown provider {provider!r}{hint}")
        known = MOUNT_KEYS[provider] | _ANY_MOUNT_KEYS
        if unknown := sorted(set(options) - known):
            raise _Refused(unknown_key(path, unknown[0], known))
        if provider == "file":
            mount_path = Path(str(options.pop("path", name)))
            options["root"] = mount_path if mount_path.is_absolute() else data_dir / mount_path
        mounts[name] = MountConfig(name=name, provider=provider, options=options)
    if not mounts:
        mounts["default"] = MountConfig("default", "file", {"root": data_dir / "queues"})
    _check_distinct(mounts)
    return mounts


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
            raise _Refused(f"mounts.{mount.name} and mounts.{seen[place]} point at the same place")
        seen[place] = mount.name


def _secrets(tables: dict[str, Any], base: Path) -> dict[str, SecretSettings]:
    secrets: dict[str, SecretSettings] = {}
    for name, value in tables.items():
        path = f"secrets.{name}"
        if not re.fullmatch(DECLARED_NAME, name):
            raise _Refused(f"{path}: a secret's name uses letters, digits, '_', '.', '-'")
        secret = _read(value, SecretSettings, path)
        if (secret.env is None) == (secret.file is None):
            raise _Refused(f"{path}: give exactly one of env and file")
        if secret.file is not None and not secret.file.is_absolute():
            secret = msgspec.structs.replace(secret, file=(base / secret.file).resolve())
        secrets[name] = secret
    return secrets


def _files(files: FilesSettings, base: Path) -> FilesSettings:
    """``files`` with its directories made absolute (relative to the config file)."""
    return FilesSettings(allow=tuple(str((base / d).resolve()) for d in files.allow))


def _found(tls: TlsSettings, base: Path) -> TlsSettings:
    """``tls`` with its files made absolute (relative to the config file) and found."""
    files: dict[str, Path] = {}
    for name in ("cert_file", "key_file", "client_ca_file"):
        path: Path | None = getattr(tls, name)
        if path is None:
            continue
        if not path.is_absolute():
            path = (base / path).resolve()
        if not path.is_file():
            raise _Refused(f"server.tls.{name}: no such file {str(path)!r}")
        files[name] = path
    return msgspec.structs.replace(tls, **files)


def _split_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[V6]:PORT`` → (host, port)."""
    host, sep, port_text = listen.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"expected HOST:PORT, got {listen!r}")
    return host.strip("[]") or "127.0.0.1", int(port_text)
