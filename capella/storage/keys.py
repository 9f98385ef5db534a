"""Every key Capella writes on a mount, named once (docs/format.md, "Keys on a mount").

The cluster's own documents live under ``.capella/`` on the default mount. Queue names never
start with ``.``, so they cannot collide with a queue. Everything a queue keeps is under
``<queue>/``: on its meta mount, except the blocks, which are on the mount of their mark. A
change log (the subscriptions, the schedule, a work queue) is a prefix that holds a snapshot
and numbered logs. Ids and numbers are zero-padded so that keys sort in numeric order, and
``number_of`` reads them back.
"""

from __future__ import annotations

# The cluster's registries (``capella.storage.catalog``), on the default mount.
QUEUES = ".capella/queues.json"
HANDLERS = ".capella/handlers.json"
CLUSTERS = ".capella/clusters.json"


def within(prefix: str) -> str:
    """The list prefix of every key under ``prefix`` (a queue, a change log, a work queue)."""
    return f"{prefix}/"


# --- a queue, on its meta mount ----------------------------------------------------------


def manifest(queue: str) -> str:
    """The sealed blocks: id ranges, counts, marks, states."""
    return f"{queue}/manifest.json"


def state(queue: str) -> str:
    """The id lease: ids below ``lease_until`` may have been answered."""
    return f"{queue}/state.json"


def journal(queue: str, first_id: int) -> str:
    """The journal of the open (or not yet sealed) block that starts at ``first_id``."""
    return f"{queue}/journal/{first_id:020d}.log"


def journals(queue: str) -> str:
    return f"{queue}/journal/"


def summary(queue: str, first_id: int) -> str:
    """A sealed block's dedup summary."""
    return f"{queue}/summaries/{first_id:020d}.sum"


def summaries(queue: str) -> str:
    return f"{queue}/summaries/"


def quarantine(queue: str, name: str) -> str:
    """A journal whose header was unreadable, kept for an operator under its own name."""
    return f"{queue}/quarantine/{name}"


def subscriptions(queue: str) -> str:
    """The change log of the queue's subscriptions."""
    return f"{queue}/subscriptions"


def old_subscriptions(queue: str) -> str:
    """Where versions before the change log kept the subscriptions (read once, then deleted)."""
    return f"{queue}/subscriptions.json"


def schedule(queue: str) -> str:
    """The change log (and chunk files) of the queue's delayed messages."""
    return f"{queue}/schedule"


def work(queue: str, subscription: str) -> str:
    """The change log of an ack-mode subscription's work state."""
    return f"{queue}/work/{subscription}"


# --- a queue, on the mount of each block's mark ------------------------------------------


def block(queue: str, first_id: int, last_id: int) -> str:
    return f"{queue}/blocks/{first_id:020d}-{last_id:020d}.blk"


def blocks(queue: str) -> str:
    return f"{queue}/blocks/"


def last_id_of(key: str) -> int | None:
    """The last id in a block key ``.../<first>-<last>.blk``; None for other names."""
    stem, _, ext = _name(key).partition(".")
    first, _, last = stem.partition("-")
    return int(last) if ext == "blk" and first.isdigit() and last.isdigit() else None


# --- inside a change log -----------------------------------------------------------------


def snapshot(log: str) -> str:
    return f"{log}/snapshot"


def log_file(log: str, seq: int) -> str:
    """The records appended after snapshot ``seq``."""
    return f"{log}/log/{seq:020d}.log"


def log_files(log: str) -> str:
    return f"{log}/log/"


def chunk(schedule: str, number: int, ext: str) -> str:
    """A schedule's chunk of far-future messages (``sch``) or its index (``idx``)."""
    return f"{schedule}/chunks/{number:012d}.{ext}"


def chunks(schedule: str) -> str:
    return f"{schedule}/chunks/"


def number_of(key: str) -> int | None:
    """The number a key's name starts with (a journal's or summary's first id, a log's
    sequence, a chunk's number); None when it does not start with one."""
    stem = _name(key).partition(".")[0]
    return int(stem) if stem.isdigit() else None


def _name(key: str) -> str:
    return key.rsplit("/", 1)[-1]
