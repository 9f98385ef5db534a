"""The links: named external clusters, persisted, and turned into clients on demand.

A link holds a URL, credentials, TLS settings, timeouts and request compression
(``capella/links/link.py``). Credentials are never returned by the API or logged: a link either
names a secret the operator declared (``password_secret``, ``token_secret``; whoever defines the
link needs ``secret use`` on it), or stores them sealed (``capella/auth/sealed.py``), bound to
the link's name, URL and user so the ciphertext is of no use elsewhere. A link whose stored
credentials cannot be read is still listed, with its ``error``. Copy handlers reach a queue on
a link as ``cluster/queue``.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import msgspec

from capella.auth.rule import UNRESTRICTED, Identity
from capella.auth.sealed import Sealer, bound
from capella.auth.secret import Secrets
from capella.core.cluster import Cluster
from capella.core.definition import check_name
from capella.egress import Egress
from capella.errors import (
    CapellaError,
    ClusterNotFound,
    Conflict,
    InvalidConfig,
    SameClusterName,
    Unreachable,
)
from capella.file_access import FileAccess, ca_data
from capella.links.link import Link, defined, record_of, stored
from capella.storage.catalog import CLUSTERS, ClusterRegistry
from capella.wire.answers import ErrorDetail
from capella.wire.clusters import ClusterPing, NameCheck

if TYPE_CHECKING:
    from capella.client import AsyncClient

log = logging.getLogger(__name__)
# The log lines keep their older words ("cluster link ... link=NAME"): operators' alerts and
# searches match them.

# How long adding a link waits for the far side to say its name before accepting it unchecked.
NAME_CHECK_TIMEOUT = 3.0


class Links:
    """The registry of links, and one client per link.

    ``key_file`` holds the key its stored secrets (and pg handlers' passwords) are sealed with.
    """

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
        self._egress = egress  # every connection to a link passes it (None: no check)
        self.sealer = Sealer(key_file)
        self._secrets = secrets or Secrets()
        self._defined: dict[str, Link] = {}
        self._stored: dict[str, dict[str, Any]] = {}  # as persisted (secrets encrypted)
        self._clients: dict[str, AsyncClient] = {}
        # The secret and CA bundle each client was built with.
        self._client_secrets: dict[str, tuple[str | None, bytes | None]] = {}
        # Clients replaced after a secret rotated: a request may still be using one.
        self._retired: list[AsyncClient] = []
        # The client whose far side's name was checked, by link (copy checks once per client).
        self._checked: dict[str, AsyncClient] = {}
        self._far_names: dict[str, str | None] = {}  # the far side's cluster name, once checked
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        records = (await CLUSTERS.load(self._cluster.home)).clusters
        for name, entry in records.items():
            self._stored[name] = entry
            try:
                self._defined[name] = self._from_stored(name, entry)
            except CapellaError as exc:
                log.error("cluster link cannot be loaded link=%s: %s", name, exc.message)
                # Listed with its error, not hidden: an operator sees it and gives the secret again.
                url = entry.get("url")
                self._defined[name] = Link(
                    name=name, url=url if isinstance(url, str) else "", error=exc.message
                )

    async def close(self) -> None:
        for client in [*self._clients.values(), *self._retired]:
            await client.close()
        self._clients.clear()
        self._retired.clear()

    def links(self) -> list[Link]:
        return [self._defined[name] for name in sorted(self._defined)]

    def link(self, name: str) -> Link:
        try:
            return self._defined[name]
        except KeyError:
            raise ClusterNotFound(f"no external cluster {name!r}") from None

    async def put(self, name: str, data: object, by: Identity = UNRESTRICTED) -> tuple[Link, bool, NameCheck]:
        """Add or replace a link; a named secret must be one ``by`` may use.

        Answers the link, whether it was created, and the check of the far side's name
        (``name_check``: ``checked``, the far side's ``cluster``, and the ``error`` that kept
        it from being checked).
        """
        check_name(name, "cluster")
        link = defined(name, data, by.admin)
        record = self._record(link)
        if link.secret_name is not None:
            self._secrets.use(link.secret_name, by, f"{link.secret_kind}_secret", to=_host(link.url))
        if link.ca_file is not None:
            # As the definer may name files; read again for every client it is used for.
            await self._files.read(link.ca_file, admin=by.admin, field="ca_file")
        # Before it is stored: a same-named far side is refused (409); one that cannot be reached
        # now is accepted (an edge device adds one while offline) and the answer says so.
        check = await self._name_check(link)
        async with self._lock:
            created = name not in self._defined
            self._defined[name] = link
            self._stored[name] = record
            await self._save()
            old = self._clients.pop(name, None)
            self._checked.pop(name, None)
            if old is not None:
                await old.close()
        log.info("cluster link %s link=%s url=%s", "added" if created else "updated", name, link.url)
        return link, created, check

    async def drop(self, name: str, used_by: list[str] | None = None) -> None:
        """Forget a link; ``used_by`` names the handlers that use it, which refuse the drop."""
        if used_by:
            raise Conflict(
                f"cluster {name!r} is used by handler{'s' if len(used_by) > 1 else ''} "
                f"{', '.join(sorted(used_by))}: drop or change them first",
                handlers=sorted(used_by),
            )
        async with self._lock:
            self.link(name)
            del self._defined[name]
            self._stored.pop(name, None)
            await self._save()
            client = self._clients.pop(name, None)
            if client is not None:
                await client.close()

    def secret(self, link: Link) -> str | None:
        """The link's password or token now (None: it has none); a declared secret is read again."""
        if link.error is not None:
            raise InvalidConfig(f"cluster {link.name}: {link.error}")
        if link.secret_name is not None:
            # Granted when the link was defined; read now, so a rotated value is used, and
            # only for the hosts it is bound to.
            return self._secrets.use(
                link.secret_name, UNRESTRICTED, f"cluster {link.name}", to=_host(link.url)
            )
        return link.secret

    async def _ca(self, link: Link) -> bytes | None:
        """The link's CA bundle now, when its TLS uses one (read as its definer may)."""
        if link.ca_file is None or not link.url.startswith("https://") or not link.verify_tls:
            return None
        return await self._files.read(
            link.ca_file, admin=link.by_admin, field=f"cluster {link.name}: ca_file"
        )

    async def client(self, name: str) -> AsyncClient:
        """A client for the link (reused; built again when it is redefined, its secret
        rotates or its CA bundle changes)."""
        link = self.link(name)
        secret = self.secret(link)
        ca = await self._ca(link)
        client = self._clients.get(name)
        if client is not None and self._client_secrets.get(name) == (secret, ca):
            return client
        if client is not None:
            self._retired.append(client)
        client = self._new_client(link, secret, ca)
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
        """Reach the link's /readyz and an authenticated call that names the far side's cluster.

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

    async def _name_check(self, link: Link) -> NameCheck:
        """Ask the far side of a link being added its name: refuse ours, accept not knowing."""
        try:
            probe = self._new_client(link, self.secret(link), await self._ca(link))
            try:
                async with asyncio.timeout(NAME_CHECK_TIMEOUT):
                    remote = (await probe.me()).cluster
            except TimeoutError:
                raise Unreachable(f"cluster {link.name}: no answer within {NAME_CHECK_TIMEOUT:g} s") from None
            finally:
                await probe.close()
        except CapellaError as exc:
            log.warning("cluster link name not checked link=%s: %s", link.name, exc.message)
            return NameCheck(checked=False, cluster=None, error=ErrorDetail(exc.code, exc.message))
        if remote is not None and remote == self._cluster.name:
            raise SameClusterName(_same_name(link.name, link.url, remote), cluster=remote)
        return NameCheck(checked=remote is not None, cluster=remote, error=None)

    def _new_client(self, link: Link, secret: str | None, ca: bytes | None) -> AsyncClient:
        # Imported on first use, deliberately: a server without links never loads the
        # HTTP client (~0.6 MB and ~20 ms of start-up).
        from capella.client import AsyncClient

        return AsyncClient(
            link.url,
            timeout=link.timeout,
            connect_timeout=link.connect_timeout,
            username=link.username if link.secret_kind == "password" else None,
            password=secret if link.secret_kind == "password" else None,
            token=secret if link.secret_kind == "token" else None,
            ssl=_ssl_for(link, ca),
            compression=None if link.compression == "none" else link.compression,
            egress=self._egress,
        )

    # --- the stored records ------------------------------------------------------------------

    def _record(self, link: Link) -> dict[str, Any]:
        """The catalog's record of ``link``, its secret sealed."""
        sealed = None if link.secret is None else self.sealer.encrypt(link.secret, link.context())
        record: dict[str, Any] = msgspec.to_builtins(record_of(link, sealed))
        return record

    def _from_stored(self, name: str, entry: dict[str, Any]) -> Link:
        link, encrypted = stored(name, entry)
        if encrypted is None:
            return link
        link = replace(link, secret=self.sealer.decrypt(encrypted, link.context()))
        if not bound(encrypted):
            # An older, unbound token: sealed again bound to this link, saved with the next change.
            self._stored[name] = self._record(link)
        return link

    async def _save(self) -> None:
        records = {name: self._stored[name] for name in sorted(self._stored)}
        await CLUSTERS.save(self._cluster.home, ClusterRegistry(clusters=records))


def _same_name(cluster: str, url: str, name: str) -> str:
    return (
        f"cluster {cluster} ({url}) is named {name!r}, like this cluster: messages produced on both "
        "without a source would get the same identities, and copies would drop some as duplicates. "
        "Give one of them another [cluster] name, or point this one at the right URL"
    )


def _host(url: str) -> str:
    """The host a link's URL names, as a bound secret's ``hosts`` are compared with."""
    return urlsplit(url).hostname or ""


def _ssl_for(link: Link, ca: bytes | None) -> ssl.SSLContext | bool | None:
    """The TLS context for the link's URL; ``ca``: its CA bundle's bytes, read by ``Links._ca``."""
    if not link.url.startswith("https://"):
        return None
    if not link.verify_tls:
        return False
    try:
        # The bytes read and checked, never the path: a FIFO there cannot stall the loop.
        context = ssl.create_default_context(cadata=None if ca is None else ca_data(ca))
    except (OSError, ValueError) as exc:  # ssl.SSLError too: it holds no certificate
        raise InvalidConfig(f"cluster {link.name}: ca_file {link.ca_file!r} cannot be used: {exc}") from None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context
