"""The cluster's name: the configured ``cluster.name``, or one generated once and kept.

A cluster's name is the default ``source`` of every message produced there, so two clusters
that share one would mint the same identities ``(name, id)`` and replication would drop one
of two different messages as a duplicate. The host name alone is not enough (two clusters on
one machine), so an unconfigured cluster gets the host name plus a random suffix at its first
start, written to ``<data_dir>/cluster-name`` and read back on every later start. A
configured name wins and is never written there.
"""

from __future__ import annotations

import base64
import logging
import re
import secrets
import socket
from pathlib import Path

from capella.config import DECLARED_NAME, Config
from capella.errors import InvalidConfig
from capella.fsync import write_atomic

log = logging.getLogger(__name__)

FILE = "cluster-name"
NAME = re.compile(DECLARED_NAME)
# 6 base32 characters: 30 random bits, so two clusters on one host share a name with odds of
# about one in a billion.
SUFFIX_CHARS = 6


def cluster_name(config: Config) -> str:
    """``config.cluster_name`` when configured, else the generated name of ``config.data_dir``."""
    if config.cluster_name is not None:
        return config.cluster_name
    return generated_name(config.data_dir)


def generated_name(data_dir: Path) -> str:
    """The name kept in ``data_dir``; created (durably, 0600) at the first call."""
    path = data_dir / FILE
    name = _read(path)
    if name is not None:
        return name
    name = new_name(socket.gethostname())
    # Never replaces a name another process kept first: the one read back below wins.
    write_atomic(path, f"{name}\n".encode(), replace=False)
    kept = _read(path)
    if kept is None:  # pragma: no cover - the file was just written
        raise InvalidConfig(f"cannot keep the cluster name in {path}")
    if kept == name:
        log.info("cluster name generated name=%s kept_in=%s", name, path)
    return kept


def new_name(host: str) -> str:
    """``host`` (cut to what a name allows) plus ``-`` and a random lower-case suffix."""
    base = re.sub(r"[^A-Za-z0-9_.-]", "-", host.split(".")[0])[:100].strip("-._") or "capella"
    if not NAME.fullmatch(base):
        base = "capella"
    suffix = base64.b32encode(secrets.token_bytes(5)).decode("ascii")[:SUFFIX_CHARS].lower()
    return f"{base}-{suffix}"


def _read(path: Path) -> str | None:
    try:
        text = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidConfig(f"cannot read the cluster name from {path}: {exc}") from None
    if not NAME.fullmatch(text):
        raise InvalidConfig(
            f"{path} holds {text!r}, not a cluster name: set [cluster] name, or restore the file "
            "(a new name would give this cluster's messages new identities)"
        )
    return text
