"""Every statement shared queues run in PostgreSQL, as typed methods (the schema: sql/001_init.sql).

Each method is one statement or one transaction on the pool (``database.Pool``), so its errors
are Capella's: ``StorageUnavailable`` when PostgreSQL cannot be reached, ``DatabaseRefused`` when
it refuses. Times are float epoch seconds; the time of a message is PostgreSQL's
``clock_timestamp()`` read under its queue's row lock, one clock for every node.

A flush commits through ``commit_object``: one call of the plpgsql function
``capella_commit_object``, which orders the batches of one uploaded object, rejects duplicate
identities (stored as runs of external ids, ``capella_identity_runs``) and records where the kept
messages lie (``capella_segments``); keyed by the object, so a retried commit answers what the
first one did and applies nothing twice.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

from capella.core.definition import check_name
from capella.core.limits import check_cursor, check_group, check_metadata
from capella.errors import Conflict, InvalidRequest, QueueNotFound
from capella.shared.database import Pool

# Committed.first_id of a batch whose queue no longer exists: nothing of it was stored.
MISSING_QUEUE = -1
NOTIFY_CHANNEL = "capella_shared"  # payload "queue:next_id", once per queue per commit
DEFINITIONS_CHANNEL = "capella_shared_defs"  # payload the queue name, on create/update/drop


@dataclass(frozen=True, slots=True)
class Run:
    """Explicit identities of a batch: ``source``'s ``first_ext..last_ext``, one message each,
    at batch positions ``index..``."""

    source: str
    first_ext: int
    last_ext: int
    index: int


@dataclass(frozen=True, slots=True)
class BatchEntry:
    """One queue's record batch in an uploaded object."""

    queue: str
    byte_offset: int
    byte_size: int
    count: int
    runs: list[Run]  # positions covered by no run have no explicit identity


class Committed(NamedTuple):
    """What the commit gave one ``BatchEntry``. The kept messages (positions not in
    ``duplicates``), in batch order, have ``first_id``, ``first_id + 1``, ..."""

    first_id: int  # 0: every message was a duplicate; MISSING_QUEUE: the queue is gone
    time: float
    duplicates: dict[int, int]  # batch position -> the id that identity already has


@dataclass(frozen=True, slots=True)
class Segment:
    """Where a queue's messages ``first_id..last_id`` lie: a stored batch in object ``key``."""

    queue: str
    first_id: int
    last_id: int
    key: str
    byte_offset: int
    byte_size: int
    count: int  # messages in the stored batch, skipped ones included
    skip: tuple[int, ...]  # batch positions that are duplicates
    time: float
    object_size: int = 0  # of the whole object: a reader may GET it whole (0: not known)


class SubRow(NamedTuple):
    name: str
    last_id: int
    replica: bool
    created: float
    updated: float
    group: str | None = None
    metadata: str | None = None


class Expired(NamedTuple):
    segments: int
    bytes: int
    first_id: int  # the queue's first id now


class Usage(NamedTuple):
    first_id: int
    next_id: int
    bytes: int  # of the segments the queue holds
    segments: int


_SEGMENT = (
    "select s.queue, s.first_id, s.last_id, o.key, s.byte_offset, s.byte_size, s.count, s.skip, s.time, "
    "o.size "
    "from capella_segments s join capella_objects o on o.object_id = s.object_id "
)
_SUB = (
    "name, last_id, replica, extract(epoch from created)::float8, extract(epoch from updated)::float8, "
    "group_id, metadata"
)


class Catalog:
    """The shared queues' statements on one pool."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool

    # --- the write path --------------------------------------------------------------------

    async def commit_object(
        self, key: str, node: str, size: int, own: str, batches: list[BatchEntry]
    ) -> list[Committed]:
        """Commit uploaded object ``key``: one ``Committed`` per batch, in order.

        ``own`` is the cluster's name, the source of the implicit identities ``(own, id)`` of
        messages without an external id. Committing a key again answers the stored results.
        """
        b_queue, b_offset, b_size, b_count = [], [], [], []
        r_batch, r_source, r_first, r_last, r_index = [], [], [], [], []
        for number, batch in enumerate(batches, 1):
            b_queue.append(batch.queue)
            b_offset.append(batch.byte_offset)
            b_size.append(batch.byte_size)
            b_count.append(batch.count)
            end = 0
            for run in sorted(batch.runs, key=lambda r: r.index):
                if run.index < end or run.last_ext < run.first_ext:
                    raise InvalidRequest(f"shared commit: batch {number - 1}: runs overlap or are empty")
                end = run.index + run.last_ext - run.first_ext + 1
                if end > batch.count:
                    raise InvalidRequest(f"shared commit: batch {number - 1}: a run ends past its messages")
                r_batch.append(number)
                r_source.append(run.source)
                r_first.append(run.first_ext)
                r_last.append(run.last_ext)
                r_index.append(run.index)
        answer = await self._pool.fetchval(
            "select capella_commit_object($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
            key, node, size, own, b_queue, b_offset, b_size, b_count,
            r_batch, r_source, r_first, r_last, r_index,
        )  # fmt: skip
        if answer is None:  # the key is a compacted block's, never a flush's
            raise Conflict(f"shared commit: object {key!r} exists and is not a committed flush")
        # Duplicates come back as runs: positions p..p+n-1 are the messages id..id+n-1.
        return [
            Committed(int(first), float(time), {p + k: i + k for p, n, i in dups for k in range(n)})
            for first, time, dups in orjson.loads(answer)
        ]

    # --- the read path ---------------------------------------------------------------------

    async def segments_after(self, queue: str, after: int, limit: int = 64) -> list[Segment]:
        """The segments holding ids above ``after``, by first id (an index range scan: from the
        segment holding ``after + 1``)."""
        rows = await self._pool.fetch(
            _SEGMENT + "where s.queue = $1 and s.last_id > $2 and s.first_id >= coalesce("
            "(select first_id from capella_segments where queue = $1 and first_id <= $2 "
            "order by first_id desc limit 1), 0) order by s.first_id limit $3",
            queue, after, limit,
        )  # fmt: skip
        return [_segment(r) for r in rows]

    async def heads(self, queues: list[str] | None = None) -> dict[str, tuple[int, int]]:
        """``(first_id, next_id)`` of the named queues (those that exist), or of all."""
        if queues is None:
            rows = await self._pool.fetch("select name, first_id, next_id from capella_queues")
        else:
            rows = await self._pool.fetch(
                "select name, first_id, next_id from capella_queues where name = any($1)", queues
            )
        return {r[0]: (r[1], r[2]) for r in rows}

    # --- definitions -----------------------------------------------------------------------

    async def definitions(self) -> dict[str, dict[str, Any]]:
        return {name: doc for name, (doc, _) in (await self.defined()).items()}

    async def defined(self) -> dict[str, tuple[dict[str, Any], float]]:
        """Every queue's definition and when the queue was created: a queue dropped and created
        again under its name is another queue (its ids start over), told apart by the time."""
        rows = await self._pool.fetch(
            "select name, definition::text, extract(epoch from created)::float8 "
            "from capella_queues order by name"
        )
        return {r[0]: (orjson.loads(r[1]), r[2]) for r in rows}

    async def create_queue(self, name: str, definition: dict[str, Any]) -> bool:
        """``False`` when the queue exists already (then nothing changes)."""
        rows = await self._pool.fetch(
            "with made as (insert into capella_queues (name, definition) values ($1, $2::jsonb) "
            "on conflict (name) do nothing returning name) "
            f"select pg_notify('{DEFINITIONS_CHANNEL}', name) from made",
            name, orjson.dumps(definition).decode(),
        )  # fmt: skip
        return bool(rows)

    async def update_queue(self, name: str, definition: dict[str, Any]) -> bool:
        """``False`` when there is no such queue."""
        rows = await self._pool.fetch(
            "with changed as (update capella_queues set definition = $2::jsonb, updated = now() "
            "where name = $1 returning name) "
            f"select pg_notify('{DEFINITIONS_CHANNEL}', name) from changed",
            name, orjson.dumps(definition).decode(),
        )  # fmt: skip
        return bool(rows)

    async def drop_queue(self, name: str) -> bool:
        """Remove the queue and all its rows; objects left without live bytes become dead."""
        async with self._pool.transaction() as conn:
            if await conn.fetchval("select 1 from capella_queues where name = $1 for update", name) is None:
                return False
            await _release(conn, "queue = $1", name)
            await conn.execute("delete from capella_queues where name = $1", name)
            await conn.execute(f"select pg_notify('{DEFINITIONS_CHANNEL}', $1)", name)
        return True

    # --- subscriptions (cursor mode) -------------------------------------------------------

    async def subscriptions(self, queue: str) -> list[SubRow]:
        rows = await self._pool.fetch(
            f"select {_SUB} from capella_subscriptions where queue = $1 order by name", queue
        )
        return [SubRow(*r) for r in rows]

    async def subscription(self, queue: str, name: str) -> SubRow | None:
        row = await self._pool.fetchrow(
            f"select {_SUB} from capella_subscriptions where queue = $1 and name = $2", queue, name
        )
        return None if row is None else SubRow(*row)

    async def commit_cursor(
        self,
        queue: str,
        name: str,
        last_id: int | None,
        *,
        replica: bool | None,
        reset: bool,
        group: str | None = None,
        metadata: str | None = None,
    ) -> tuple[SubRow, bool]:
        """Create or move a cursor, as ``core/subscription.py`` ``Subscriptions.commit`` does:
        it never moves backwards unless ``reset``; ``last_id`` None creates it at 0 or keeps it;
        ``replica``, ``group`` and ``metadata`` None keep what it has, and a commit that changes
        nothing updates no row. Answers the row and whether it was created; ``QueueNotFound``
        without the queue."""
        if last_id is not None:
            check_cursor(last_id)
        if group is not None:
            check_group(group)
        if metadata is not None:
            check_metadata(metadata)
        check_name(name, "subscription")
        row = await self._pool.fetchrow(
            "insert into capella_subscriptions as s (queue, name, last_id, replica, group_id, metadata) "
            "select $1, $2, coalesce($3::bigint, 0), coalesce($4::boolean, false), $6::text, $7::text "
            "where exists (select 1 from capella_queues where name = $1) "
            "on conflict (queue, name) do update set "
            "last_id = case when $3::bigint is not null and ($5 or $3::bigint > s.last_id) "
            "then $3::bigint else s.last_id end, "
            "replica = coalesce($4::boolean, s.replica), "
            "group_id = coalesce($6::text, s.group_id), metadata = coalesce($7::text, s.metadata), "
            "updated = now() "
            "where ($3::bigint is not null and ($5 or $3::bigint > s.last_id) and $3::bigint <> s.last_id) "
            "or ($4::boolean is not null and $4::boolean <> s.replica) "
            "or ($6::text is not null and $6::text is distinct from s.group_id) "
            "or ($7::text is not null and $7::text is distinct from s.metadata) "
            f"returning {_SUB}, xmax = 0",
            queue, name, last_id, replica, reset, group, metadata,
        )  # fmt: skip
        if row is not None:
            return SubRow(*row[:7]), bool(row[7])
        current = await self.subscription(queue, name)
        if current is None:
            raise QueueNotFound(f"no shared queue {queue!r}")
        return current, False

    async def take_producer_id(self) -> int:
        """The next producer id of the shared cluster (``core/producer_ids.py``), durable before
        it is answered: one sequence for every node, so no two nodes ever answer one id.

        A ``nextval`` is durable once a transaction commits that flushes the WAL (PostgreSQL's
        docs, "Sequence Manipulation Functions"). Recent releases give its transaction an id
        whenever it writes WAL, so its commit flushes (seen on 15.18); older ones did not, and a
        statement that only called ``nextval`` committed without a flush, so PostgreSQL crashing
        right after could answer the same id again. ``pg_current_xact_id()`` gives the
        statement's transaction an id on every release (13 and later): with ``synchronous_commit``
        on, as a shared cluster needs anyway, the answer comes after the flush."""
        found: int = await self._pool.fetchval("select nextval('capella_producer_ids'), pg_current_xact_id()")
        return found

    async def delete_subscription(self, queue: str, name: str) -> bool:
        status = await self._pool.execute(
            "delete from capella_subscriptions where queue = $1 and name = $2", queue, name
        )
        return status != "DELETE 0"

    # --- nodes -----------------------------------------------------------------------------

    async def claim_node(
        self, name: str, token: str, url: str, lease: float, kafka: tuple[str, int] | None = None
    ) -> str | None:
        """Claim node name ``name`` for ``lease`` seconds: None when claimed (or renewed by the
        same token, or taken over from a holder whose lease expired); else the live holder's url.
        ``kafka``: where the node serves Kafka clients (host, port), recorded with the claim."""
        host, port = kafka if kafka is not None else (None, None)
        row = await self._pool.fetchrow(
            "with claimed as (insert into capella_nodes as n "
            "(name, token, url, lease_until, kafka_host, kafka_port) "
            "values ($1, $2, $3, clock_timestamp() + make_interval(secs => $4), $5, $6) "
            "on conflict (name) do update set token = excluded.token, url = excluded.url, "
            "lease_until = excluded.lease_until, kafka_host = excluded.kafka_host, "
            "kafka_port = excluded.kafka_port "
            "where n.token = excluded.token or n.lease_until < clock_timestamp() returning 1) "
            "select (select count(*) from claimed), (select url from capella_nodes where name = $1)",
            name, token, url, float(lease), host, port,
        )  # fmt: skip
        return None if row[0] else str(row[1])

    async def renew_node(
        self, name: str, token: str, lease: float, kafka: tuple[str, int] | None = None
    ) -> bool:
        """``False`` when another token holds the name now (this node lost it). ``kafka`` is
        recorded again: a listener that started after the claim is listed from here on."""
        host, port = kafka if kafka is not None else (None, None)
        status = await self._pool.execute(
            "update capella_nodes set lease_until = clock_timestamp() + make_interval(secs => $3), "
            "kafka_host = $4, kafka_port = $5 where name = $1 and token = $2",
            name, token, float(lease), host, port,
        )  # fmt: skip
        return status != "UPDATE 0"

    async def release_node(self, name: str, token: str) -> None:
        await self._pool.execute("delete from capella_nodes where name = $1 and token = $2", name, token)

    async def live_nodes(self) -> list[tuple[str, str]]:
        """``(name, url)`` of the nodes whose lease runs, by name."""
        rows = await self._pool.fetch(
            "select name, url from capella_nodes where lease_until > clock_timestamp() order by name"
        )
        return [(r[0], r[1]) for r in rows]

    async def kafka_nodes(self) -> list[tuple[str, str, int]]:
        """``(name, host, port)`` of the live nodes that serve Kafka clients, by name."""
        rows = await self._pool.fetch(
            "select name, kafka_host, kafka_port from capella_nodes "
            "where lease_until > clock_timestamp() and kafka_host is not null order by name"
        )
        return [(r[0], r[1], r[2]) for r in rows]

    # --- retention -------------------------------------------------------------------------

    async def usage(self, queue: str) -> Usage | None:
        row = await self._pool.fetchrow(
            "select q.first_id, q.next_id, coalesce(sum(s.byte_size), 0)::bigint, count(s.first_id) "
            "from capella_queues q left join capella_segments s on s.queue = q.name "
            "where q.name = $1 group by q.first_id, q.next_id",
            queue,
        )
        return None if row is None else Usage(*row)

    async def retention_cut(
        self,
        queue: str,
        *,
        before_time: float | None = None,
        max_count: int | None = None,
        max_bytes: int | None = None,
    ) -> int:
        """The first id to keep so that what is kept is at most ``max_count`` messages, at most
        ``max_bytes`` bytes of segments, and none of a segment stamped before ``before_time``:
        always a segment's first id (or ``next_id``: nothing kept), so ``expire_below`` of it
        never cuts a segment. 0 when nothing needs to go (or no such queue)."""
        row = await self._pool.fetchrow(
            "select q.next_id, "
            "(select min(first_id) from capella_segments where queue = $1 and time >= $2), "
            "(select min(first_id) from capella_segments where queue = $1 and first_id >= q.next_id - $3), "
            "(select min(first_id) from (select first_id, "
            "sum(byte_size) over (order by first_id desc) as total "
            "from capella_segments where queue = $1) t where total <= $4) "
            "from capella_queues q where q.name = $1",
            queue, before_time, max_count, max_bytes,
        )  # fmt: skip
        if row is None:
            return 0
        next_id, by_age, by_count, by_bytes = row
        cut = 0
        for limit, found in ((before_time, by_age), (max_count, by_count), (max_bytes, by_bytes)):
            if limit is not None:
                cut = max(cut, next_id if found is None else found)
        return int(cut)

    async def expire_below(self, queue: str, first_kept: int) -> int:
        """Delete the segments wholly below ``first_kept`` (never cutting one), move the queue's
        first id, release their bytes, and delete (or trim) the identity runs below; answers how many
        segments went. Dedup's horizon is the retained history."""
        return (await self.expire(queue, first_kept)).segments

    async def expire(self, queue: str, first_kept: int) -> Expired:
        """``expire_below``, answering the segments and bytes that went and the new first id
        (0 without such a queue)."""
        async with self._pool.transaction() as conn:
            if await conn.fetchval("select 1 from capella_queues where name = $1 for update", queue) is None:
                return Expired(0, 0, 0)
            deleted, freed = await _release(conn, "queue = $1 and last_id < $2", queue, first_kept)
            first: int = await conn.fetchval(
                "update capella_queues set first_id = greatest(first_id, coalesce("
                "(select min(first_id) from capella_segments where queue = $1), next_id)) "
                "where name = $1 returning first_id",
                queue,
            )
            await conn.execute(
                "delete from capella_identity_runs "
                "where queue = $1 and first_id + (last_ext - first_ext) < $2",
                queue, first,
            )  # fmt: skip
            # A run merged over many commits straddles the cut: it keeps only its kept ids.
            await conn.execute(
                "update capella_identity_runs set first_ext = first_ext + ($2 - first_id), first_id = $2 "
                "where queue = $1 and first_id < $2",
                queue, first,
            )  # fmt: skip
            await conn.execute(
                "delete from capella_sources s where s.queue = $1 and not exists (select 1 from "
                "capella_identity_runs r where r.queue = s.queue and r.source = s.source)",
                queue,
            )
        return Expired(deleted, freed, first)

    # --- compaction ------------------------------------------------------------------------

    async def replace_segments(
        self,
        queue: str,
        first_id: int,
        last_id: int,
        key: str,
        node: str,
        size: int,
        *,
        segments: int | None = None,
    ) -> bool:
        """Point ids ``first_id..last_id`` at the compacted block ``key`` (``size`` bytes, the
        skipped messages left out): one segment row instead of those covering exactly that
        range, whose objects lose those bytes. ``False`` (nothing changed) when the rows
        covering the range are not exactly there any more: not starting and ending at its
        bounds (expired meanwhile), or not ``segments`` rows, the number the compactor read
        (compacted meanwhile). The block's time is its newest segment's, as a local block's is
        its seal time: retention by age never drops a message younger than its limit."""
        async with self._pool.transaction() as conn:
            if await conn.fetchval("select 1 from capella_queues where name = $1 for update", queue) is None:
                return False
            row = await conn.fetchrow(
                "select min(first_id), max(last_id), sum(last_id - first_id + 1), max(time), count(*) "
                "from capella_segments where queue = $1 and last_id >= $2 and first_id <= $3",
                queue, first_id, last_id,
            )  # fmt: skip
            if (row[0], row[1], row[2]) != (first_id, last_id, last_id - first_id + 1):
                return False
            if segments is not None and row[4] != segments:
                return False
            await _release(conn, "queue = $1 and first_id >= $2 and first_id <= $3", queue, first_id, last_id)
            object_id = await conn.fetchval(
                "insert into capella_objects (key, node, size, live_bytes, kind) "
                "values ($1, $2, $3, $3, 'block') returning object_id",
                key, node, size,
            )  # fmt: skip
            await conn.execute(
                "insert into capella_segments (queue, first_id, last_id, object_id, byte_offset, "
                "byte_size, count, skip, time) values ($1, $2, $3, $4, 0, $5, $6, '{}', $7)",
                queue, first_id, last_id, object_id, size, last_id - first_id + 1, row[3],
            )  # fmt: skip
        return True

    async def compactable(self, queue: str, before_time: float, limit: int = 1000) -> list[Segment]:
        """The oldest segments of ``queue`` still in flush objects (not compacted blocks),
        stamped before ``before_time``, by first id: the compactor groups the consecutive ones
        (``first_id == previous.last_id + 1``) and replaces each group with one block."""
        rows = await self._pool.fetch(
            _SEGMENT + "where s.queue = $1 and s.time < $2 and o.kind = 'flush' order by s.first_id limit $3",
            queue, before_time, limit,
        )  # fmt: skip
        return [_segment(r) for r in rows]

    def compaction_lock(self, queue: str) -> AbstractAsyncContextManager[bool]:
        """Whether this node got queue ``queue``'s compaction lock, held for the block on one
        connection (a session advisory lock: one compactor per queue across the nodes)."""
        return self._try_lock("capella:compact:" + queue)

    def janitor_lock(self) -> AbstractAsyncContextManager[bool]:
        """Whether this node got the janitor's lock (one janitor at a time across the nodes)."""
        return self._try_lock("capella:janitor")

    @asynccontextmanager
    async def _try_lock(self, name: str) -> AsyncIterator[bool]:
        async with self._pool.connection() as conn:
            got = bool(await conn.fetchval("select pg_try_advisory_lock(hashtext($1))", name))
            try:
                yield got
            finally:
                if got:
                    try:
                        await conn.execute("select pg_advisory_unlock(hashtext($1))", name)
                    except Exception:  # lost: PostgreSQL released the session's locks itself
                        conn.terminate()

    # --- garbage ---------------------------------------------------------------------------

    async def dead_objects(self, older_than: float, limit: int = 1000) -> list[str]:
        """Keys of the objects dead for more than ``older_than`` seconds (the grace period)."""
        rows = await self._pool.fetch(
            "select key from capella_objects where state = 'dead' "
            "and dead_since < now() - make_interval(secs => $1) order by dead_since limit $2",
            float(older_than), limit,
        )  # fmt: skip
        return [r[0] for r in rows]

    async def forget_objects(self, keys: list[str]) -> int:
        """Delete the rows of these dead objects (deleted from S3 already); answers how many."""
        status = await self._pool.execute(
            "delete from capella_objects where key = any($1) and state = 'dead'", keys
        )
        return int(status.split()[-1])

    async def known_keys(self, keys: list[str]) -> set[str]:
        """Which of ``keys`` have an object row (the janitor's check of an S3 listing: a key
        without one, old enough, was uploaded by a node that died before its commit)."""
        rows = await self._pool.fetch("select key from capella_objects where key = any($1)", keys)
        return {r[0] for r in rows}


async def _release(conn: Any, where: str, *args: Any) -> tuple[int, int]:
    """Delete the segment rows ``where`` selects and take their bytes off their objects; an
    object left with none is dead from now on (the janitor deletes it after the grace period).
    Answers how many rows went and their bytes. The objects are locked in id order first: two transactions
    releasing bytes of the same objects (retention of one queue, compaction of another) cannot
    deadlock."""
    rows = await conn.fetch(
        f"with gone as (delete from capella_segments where {where} returning object_id, byte_size) "
        "select object_id, sum(byte_size)::bigint, count(*) from gone group by object_id order by object_id",
        *args,
    )
    if not rows:
        return 0, 0
    ids, sizes = [r[0] for r in rows], [r[1] for r in rows]
    await conn.execute(
        "select 1 from capella_objects where object_id = any($1) order by object_id for update", ids
    )
    await conn.execute(
        "update capella_objects o set live_bytes = o.live_bytes - per.bytes, "
        "state = case when o.live_bytes - per.bytes <= 0 then 'dead' else o.state end, "
        "dead_since = case when o.live_bytes - per.bytes <= 0 then coalesce(o.dead_since, now()) "
        "else o.dead_since end "
        "from unnest($1::bigint[], $2::bigint[]) as per (object_id, bytes) where o.object_id = per.object_id",
        ids, sizes,
    )  # fmt: skip
    return sum(int(r[2]) for r in rows), sum(int(r[1]) for r in rows)


def _segment(row: Any) -> Segment:
    return Segment(
        row[0], row[1], row[2], row[3], row[4], row[5], row[6], tuple(row[7] or ()), float(row[8]), row[9]
    )
