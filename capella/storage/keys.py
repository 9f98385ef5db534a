"""Every key Capella writes on a mount, named once (docs/format.md, "Keys on a mount").

The cluster's own documents live under ``.capella/`` on the default mount. Queue names never
start with ``.``, so they cannot collide with a queue. Everything a queue keeps is under
``<queue>/``: on its meta mount, except the blocks, which are on the mount of their mark. A
change log (the subscriptions, the schedule, a work queue) is a prefix that holds a snapshot
and numbered logs. Ids and numbers are zero-padded so that keys sort in numeric order, and
``number_of`` reads them back.

A key is its parts joined by ``of``: ``of(queue, WORK, subscription)`` is
``<queue>/work/<subscription>``; ``within`` is the prefix that lists what is under one.
"""

from __future__ import annotations

# The cluster's registries (``capella.storage.catalog``), on the default mount.
QUEUES = ".capella/queues.json"
HANDLERS = ".capella/handlers.json"
CLUSTERS = ".capella/clusters.json"
PRODUCER_IDS = ".capella/producer_ids.json"  # the producer-id lease (capella.core.producer_ids)
TOPICS = ".capella/topics.json"

# Inside ``<queue>/``, on its meta mount.
MANIFEST = "manifest.json"  # the sealed blocks: id ranges, counts, marks, states
STATE = "state.json"  # the id lease: ids below ``lease_until`` may have been answered
JOURNALS = "journal"  # the journal of each open (or not yet sealed) block, by first id
SUMMARIES = "summaries"  # each sealed block's dedup summary, by first id
QUARANTINE = "quarantine"  # journals whose header was unreadable, kept for an operator
SUBSCRIPTIONS = "subscriptions"  # the change log of the queue's subscriptions
OLD_SUBSCRIPTIONS = "subscriptions.json"  # before the change log: read once, then deleted
SCHEDULE = "schedule"  # the change log and chunk files of the delayed messages
WORK = "work"  # a change log per ack-mode subscription: ``of(queue, WORK, name)``
# Inside ``<queue>/``, on the mount of each block's mark.
BLOCKS = "blocks"
# Inside a change log.
SNAPSHOT = "snapshot"
LOGS = "log"
# Inside a schedule.
CHUNKS = "chunks"


def of(*parts: str) -> str:
    return "/".join(parts)


def within(*parts: str) -> str:
    """The list prefix of every key under ``of(*parts)``."""
    return f"{of(*parts)}/"


def journal(queue: str, first_id: int) -> str:
    return of(queue, JOURNALS, f"{first_id:020d}.log")


def summary(queue: str, first_id: int) -> str:
    return of(queue, SUMMARIES, f"{first_id:020d}.sum")


def log_file(log: str, seq: int) -> str:
    """The records a change log appended after its snapshot ``seq``."""
    return of(log, LOGS, f"{seq:020d}.log")


def chunk(schedule: str, number: int, ext: str) -> str:
    """A schedule's chunk of far-future messages (``sch``) or its index (``idx``)."""
    return of(schedule, CHUNKS, f"{number:012d}.{ext}")


def number_of(key: str) -> int | None:
    """The number a key's name starts with (a journal's or summary's first id, a log's
    sequence, a chunk's number); None when it does not start with one."""
    stem = _name(key).partition(".")[0]
    return int(stem) if stem.isdigit() else None


def block(queue: str, first_id: int, last_id: int) -> str:
    """A sealed block, named by its id range."""
    return of(queue, BLOCKS, f"{first_id:020d}-{last_id:020d}.blk")


def last_id_of(key: str) -> int | None:
    """The last id in a block key ``.../<first>-<last>.blk``; None for other names."""
    stem, _, ext = _name(key).partition(".")
    first, _, last = stem.partition("-")
    return int(last) if ext == "blk" and first.isdigit() and last.isdigit() else None


def _name(key: str) -> str:
    return key.rsplit("/", 1)[-1]
