"""The catalog: every definition Capella saves, each one JSON document with one shape.

| document | where | registry |
|---|---|---|
| ``QUEUES`` | ``.capella/queues.json`` on the default mount | ``capella.core.cluster`` |
| ``TOPICS`` | ``.capella/topics.json`` on the default mount | ``capella.core.cluster`` |
| ``HANDLERS`` | ``.capella/handlers.json`` on the default mount | ``capella.handlers.supervisor`` |
| ``CLUSTERS`` | ``.capella/clusters.json`` on the default mount | ``capella.links.registry`` |
| ``PRODUCER_IDS`` | ``.capella/producer_ids.json`` on the default mount | ``capella.core.producer_ids`` |
| ``USERS``, ``TOKENS`` | ``users.json``, ``tokens.json`` in ``<data_dir>/auth/`` | ``capella.auth.store`` |

Users and tokens are files outside every mount because the offline ``capella user ...
--data-dir`` commands change them without a server and its mounts.

A registry has one path for its document: ``load`` (no document yet is the empty one; bytes
that do not decode into its shape are ``CorruptData`` naming the document and the
field), changes its records in memory, then ``save`` of the whole document, atomically (the
mount's ``put``, or ``capella.fsync.write_atomic`` for a file; both fsync, rename, fsync the
directory, 0600 in 0700). The shapes are the on-disk formats of docs/format.md: an older
document loads as it always has. What a registry checks beyond the shape stays with it (a
queue definition's rules, a handler's params, a cluster's credentials), because a record that
no longer builds is kept and reported rather than refusing the whole document.

The shapes are wire structs, declared once in ``capella.wire.records`` (a stored user's rules
are ``capella.wire.auth.Rule``): the catalog stores and returns them. The external clusters'
document stays here, its records plain objects that their registry reads one by one. This module is in
``storage/`` because every registry can import it there: core, handlers and auth sit above storage
(``pyproject.toml``'s layers), and it needs nothing above ``Storage``, ``wire``, ``errors``
and ``fsync``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import msgspec

from capella.errors import CorruptData, KeyNotFound, StorageUnavailable
from capella.fsync import write_atomic
from capella.storage import Storage, keys
from capella.wire.records import (
    HandlerRegistry,
    ProducerIdLease,
    QueueRegistry,
    TokenFile,
    TopicRegistry,
    UserFile,
)


class ClusterRegistry(msgspec.Struct, kw_only=True):
    """Links (external clusters) by name. Each record, a ``capella.links.link.LinkRecord``, is
    read by ``capella.links.registry`` on its own: one that no longer loads is listed with its
    error and saved back unchanged."""

    version: int = 1
    clusters: dict[str, dict[str, Any]]


# --- the one load and save -----------------------------------------------------------------

T = TypeVar("T", bound=msgspec.Struct)


@dataclass(frozen=True, slots=True)
class Document(Generic[T]):
    """One saved document: its key (a file name for ``read``/``write``), its shape, what an
    error calls it, and the document there is before the first save."""

    key: str
    shape: type[T]
    title: str
    empty: Callable[[], T]
    indent: bool = False  # for files people read: users and tokens

    def decode(self, data: bytes, where: str) -> T:
        try:
            return msgspec.json.decode(data, type=self.shape)
        except msgspec.DecodeError as exc:  # a ValidationError too: it names the field
            raise CorruptData(f"{self.title} {where} is not valid: {exc}") from None

    def encode(self, document: T) -> bytes:
        data = msgspec.json.encode(document)
        return msgspec.json.format(data, indent=2) if self.indent else data

    async def load(self, mount: Storage) -> T:
        try:
            data = await mount.get(self.key)
        except KeyNotFound:
            return self.empty()
        return self.decode(data, self.key)

    async def save(self, mount: Storage, document: T) -> None:
        await mount.put(self.key, self.encode(document))

    def read(self, directory: Path) -> T:
        path = directory / self.key
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return self.empty()
        except OSError as exc:
            raise StorageUnavailable(f"cannot read {path}: {exc.strerror}") from None
        return self.decode(data, str(path))

    def write(self, directory: Path, document: T) -> None:
        path = directory / self.key
        try:
            # A fixed temporary name: a .tmp left by a crash is reused, and made private again.
            write_atomic(path, self.encode(document), temporary=path.with_suffix(".tmp"))
        except OSError as exc:
            raise StorageUnavailable(f"cannot write {path}: {exc.strerror}") from None


QUEUES = Document(keys.QUEUES, QueueRegistry, "queue registry", lambda: QueueRegistry(queues={}))
TOPICS = Document(keys.TOPICS, TopicRegistry, "topic registry", lambda: TopicRegistry(topics={}))
HANDLERS = Document(keys.HANDLERS, HandlerRegistry, "handler registry", lambda: HandlerRegistry(handlers={}))
CLUSTERS = Document(
    keys.CLUSTERS, ClusterRegistry, "external cluster registry", lambda: ClusterRegistry(clusters={})
)
PRODUCER_IDS = Document(keys.PRODUCER_IDS, ProducerIdLease, "producer id lease", ProducerIdLease)
USERS = Document("users.json", UserFile, "users file", lambda: UserFile(users={}), indent=True)
TOKENS = Document("tokens.json", TokenFile, "tokens file", lambda: TokenFile(tokens={}), indent=True)
