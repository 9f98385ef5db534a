"""External Capella clusters: named, persisted, and turned into clients on demand.

A cluster holds a URL, credentials, TLS settings, timeouts and request compression. Credentials
are never returned by the API or logged: a cluster either names a secret the operator declared
(``password_secret``, ``token_secret``; whoever defines the cluster needs ``secret use`` on it),
or stores them encrypted at rest with a key kept in the data directory
(``<data_dir>/keys/links.key``, a file name kept from before, mode 0600; needs the
``cryptography`` package, imported only then), bound to the cluster's name, URL and user so
the ciphertext is of no use elsewhere. A cluster whose stored credentials cannot be read is
still listed, with its ``error``. Copy handlers reach a queue on a cluster as ``cluster/queue``.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import re
import ssl
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import msgspec

from capella.auth.rule import UNRESTRICTED, Identity
from capella.auth.secret import Secrets
from capella.core.cluster import Cluster
from capella.core.definition import check_name
from capella.egress import Egress
from capella.errors import (
    CapellaError,
    ClusterNotFound,
    Conflict,
    CorruptData,
    InvalidConfig,
    InvalidRequest,
    SameClusterName,
    Unreachable,
)
from capella.file_access import FileAccess, ca_data
from capella.fsync import write_atomic
from capella.storage.catalog import CLUSTERS, ClusterRegistry
from capella.wire.answers import ErrorDetail
from capella.wire.clusters import (
    MAX_TIMEOUT,
    ClusterCredentials,
    ClusterInfo,
    ClusterPing,
    ClusterTimeouts,
    ClusterTls,
    NameCheck,
)
from capella.wire.fields import URL_EXCLUDED, seconds

if TYPE_CHECKING:
    from capella.client import AsyncClient

# As CLUSTER_URL_PATTERN, but taking "@", which is refused in words (credentials in the URL).
_URL = re.compile(rf"https?://[^{URL_EXCLUDED}/]+(/[^{URL_EXCLUDED}]*)?")
log = logging.getLogger(__name__)
# The log lines keep their older words ("cluster link ... link=NAME"): operators' alerts and
# searches match them.

# How long adding a cluster waits for the far side to say its name before accepting it unchecked.
NAME_CHECK_TIMEOUT = 3.0
COMPRESSIONS = ("none", "gzip", "zstd")
# The prefix of a ciphertext bound to its context (AES-GCM); older ones are Fernet tokens.
SEALED = "v2:"
_SECRET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


@dataclass(frozen=True, slots=True)
class ExternalCluster:
    """A named external cluster. ``secret`` is the decrypted password or token, in memory only."""

    name: str
    url: str
    username: str | None = None
    secret: str | None = field(default=None, repr=False)
    secret_kind: str | None = None  # "password" or "token"
    secret_name: str | None = None  # the declared secret it comes from, when it is not stored
    verify_tls: bool = True
    ca_file: str | None = None
    # Defined by an admin, whose definitions may name any file (capella/file_access.py).
    by_admin: bool = False
    connect_timeout: float = 5.0
    timeout: float = 30.0
    compression: str = "none"
    # Why the cluster cannot be used (its stored credentials do not decrypt): shown, not hidden.
    error: str | None = None

    def info(self) -> ClusterInfo:
        """What the API shows: everything but the secret itself."""
        credentials = None
        if self.secret_kind is not None:
            source = f"secret:{self.secret_name}" if self.secret_name else "stored encrypted"
            credentials = ClusterCredentials(self.secret_kind, self.username, source)  # type: ignore[arg-type]  # "password" or "token"
        return ClusterInfo(
            name=self.name,
            url=self.url,
            credentials=credentials,
            tls=ClusterTls(self.verify_tls, self.ca_file),
            timeouts=ClusterTimeouts(self.connect_timeout, self.timeout),
            compression=self.compression,  # type: ignore[arg-type]  # one of COMPRESSIONS, checked by _parse
            error=self.error,
        )

    def public_dict(self) -> dict[str, Any]:
        """``info`` as plain JSON values."""
        shown: dict[str, Any] = msgspec.to_builtins(self.info())
        return shown

    def context(self) -> tuple[str, ...]:
        """What a stored secret of this cluster is bound to."""
        # "cluster link" is the stored ciphertexts' associated data (from when clusters were
        # called links): another word would leave every stored secret undecryptable.
        return ("cluster link", self.name, self.url, self.secret_kind or "", self.username or "")


class Clusters:
    """The registry of external clusters, and one client per cluster."""

    def __init__(
        self,
        cluster: Cluster,
        key_file: Path | None = None,
        secrets: Secrets | None = None,
        egress: Egress | None = None,
        files: FileAccess | None = None,
    ) -> None:
        self._cluster = cluster
        self._files = files or FileAccess()
        self._egress = egress  # every connection to a cluster passes it (None: no check)
        self._key_file = key_file
        self._secrets = secrets or Secrets()
        self._defined: dict[str, ExternalCluster] = {}
        self._stored: dict[str, dict[str, Any]] = {}  # as persisted (secrets encrypted)
        self._clients: dict[str, AsyncClient] = {}
        # The secret and CA bundle each client was built with.
        self._client_secrets: dict[str, tuple[str | None, bytes | None]] = {}
        # Clients replaced after a secret rotated: a request may still be using one.
        self._retired: list[AsyncClient] = []
        # The client whose far side's name was checked, by cluster (copy checks once per client).
        self._checked: dict[str, AsyncClient] = {}
        self._far_names: dict[str, str | None] = {}  # the far side's cluster name, once checked
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        stored = (await CLUSTERS.load(self._cluster.home)).clusters
        for name, entry in stored.items():
            self._stored[name] = entry
            try:
                self._defined[name] = self._from_stored(name, entry)
            except CapellaError as exc:
                log.error("cluster link cannot be loaded link=%s: %s", name, exc.message)
                # Listed with its error, not hidden: an operator sees it and gives the secret again.
                url = entry.get("url")
                self._defined[name] = ExternalCluster(
                    name=name, url=url if isinstance(url, str) else "", error=exc.message
                )

    async def close(self) -> None:
        for client in [*self._clients.values(), *self._retired]:
            await client.close()
        self._clients.clear()
        self._retired.clear()

    def clusters(self) -> list[ExternalCluster]:
        return [self._defined[name] for name in sorted(self._defined)]

    def cluster(self, name: str) -> ExternalCluster:
        try:
            return self._defined[name]
        except KeyError:
            raise ClusterNotFound(f"no external cluster {name!r}") from None

    async def put(
        self, name: str, data: object, by: Identity = UNRESTRICTED
    ) -> tuple[ExternalCluster, bool, NameCheck]:
        """Add or replace a cluster; a named secret must be one ``by`` may use.

        Answers the cluster, whether it was created, and the check of the far side's name
        (``name_check``: ``checked``, the far side's ``cluster``, and the ``error`` that kept
        it from being checked).
        """
        check_name(name, "cluster")
        cluster, stored = self._parse(name, data, by.admin)
        if cluster.secret_name is not None:
            self._secrets.use(cluster.secret_name, by, f"{cluster.secret_kind}_secret", to=_host(cluster.url))
        if cluster.ca_file is not None:
            # As the definer may name files; read again for every client it is used for.
            await self._files.read(cluster.ca_file, admin=by.admin, field="ca_file")
        # Before it is stored: a same-named far side is refused (409); one that cannot be reached
        # now is accepted (an edge device adds one while offline) and the answer says so.
        check = await self._name_check(cluster)
        async with self._lock:
            created = name not in self._defined
            self._defined[name] = cluster
            self._stored[name] = stored
            await self._save()
            old = self._clients.pop(name, None)
            self._checked.pop(name, None)
            if old is not None:
                await old.close()
        log.info("cluster link %s link=%s url=%s", "added" if created else "updated", name, cluster.url)
        return cluster, created, check

    async def drop(self, name: str, used_by: list[str] | None = None) -> None:
        """Forget a cluster; ``used_by`` names the handlers that use it, which refuse the drop."""
        if used_by:
            raise Conflict(
                f"cluster {name!r} is used by handler{'s' if len(used_by) > 1 else ''} "
                f"{', '.join(sorted(used_by))}: drop or change them first",
                handlers=sorted(used_by),
            )
        async with self._lock:
            self.cluster(name)
            del self._defined[name]
            self._stored.pop(name, None)
            await self._save()
            client = self._clients.pop(name, None)
            if client is not None:
                await client.close()

    def credentials(self, name: str) -> tuple[str | None, str | None, str | None]:
        """The cluster's ``(kind, username, secret)``: kind ``password``, ``token`` or None.

        For envelopes of the original protocol, which carry the credentials in their body.
        """
        cluster = self.cluster(name)
        return cluster.secret_kind, cluster.username, self._secret(cluster)

    def _secret(self, cluster: ExternalCluster) -> str | None:
        if cluster.error is not None:
            raise InvalidConfig(f"cluster {cluster.name}: {cluster.error}")
        if cluster.secret_name is not None:
            # Granted when the cluster was defined; read now, so a rotated value is used, and
            # only for the hosts it is bound to.
            return self._secrets.use(
                cluster.secret_name, UNRESTRICTED, f"cluster {cluster.name}", to=_host(cluster.url)
            )
        return cluster.secret

    async def _ca(self, cluster: ExternalCluster) -> bytes | None:
        """The cluster's CA bundle now, when its TLS uses one (read as its definer may)."""
        if cluster.ca_file is None or not cluster.url.startswith("https://") or not cluster.verify_tls:
            return None
        return await self._files.read(
            cluster.ca_file, admin=cluster.by_admin, field=f"cluster {cluster.name}: ca_file"
        )

    async def client(self, name: str) -> AsyncClient:
        """A client for the cluster (reused; built again when it is redefined, its secret
        rotates or its CA bundle changes)."""
        cluster = self.cluster(name)
        secret = self._secret(cluster)
        ca = await self._ca(cluster)
        client = self._clients.get(name)
        if client is not None and self._client_secrets.get(name) == (secret, ca):
            return client
        if client is not None:
            self._retired.append(client)
        client = self._new_client(cluster, secret, ca)
        self._clients[name] = client
        self._client_secrets[name] = (secret, ca)
        return client

    async def checked_client(self, name: str) -> AsyncClient:
        """``client(name)`` once the far side's name is known not to be this cluster's.

        Checked once per client (a new one after its definition changes or its secret rotates), not
        per request: ``SameClusterName`` when the names match; the far side's error when it
        cannot be asked.
        """
        client = await self.client(name)
        if self._checked.get(name) is not client:
            self._far_names[name] = await self._remote_name(name, client)
            self._checked[name] = client
        return client

    def far_name(self, name: str) -> str | None:
        """The far side's cluster name as ``checked_client`` found it (None: not known)."""
        return self._far_names.get(name)

    async def ping(self, name: str) -> ClusterPing:
        """Reach the cluster's /readyz and an authenticated call that names the far side's cluster.

        Answers what happened; a far side with this cluster's name is ``same_cluster_name``.
        """
        started = time.perf_counter()
        try:
            client = await self.client(name)
            ready = await client.ready()
            # Proves the credentials, not only the network, and names the far side.
            await self._remote_name(name, client)
        except CapellaError as exc:
            return ClusterPing(ok=False, error=ErrorDetail(exc.code, exc.message))
        latency = (time.perf_counter() - started) * 1000
        return ClusterPing(ok=ready, ready=ready, latency_ms=round(latency, 2), error=None)

    async def _remote_name(self, name: str, client: AsyncClient) -> str | None:
        """The far side's cluster name (None from a server older than the field)."""
        remote = (await client.me()).cluster
        if remote is not None and remote == self._cluster.name:
            url = self._defined[name].url if name in self._defined else "its URL"
            raise SameClusterName(_same_name(name, url, remote), cluster=remote)
        return remote

    async def _name_check(self, cluster: ExternalCluster) -> NameCheck:
        """Ask the far side of a cluster being added its name: refuse ours, accept not knowing."""
        try:
            probe = self._new_client(cluster, self._secret(cluster), await self._ca(cluster))
            try:
                async with asyncio.timeout(NAME_CHECK_TIMEOUT):
                    remote = (await probe.me()).cluster
            except TimeoutError:
                raise Unreachable(
                    f"cluster {cluster.name}: no answer within {NAME_CHECK_TIMEOUT:g} s"
                ) from None
            finally:
                await probe.close()
        except CapellaError as exc:
            log.warning("cluster link name not checked link=%s: %s", cluster.name, exc.message)
            return NameCheck(checked=False, cluster=None, error=ErrorDetail(exc.code, exc.message))
        if remote is not None and remote == self._cluster.name:
            raise SameClusterName(_same_name(cluster.name, cluster.url, remote), cluster=remote)
        return NameCheck(checked=remote is not None, cluster=remote, error=None)

    def _new_client(self, cluster: ExternalCluster, secret: str | None, ca: bytes | None) -> AsyncClient:
        # Imported on first use, deliberately: a server without clusters never loads the
        # HTTP client (~0.6 MB and ~20 ms of start-up).
        from capella.client import AsyncClient

        return AsyncClient(
            cluster.url,
            timeout=cluster.timeout,
            connect_timeout=cluster.connect_timeout,
            username=cluster.username if cluster.secret_kind == "password" else None,
            password=secret if cluster.secret_kind == "password" else None,
            token=secret if cluster.secret_kind == "token" else None,
            ssl=_ssl_for(cluster, ca),
            compression=None if cluster.compression == "none" else cluster.compression,
            egress=self._egress,
        )

    # --- definitions ---------------------------------------------------------------------

    def _parse(self, name: str, data: object, by_admin: bool) -> tuple[ExternalCluster, dict[str, Any]]:
        if not isinstance(data, dict):
            raise InvalidRequest("a cluster must be a JSON object")
        allowed = {
            "url",
            "username",
            "password",
            "password_secret",
            "token",
            "token_secret",
            "verify_tls",
            "ca_file",
            "connect_timeout",
            "timeout",
            "compression",
        }
        for old in ("password_env", "token_env"):
            if old in data:
                new = old.replace("_env", "_secret")
                raise InvalidRequest(
                    f"{old} is no longer accepted: a cluster may not name the server's environment "
                    f'variables. Ask the operator to declare the secret ([secrets.NAME] env = "VAR") '
                    f'and give {new} = "NAME"',
                    field=old,
                )
        if unknown := sorted(set(data) - allowed):
            raise InvalidRequest(f"unknown field {unknown[0]!r}", field=unknown[0])
        url = data.get("url")
        if not isinstance(url, str) or not _URL.fullmatch(url):
            raise InvalidRequest("url must be an http:// or https:// URL", field="url")
        if "@" in url.split("/")[2]:
            # The URL is shown and logged: credentials go in username/password, never in it.
            raise InvalidRequest("url must not hold credentials: give username and password", field="url")
        secrets = [
            k for k in ("password", "password_secret", "token", "token_secret") if data.get(k) is not None
        ]
        if len(secrets) > 1:
            raise InvalidRequest(f"give only one of {', '.join(secrets)}", field=secrets[1])
        username = data.get("username")
        if username is not None and (not isinstance(username, str) or not username):
            raise InvalidRequest("username must be a non-empty string", field="username")
        kind = secrets[0].split("_")[0] if secrets else None
        if kind == "password" and username is None:
            raise InvalidRequest("a password needs a username", field="username")
        secret_name = data.get(secrets[0]) if secrets and secrets[0].endswith("_secret") else None
        if secret_name is not None and (
            not isinstance(secret_name, str) or not _SECRET_NAME.fullmatch(secret_name)
        ):
            raise InvalidRequest(f"{secrets[0]} must name a secret declared in [secrets]", field=secrets[0])
        secret = data.get(secrets[0]) if secrets and not secrets[0].endswith("_secret") else None
        if secret is not None and (not isinstance(secret, str) or not secret):
            raise InvalidRequest(f"{secrets[0]} must be a non-empty string", field=secrets[0])
        compression = data.get("compression", "none")
        if compression not in COMPRESSIONS:
            raise InvalidRequest(f"compression must be one of {', '.join(COMPRESSIONS)}", field="compression")
        verify = data.get("verify_tls", True)
        if not isinstance(verify, bool):
            raise InvalidRequest("verify_tls must be true or false", field="verify_tls")
        ca_file = data.get("ca_file")
        if ca_file is not None and not isinstance(ca_file, str):
            raise InvalidRequest("ca_file must be a file path", field="ca_file")
        cluster = ExternalCluster(
            name=name,
            url=url.rstrip("/"),
            username=username,
            secret=secret,
            secret_kind=kind,
            secret_name=secret_name,
            verify_tls=verify,
            ca_file=ca_file,
            by_admin=by_admin,
            connect_timeout=duration(data.get("connect_timeout", 5.0), "connect_timeout"),
            timeout=duration(data.get("timeout", 30.0), "timeout"),
            compression=str(compression),
        )
        return cluster, self._stored_entry(cluster)

    def _stored_entry(self, cluster: ExternalCluster) -> dict[str, Any]:
        stored = {k: v for k, v in cluster.public_dict().items() if k not in ("name", "credentials", "error")}
        stored["credentials"] = None
        stored["by_admin"] = cluster.by_admin
        if cluster.secret_kind is not None:
            stored["credentials"] = {
                "kind": cluster.secret_kind,
                "username": cluster.username,
                "secret": cluster.secret_name,
                "encrypted": None
                if cluster.secret is None
                else self.encrypt(cluster.secret, cluster.context()),
            }
        return stored

    def _from_stored(self, name: str, entry: dict[str, Any]) -> ExternalCluster:
        credentials = entry.get("credentials") or {}
        if credentials.get("env"):
            raise InvalidConfig(
                f"its credentials come from the environment variable {credentials['env']}, which clusters "
                "may no longer name: declare it in [secrets] and give password_secret or token_secret"
            )
        try:
            cluster = replace(
                ExternalCluster(name=name, url=entry["url"]),
                username=credentials.get("username"),
                secret_kind=credentials.get("kind"),
                secret_name=credentials.get("secret"),
                verify_tls=entry["tls"]["verify"],
                ca_file=entry["tls"]["ca_file"],
                # Missing from a definition stored before it was kept: as anyone's.
                by_admin=entry.get("by_admin") is True,
                connect_timeout=entry["timeouts"]["connect"],
                timeout=entry["timeouts"]["request"],
                compression=entry["compression"],
            )
        except (KeyError, TypeError) as exc:
            raise CorruptData(f"its stored definition is not valid: {exc!r}") from None
        encrypted = credentials.get("encrypted")
        if encrypted is None:
            return cluster
        cluster = replace(cluster, secret=self.decrypt(encrypted, cluster.context()))
        if not bound(encrypted):
            # An older, unbound token: sealed again bound to this cluster, saved with the next change.
            self._stored[name] = self._stored_entry(cluster)
        return cluster

    def _key(self) -> bytes:
        """The key file's 32 bytes (a Fernet key, created on first use)."""
        if self._key_file is None:
            raise InvalidRequest("this cluster has no key file: give password_secret or token_secret instead")
        try:
            from cryptography.fernet import Fernet
        except ImportError:  # optional: only clusters with stored secrets need it
            raise InvalidRequest(
                "storing a secret needs the cryptography package (pip install 'capella[secrets]'); "
                "or give password_secret / token_secret"
            ) from None
        if not self._key_file.exists():
            # Never replaced once there (every stored secret depends on it): when two writers
            # race, the first key kept is the one both read back.
            write_atomic(self._key_file, Fernet.generate_key(), replace=False)
        return self._key_file.read_bytes().strip()

    def encrypt(self, secret: str, context: tuple[str, ...]) -> str:
        """``secret`` sealed with the cluster's key and bound to ``context``.

        AES-256-GCM with ``context`` (what the secret is, whose, and for where: e.g. a pg
        handler's name and DSN) as associated data: a ciphertext copied into another
        definition does not decrypt there, so it cannot be sent to another host.
        """
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        nonce = os.urandom(12)
        sealed = AESGCM(_aead_key(self._key())).encrypt(nonce, secret.encode(), _associated(context))
        return SEALED + base64.urlsafe_b64encode(nonce + sealed).decode("ascii")

    def decrypt(self, token: str, context: tuple[str, ...]) -> str:
        """The secret ``encrypt`` sealed for ``context``; ``CorruptData`` for any other context.

        A token without the ``v2:`` prefix is an older Fernet one, bound to nothing: it is only
        read from this server's own registries (the API refuses ``*_encrypted`` params), and
        its caller seals it again bound (``bound``).
        """
        try:
            if token.startswith(SEALED):
                from cryptography.hazmat.primitives.ciphers.aead import AESGCM

                raw = base64.urlsafe_b64decode(token[len(SEALED) :].encode("ascii"))
                plain: bytes = AESGCM(_aead_key(self._key())).decrypt(
                    raw[:12], raw[12:], _associated(context)
                )
            else:
                from cryptography.fernet import Fernet

                plain = Fernet(self._key()).decrypt(token.encode("ascii"))
        except CapellaError:
            raise
        except Exception as exc:  # InvalidTag/InvalidToken: another context, or a changed key file
            raise CorruptData(
                f"a stored secret cannot be decrypted ({type(exc).__name__}): it was stored for another "
                "definition, or the key file changed; give the secret again"
            ) from None
        return plain.decode()

    async def _save(self) -> None:
        clusters = {name: self._stored[name] for name in sorted(self._stored)}
        await CLUSTERS.save(self._cluster.home, ClusterRegistry(clusters=clusters))


def _same_name(cluster: str, url: str, name: str) -> str:
    return (
        f"cluster {cluster} ({url}) is named {name!r}, like this cluster: messages produced on both "
        "without a source would get the same identities, and copies would drop some as duplicates. "
        "Give one of them another [cluster] name, or point this one at the right URL"
    )


def bound(token: str) -> bool:
    """Whether a stored ciphertext is bound to its context (not an older Fernet token)."""
    return token.startswith(SEALED)


def _aead_key(key_file: bytes) -> bytes:
    """The AES-256-GCM key, derived from the key file (which stays a Fernet key for old tokens)."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"capella stored secret v2")
    return hkdf.derive(base64.urlsafe_b64decode(key_file))


def _associated(context: tuple[str, ...]) -> bytes:
    # Each part's length first, so ("a", "bc") and ("ab", "c") are different contexts.
    return b"".join(len(p.encode()).to_bytes(4, "big") + p.encode() for p in context)


def _host(url: str) -> str:
    """The host a cluster's URL names, as a bound secret's ``hosts`` are compared with."""
    return urlsplit(url).hostname or ""


def _ssl_for(cluster: ExternalCluster, ca: bytes | None) -> ssl.SSLContext | bool | None:
    """The TLS context for the cluster's URL; ``ca``: its CA bundle's bytes, read by ``Clusters._ca``."""
    if not cluster.url.startswith("https://"):
        return None
    if not cluster.verify_tls:
        return False
    try:
        # The bytes read and checked, never the path: a FIFO there cannot stall the loop.
        context = ssl.create_default_context(cadata=None if ca is None else ca_data(ca))
    except (OSError, ValueError) as exc:  # ssl.SSLError too: it holds no certificate
        raise InvalidConfig(
            f"cluster {cluster.name}: ca_file {cluster.ca_file!r} cannot be used: {exc}"
        ) from None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def duration(value: object, field: str) -> float:
    """Seconds greater than 0 and at most a day from ``"30s"`` or a number, with an error that
    names the field."""
    try:
        found = seconds(value, positive=True)
    except ValueError as exc:
        text = str(exc)
        raise InvalidRequest(
            f"{field} {text}" if text.startswith("must") else f"{field}: {text}", field=field
        ) from None
    if found > MAX_TIMEOUT:
        raise InvalidRequest(f"{field} must be at most {MAX_TIMEOUT:g} seconds (a day)", field=field)
    return found
