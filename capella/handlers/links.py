"""Links to external Capella clusters: named, persisted, and turned into clients on demand.

A link holds a URL, credentials, TLS settings, timeouts and request compression. Credentials
are never returned by the API or logged: a link either names environment variables that hold
them (``password_env``, ``token_env``), or stores them encrypted at rest with a key kept in
the data directory (``<data_dir>/keys/links.key``, mode 0600; needs the ``cryptography``
package, imported only then). Copy handlers reach a queue on a link as ``link/queue``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import ssl
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from capella.core.cluster import Cluster
from capella.core.definition import check_name
from capella.egress import Egress
from capella.errors import CapellaError, CorruptData, InvalidConfig, InvalidRequest, KeyNotFound, LinkNotFound
from capella.fsync import create_directories, fsync_directory
from capella.handlers.params import duration

if TYPE_CHECKING:
    from capella.client import AsyncClient

log = logging.getLogger(__name__)

REGISTRY_KEY = ".capella/clusters.json"
COMPRESSIONS = ("none", "gzip", "zstd")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


@dataclass(frozen=True, slots=True)
class Link:
    """A named external cluster. ``secret`` is the decrypted password or token, in memory only."""

    name: str
    url: str
    username: str | None = None
    secret: str | None = field(default=None, repr=False)
    secret_kind: str | None = None  # "password" or "token"
    secret_env: str | None = None  # the variable it comes from, when it is not stored
    verify_tls: bool = True
    ca_file: str | None = None
    connect_timeout: float = 5.0
    timeout: float = 30.0
    compression: str = "none"

    def public_dict(self) -> dict[str, Any]:
        """What the API shows: everything but the secret itself."""
        credentials: dict[str, Any] | None = None
        if self.secret_kind is not None:
            credentials = {
                "kind": self.secret_kind,
                "username": self.username,
                "source": f"env:{self.secret_env}" if self.secret_env else "stored encrypted",
            }
        return {
            "name": self.name,
            "url": self.url,
            "credentials": credentials,
            "tls": {"verify": self.verify_tls, "ca_file": self.ca_file},
            "timeouts": {"connect": self.connect_timeout, "request": self.timeout},
            "compression": self.compression,
        }

    def resolved_secret(self) -> str | None:
        if self.secret_env is not None:
            value = os.environ.get(self.secret_env)
            if value is None:
                raise InvalidConfig(f"cluster {self.name}: environment variable {self.secret_env} is not set")
            return value
        return self.secret


class Links:
    """The registry of external clusters, and one client per link."""

    def __init__(self, cluster: Cluster, key_file: Path | None = None, egress: Egress | None = None) -> None:
        self._cluster = cluster
        self._egress = egress  # every connection to a link passes it (None: no check)
        self._key_file = key_file
        self._links: dict[str, Link] = {}
        self._stored: dict[str, dict[str, Any]] = {}  # as persisted (secrets encrypted)
        self._clients: dict[str, AsyncClient] = {}
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        try:
            doc = orjson.loads(await self._cluster.home.get(REGISTRY_KEY))
            stored: dict[str, dict[str, Any]] = doc["clusters"]
        except KeyNotFound:
            stored = {}
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            raise CorruptData(f"cluster link registry {REGISTRY_KEY} is not valid: {exc}") from None
        for name, entry in stored.items():
            try:
                self._links[name] = self._from_stored(name, entry)
                self._stored[name] = entry
            except CapellaError as exc:
                log.error("cluster link cannot be loaded link=%s: %s", name, exc.message)
                self._stored[name] = entry

    async def close(self) -> None:
        for client in self._clients.values():
            await client.close()
        self._clients.clear()

    def links(self) -> list[Link]:
        return [self._links[name] for name in sorted(self._links)]

    def link(self, name: str) -> Link:
        try:
            return self._links[name]
        except KeyError:
            raise LinkNotFound(f"no external cluster {name!r}") from None

    async def put(self, name: str, data: object) -> tuple[Link, bool]:
        check_name(name, "cluster")
        link, stored = self._parse(name, data)
        async with self._lock:
            created = name not in self._links
            self._links[name] = link
            self._stored[name] = stored
            await self._save()
            old = self._clients.pop(name, None)
            if old is not None:
                await old.close()
        log.info("cluster link %s link=%s url=%s", "added" if created else "updated", name, link.url)
        return link, created

    async def drop(self, name: str) -> None:
        async with self._lock:
            self.link(name)
            del self._links[name]
            self._stored.pop(name, None)
            await self._save()
            client = self._clients.pop(name, None)
            if client is not None:
                await client.close()

    def client(self, name: str) -> AsyncClient:
        """A client for the link (built once, reused; dropped when the link changes)."""
        client = self._clients.get(name)
        if client is None:
            # Imported on first use, deliberately: a server without links never loads the
            # HTTP client (~0.6 MB and ~20 ms of start-up).
            from capella.client import AsyncClient

            link = self.link(name)
            secret = link.resolved_secret()
            client = AsyncClient(
                link.url,
                timeout=link.timeout,
                connect_timeout=link.connect_timeout,
                username=link.username if link.secret_kind == "password" else None,
                password=secret if link.secret_kind == "password" else None,
                token=secret if link.secret_kind == "token" else None,
                ssl=_ssl_for(link),
                compression=None if link.compression == "none" else link.compression,
                egress=self._egress,
            )
            self._clients[name] = client
        return client

    async def ping(self, name: str) -> dict[str, Any]:
        """Reach the link's /readyz and an authenticated call; answers what happened."""
        started = time.perf_counter()
        try:
            client = self.client(name)
            ready = await client.ready()
            await client.queues()  # proves the credentials, not only the network
        except CapellaError as exc:
            return {"ok": False, "error": {"code": exc.code, "message": exc.message}}
        latency = (time.perf_counter() - started) * 1000
        return {"ok": ready, "ready": ready, "latency_ms": round(latency, 2), "error": None}

    # --- definitions ---------------------------------------------------------------------

    def _parse(self, name: str, data: object) -> tuple[Link, dict[str, Any]]:
        if not isinstance(data, dict):
            raise InvalidRequest("a cluster link must be a JSON object")
        allowed = {
            "url",
            "username",
            "password",
            "password_env",
            "token",
            "token_env",
            "verify_tls",
            "ca_file",
            "connect_timeout",
            "timeout",
            "compression",
        }
        if unknown := sorted(set(data) - allowed):
            raise InvalidRequest(f"unknown field {unknown[0]!r}", field=unknown[0])
        url = data.get("url")
        if not isinstance(url, str) or not re.fullmatch(r"https?://[^\s/]+(/[^\s]*)?", url):
            raise InvalidRequest("url must be an http:// or https:// URL", field="url")
        if "@" in url.split("/")[2]:
            # The URL is shown and logged: credentials go in username/password, never in it.
            raise InvalidRequest("url must not hold credentials: give username and password", field="url")
        secrets = [k for k in ("password", "password_env", "token", "token_env") if data.get(k) is not None]
        if len(secrets) > 1:
            raise InvalidRequest(f"give only one of {', '.join(secrets)}", field=secrets[1])
        username = data.get("username")
        if username is not None and (not isinstance(username, str) or not username):
            raise InvalidRequest("username must be a non-empty string", field="username")
        kind = secrets[0].split("_")[0] if secrets else None
        if kind == "password" and username is None:
            raise InvalidRequest("a password needs a username", field="username")
        secret_env = data.get(secrets[0]) if secrets and secrets[0].endswith("_env") else None
        if secret_env is not None and (
            not isinstance(secret_env, str) or not _ENV_NAME.fullmatch(secret_env)
        ):
            raise InvalidRequest(f"{secrets[0]} must name an environment variable", field=secrets[0])
        secret = data.get(secrets[0]) if secrets and not secrets[0].endswith("_env") else None
        if secret is not None and (not isinstance(secret, str) or not secret):
            raise InvalidRequest(f"{secrets[0]} must be a non-empty string", field=secrets[0])
        compression = data.get("compression", "none")
        if compression not in COMPRESSIONS:
            raise InvalidRequest(f"compression must be one of {', '.join(COMPRESSIONS)}", field="compression")
        verify = data.get("verify_tls", True)
        if not isinstance(verify, bool):
            raise InvalidRequest("verify_tls must be true or false", field="verify_tls")
        ca_file = data.get("ca_file")
        # os.path.isfile, not Path.is_file: a name too long for the OS is False, not an OSError.
        if ca_file is not None and (not isinstance(ca_file, str) or not os.path.isfile(ca_file)):
            raise InvalidRequest(f"ca_file: no such file {ca_file!r}", field="ca_file")
        link = Link(
            name=name,
            url=url.rstrip("/"),
            username=username,
            secret=secret,
            secret_kind=kind,
            secret_env=secret_env,
            verify_tls=verify,
            ca_file=ca_file,
            connect_timeout=duration(data.get("connect_timeout", 5.0), "connect_timeout"),
            timeout=duration(data.get("timeout", 30.0), "timeout"),
            compression=str(compression),
        )
        stored = {k: v for k, v in link.public_dict().items() if k not in ("name", "credentials")}
        stored["credentials"] = None
        if kind is not None:
            stored["credentials"] = {
                "kind": kind,
                "username": username,
                "env": secret_env,
                "encrypted": None if secret is None else self.encrypt(secret),
            }
        return link, stored

    def _from_stored(self, name: str, entry: dict[str, Any]) -> Link:
        credentials = entry.get("credentials") or {}
        encrypted = credentials.get("encrypted")
        return replace(
            Link(name=name, url=entry["url"]),
            username=credentials.get("username"),
            secret=None if encrypted is None else self.decrypt(encrypted),
            secret_kind=credentials.get("kind"),
            secret_env=credentials.get("env"),
            verify_tls=entry["tls"]["verify"],
            ca_file=entry["tls"]["ca_file"],
            connect_timeout=entry["timeouts"]["connect"],
            timeout=entry["timeouts"]["request"],
            compression=entry["compression"],
        )

    def _fernet(self) -> Any:
        if self._key_file is None:
            raise InvalidRequest("this cluster has no key file: give password_env or token_env instead")
        try:
            from cryptography.fernet import Fernet
        except ImportError:  # optional: only links with stored secrets need it
            raise InvalidRequest(
                "storing a secret needs the cryptography package (pip install 'capella[secrets]'); "
                "or give password_env / token_env"
            ) from None
        if not self._key_file.exists():
            create_directories(self._key_file.parent)
            fd = os.open(self._key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(Fernet.generate_key())
                f.flush()
                os.fsync(f.fileno())
            # Without this the key file's name can vanish at a power cut, and every stored
            # secret with it.
            fsync_directory(self._key_file.parent)
        return Fernet(self._key_file.read_bytes().strip())

    def encrypt(self, secret: str) -> str:
        """``secret`` encrypted with the cluster's key (links and pg handlers store it so)."""
        token: bytes = self._fernet().encrypt(secret.encode())
        return token.decode("ascii")

    def decrypt(self, token: str) -> str:
        """The secret ``encrypt`` gave ``token`` for; ``CorruptData`` when the key changed."""
        try:
            plain: bytes = self._fernet().decrypt(token.encode("ascii"))
        except Exception as exc:  # cryptography's InvalidToken: a lost or changed key file
            raise CorruptData(f"a stored secret cannot be decrypted ({type(exc).__name__})") from None
        return plain.decode()

    async def _save(self) -> None:
        doc = {"version": 1, "clusters": {name: self._stored[name] for name in sorted(self._stored)}}
        await self._cluster.home.put(REGISTRY_KEY, orjson.dumps(doc))


def _ssl_for(link: Link) -> ssl.SSLContext | bool | None:
    if not link.url.startswith("https://"):
        return None
    if not link.verify_tls:
        return False
    try:
        context = ssl.create_default_context(cafile=link.ca_file)
    except OSError as exc:  # ssl.SSLError too: the file went away or holds no certificate
        raise InvalidConfig(f"cluster {link.name}: ca_file {link.ca_file!r} cannot be used: {exc}") from None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context
