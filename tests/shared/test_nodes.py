"""Three ``capella serve`` nodes on one PostgreSQL and one bucket behave as one queue.

What the issue asks of a shared cluster (design note §8, D1, D3, D4): messages produced
round-robin through every node read back the same from every node, ids strictly increasing
with no gaps; one identity sent to every node at once is stored once and every answer carries
its one id; one client writing through alternating nodes sees its ids in send order. And the
definitions of shared queues live in PostgreSQL: created, changed and dropped on one node,
they are seen by every node at once (NOTIFY). The nodes' ``/metrics`` count what they did.
One rig of three nodes serves the module; every test has queues of its own.
"""

from __future__ import annotations

import asyncio
import random
import re
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from support.shared import SharedRig
from support.shared_cluster import clients, cut_listeners, listening, module_rig, read_all
from support.wait import until

from capella.client import AsyncClient
from capella.errors import InvalidRequest, QueueNotFound
from capella.wire.messages import ProduceResult
from capella.wire.queues import QueueInfo

pytestmark = pytest.mark.slow

# NOTIFY reaches a node in milliseconds; the poll behind it every 5 s. Within this, it was NOTIFY.
NOTICE = 1.5


@pytest.fixture(scope="module")
def rig(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedRig]:
    yield from module_rig(request, tmp_path_factory)


async def defined_everywhere(cs: list[AsyncClient], name: str, within: float = NOTICE) -> None:
    async def seen() -> bool:
        for c in cs:
            try:
                await c.queue(name)
            except QueueNotFound:
                return False
        return True

    await until(seen, within, f"{name} on every node")


def seg_range(info: QueueInfo) -> tuple[int, int] | None:
    found = info.definition.segments
    return None if found is None else (found.min, found.max)


def payload(n: int) -> bytes:
    """Message ``n``'s bytes: its number, then bytes that are not UTF-8, of a length of its own."""
    return b"m%05d:" % n + bytes((n * 7 + k) % 256 for k in range(n % 97))


# --- D1 ------------------------------------------------------------------------------------------


async def test_ten_thousand_messages_round_robin_read_the_same_through_every_node(rig: SharedRig) -> None:
    total, per_batch, producers = 10_000, 100, 6
    async with clients(rig.urls) as cs:
        await cs[0].put_queue("d1", storage="shared")
        await defined_everywhere(cs, "d1")
        batches = [list(range(b * per_batch, (b + 1) * per_batch)) for b in range(total // per_batch)]
        sent: dict[int, bytes] = {}  # id -> payload, from the answers

        async def producer(k: int) -> None:
            for b in range(k, len(batches), producers):
                node = cs[b % 3]  # batch b through node b mod 3: round-robin
                ns = batches[b]
                results = await node.produce("d1", [payload(n) for n in ns], save="wait")
                assert [r.duplicate for r in results] == [False] * per_batch
                for n, r in zip(ns, results, strict=True):
                    assert isinstance(r.id, int) and r.id not in sent
                    sent[r.id] = payload(n)

        await asyncio.gather(*(producer(k) for k in range(producers)))
        assert sorted(sent) == list(range(1, total + 1))

        reads = [await read_all(c, "d1") for c in cs]
        for found in reads:
            ids = [m.id for m in found]
            assert ids == list(range(1, total + 1))  # strictly increasing, no gaps
            assert {m.id: m.payload for m in found} == sent  # every answer's id holds its bytes
        # The same messages through every node, every field (times come from PostgreSQL).
        assert reads[0] == reads[1] == reads[2]
        times = [m.time for m in reads[0]]
        assert times == sorted(times)
        # The JSON form of a node that wrote a third of them says the same.
        assert await read_all(cs[1], "d1", binary=False) == reads[1]


async def test_many_queues_flushed_in_one_window_read_back_apart_on_another_node(rig: SharedRig) -> None:
    """One object holds the batches of every queue written in a window; each queue reads back
    its own, through a node that fetched the object from S3."""
    names = [f"many-{i:02d}" for i in range(20)]
    async with clients(rig.urls) as cs:
        for name in names:
            await cs[0].put_queue(name, storage="shared")
        for name in names:
            await defined_everywhere(cs, name)
        before = metrics_of(rig.urls[0], "capella_shared_objects_total")
        sent = await asyncio.gather(
            *(cs[0].produce(n, [f"{n} #{k}" for k in range(i + 1)], save="wait") for i, n in enumerate(names))
        )
        objects = metrics_of(rig.urls[0], "capella_shared_objects_total") - before
        assert objects < len(names) / 2, objects  # batched: far fewer objects than queues
        for i, name in enumerate(names):
            assert [r.id for r in sent[i]] == list(range(1, i + 2))
            found = await read_all(cs[2], name)
            assert [(m.id, m.payload) for m in found] == [
                (k + 1, f"{name} #{k}".encode()) for k in range(i + 1)
            ]


def metrics_of(url: str, name: str) -> float:
    return metrics(url)[name]


# --- D3 ------------------------------------------------------------------------------------------


def identity(ext: int) -> dict[str, Any]:
    return {"data": f"identity {ext}", "source": "dup", "external_id": ext, "segment": ext % 5}


async def produce_as(
    c: AsyncClient, form: str, queue: str, messages: list[dict[str, Any]]
) -> list[ProduceResult]:
    """A produce in one of the three body forms: a record batch, JSON, NDJSON."""
    if form == "ndjson":
        return await c.produce_ndjson(queue, messages, save="wait")
    return await c.produce(queue, messages, save="wait", binary=form == "batch")


FORMS = ("batch", "json", "ndjson")


async def test_one_identity_sent_to_every_node_at_once_is_stored_once_with_one_id(rig: SharedRig) -> None:
    async with clients(rig.urls) as cs:
        await cs[0].put_queue("d3", storage="shared")
        await defined_everywhere(cs, "d3")
        answers: dict[int, list[ProduceResult]] = {}
        for start in range(1, 1001, 100):
            exts = list(range(start, start + 100))
            batch = [identity(e) for e in exts]
            # The same batch through the three nodes at once, each in another body form.
            results = await asyncio.gather(*(produce_as(c, FORMS[i], "d3", batch) for i, c in enumerate(cs)))
            for e, per_node in zip(exts, zip(*results, strict=True), strict=True):
                answers[e] = list(per_node)

        for e, three in answers.items():
            assert len({r.id for r in three}) == 1, (e, three)
            assert sorted(r.duplicate for r in three) == [False, True, True], (e, three)

        for c in cs:
            found = await read_all(c, "d3")
            assert [m.id for m in found] == list(range(1, 1001))
            assert {m.external_id: (m.id, m.payload) for m in found} == {
                e: (three[0].id, f"identity {e}".encode()) for e, three in answers.items()
            }
            assert {m.source for m in found} == {"dup"}


async def test_mixed_batches_of_new_and_stored_identities_store_each_once(rig: SharedRig) -> None:
    """Partial duplicates: a batch holding new identities among stored ones is committed with
    the stored ones cut out (segments.skip), and reads back right through every node."""
    async with clients(rig.urls) as cs:
        await cs[1].put_queue("mixed", storage="shared")
        await defined_everywhere(cs, "mixed")
        first = await cs[1].produce("mixed", [identity(e) for e in range(1, 201)], save="wait")
        assert [r.id for r in first] == list(range(1, 201))

        rng = random.Random(36)
        answers: dict[int, set[int]] = {}
        stored_before = {e: r.id for e, r in zip(range(1, 201), first, strict=True)}
        for step in range(6):
            new = list(range(201 + step * 40, 241 + step * 40))
            calls = []
            for i, c in enumerate(cs):
                # Each node gets the new identities (in an order of its own) among old ones.
                mine = new[:] + rng.sample(range(1, 201), 20)
                rng.shuffle(mine)
                if i == 0:
                    mine = sorted(mine)  # one monotonic batch: runs with holes
                calls.append(
                    (mine, produce_as(c, FORMS[(step + i) % 3], "mixed", [identity(e) for e in mine]))
                )
            results = await asyncio.gather(*(call for _, call in calls))
            for (mine, _), result in zip(calls, results, strict=True):
                for e, r in zip(mine, result, strict=True):
                    assert isinstance(r.id, int)
                    answers.setdefault(e, set()).add(r.id)
                    if e <= 200:
                        assert r.duplicate and r.id == stored_before[e], (e, r)

        assert all(len(ids) == 1 for ids in answers.values()), answers
        total = 200 + 6 * 40
        for c in cs:
            found = await read_all(c, "mixed")
            assert [m.id for m in found] == list(range(1, total + 1))
            by_ext = {m.external_id: m for m in found}
            assert len(by_ext) == total
            for e, ids in answers.items():
                (only,) = ids
                assert by_ext[e].id == only and by_ext[e].payload == f"identity {e}".encode()
                assert by_ext[e].segment == e % 5
            # Filtered reads cross the segments with skipped positions too.
            odd = await read_all(c, "mixed", segments=[1, 3])
            assert [m.external_id for m in odd] == [m.external_id for m in found if m.segment in (1, 3)]


# --- D4 ------------------------------------------------------------------------------------------


async def test_one_client_through_alternating_nodes_sees_its_ids_in_send_order(rig: SharedRig) -> None:
    async with clients(rig.urls) as cs:
        await cs[2].put_queue("d4", storage="shared")
        await defined_everywhere(cs, "d4")
        ids: list[int] = []
        for n in range(30):
            # Each write after the previous answer; immediate and wait take different paths.
            save = "immediate" if n % 2 else "wait"
            (result,) = await cs[n % 3].produce("d4", [f"step {n}"], save=save)
            assert isinstance(result.id, int)
            ids.append(result.id)
        assert ids == sorted(ids) and len(set(ids)) == len(ids)
        assert ids == list(range(1, 31))  # no other writer: no gaps either
        found = await read_all(cs[0], "d4")
        assert [m.payload for m in found] == [f"step {n}".encode() for n in range(30)]


async def test_a_write_answered_on_one_node_is_in_the_next_read_through_another(rig: SharedRig) -> None:
    async with clients(rig.urls) as cs:
        await cs[0].put_queue("read-your-writes", storage="shared")
        await defined_everywhere(cs, "read-your-writes")
        last = 0
        for n in range(30):
            (result,) = await cs[0].produce("read-your-writes", [f"w{n}"])
            # Straight after the answer, through a node that read up to the write before: no
            # waiting for its NOTIFY.
            page = await cs[1].read("read-your-writes", after=last)
            assert [m.id for m in page.messages] == [result.id], f"write {n} missed"
            last = result.id


# --- definitions -------------------------------------------------------------------------------


async def test_a_definition_created_changed_and_dropped_on_one_node_is_seen_by_every_node(
    rig: SharedRig,
) -> None:
    async with clients(rig.urls) as cs:
        made, created = await cs[0].save_queue("defs", storage="shared", segments={"min": 0, "max": 9})
        assert created and made.definition.storage == "shared"
        await defined_everywhere(cs, "defs")
        for c in cs:
            info = await c.queue("defs")
            assert info.definition.storage == "shared" and seg_range(info) == (0, 9)
            assert "defs" in [q.name for q in await c.queues()]

        # Changed through another node: every node holds the new definition.
        changed, created = await cs[1].save_queue("defs", segments={"min": 0, "max": 99}, save="immediate")
        assert not created and changed.definition.storage == "shared"

        async def changed_everywhere() -> bool:
            infos = [await c.queue("defs") for c in cs]
            return all(seg_range(i) == (0, 99) and i.definition.save == "immediate" for i in infos)

        await until(changed_everywhere, NOTICE, "the changed definition on every node")
        # The new segment range is enforced by the nodes that did not change it.
        with pytest.raises(InvalidRequest):
            await cs[2].produce("defs", [{"data": "x", "segment": 100}], save="wait")
        (ok,) = await cs[2].produce("defs", [{"data": "x", "segment": 50}], save="wait")
        assert ok.id == 1

        # Its storage cannot change, through any node.
        for c in cs:
            with pytest.raises(InvalidRequest) as refused:
                await c.put_queue("defs", storage="local")
            assert "storage cannot change" in refused.value.message
            assert refused.value.details.get("field") == "storage"
        assert (await cs[0].queue("defs")).definition.storage == "shared"

        # Dropped on the third node: gone from every node.
        await cs[2].drop_queue("defs")

        async def gone() -> bool:
            for c in cs:
                try:
                    await c.queue("defs")
                    return False
                except QueueNotFound:
                    pass
            return True

        await until(gone, NOTICE, "defs gone from every node")
        for c in cs:
            assert "defs" not in [q.name for q in await c.queues()]
            with pytest.raises(QueueNotFound):
                await c.produce("defs", ["late"], save="wait")

        # And created again, from nothing: its ids start over.
        await cs[1].put_queue("defs", storage="shared")
        await defined_everywhere(cs, "defs")
        (again,) = await cs[0].produce("defs", ["new life"], save="wait")
        assert again.id == 1
        assert [m.payload for m in await read_all(cs[2], "defs")] == [b"new life"]


async def test_a_queue_dropped_and_created_again_unheard_is_the_new_queue_on_every_node(
    rig: SharedRig,
) -> None:
    """Both notices lost (the LISTEN connections cut meanwhile): a node that cached the old
    queue's segments and ids must not serve them as the new queue's."""
    async with clients(rig.urls) as cs:
        await cs[0].put_queue("reborn", storage="shared")
        await defined_everywhere(cs, "reborn")
        await cs[0].produce("reborn", [f"old {k}" for k in range(5)], save="wait")
        assert [m.payload for m in await read_all(cs[1], "reborn")] == [f"old {k}".encode() for k in range(5)]
        await until(lambda: listening(rig) >= 9, 10.0, "every node listening")
        assert cut_listeners(rig) >= 9
        await cs[0].drop_queue("reborn")
        await cs[0].put_queue("reborn", storage="shared")
        (new,) = await cs[0].produce("reborn", ["new"], save="wait")
        assert new.id == 1

        async def renewed() -> bool:
            found = [(m.id, m.payload) for m in await read_all(cs[1], "reborn")]
            return found == [(1, b"new")] and (await cs[1].queue("reborn")).stats.last_id == 1

        await until(renewed, NOTICE, "node 1 serving the new reborn")
        (newer,) = await cs[1].produce("reborn", ["newer"], save="wait")
        assert newer.id == 2


async def test_a_local_queue_cannot_become_shared_and_a_local_name_is_not_redefined_shared(
    rig: SharedRig,
) -> None:
    async with clients(rig.urls) as cs:
        await cs[0].put_queue("only-here")
        with pytest.raises(InvalidRequest) as refused:
            await cs[0].put_queue("only-here", storage="shared")
        assert "is local: its storage cannot change" in refused.value.message
        assert (await cs[0].queue("only-here")).definition.storage == "local"
        for c in cs[1:]:
            with pytest.raises(QueueNotFound):
                await c.queue("only-here")


# --- metrics ----------------------------------------------------------------------------------


def metrics(url: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10.0) as resp:
        text = resp.read().decode()
    found: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r"^(capella_shared_[a-z_]+(?:\{[^}]*\})?) ([0-9.e+-]+)$", line)
        if m:
            found[m.group(1)] = float(m.group(2))
    return found


async def test_the_shared_counters_of_metrics_move_with_produce_and_reads(rig: SharedRig) -> None:
    async with clients(rig.urls) as cs:
        await cs[0].put_queue("counted", storage="shared")
        await defined_everywhere(cs, "counted")
        writer0, reader0 = metrics(rig.urls[0]), metrics(rig.urls[1])
        for name in (
            "capella_shared_flushes_total",
            "capella_shared_objects_total",
            "capella_shared_put_requests_total",
            "capella_shared_put_bytes_total",
            "capella_shared_get_requests_total",
            "capella_shared_get_bytes_total",
            "capella_shared_duplicates_total",
            "capella_shared_notifications_total",
            "capella_shared_commit_seconds_count",
            "capella_shared_flush_seconds_count",
        ):
            assert name in writer0 and name in reader0, name

        first = await cs[0].produce("counted", [{"data": "a", "source": "m", "external_id": 1}], save="wait")
        await cs[0].produce("counted", [{"data": "a", "source": "m", "external_id": 1}], save="wait")
        await cs[0].produce("counted", [b"x" * 1000 for _ in range(10)], save="wait")
        found = await read_all(cs[1], "counted")
        assert [m.id for m in found] == list(range(first[0].id, first[0].id + 11))

        writer1, reader1 = metrics(rig.urls[0]), metrics(rig.urls[1])

        def grew(before: dict[str, float], after: dict[str, float], name: str) -> float:
            return after[name] - before[name]

        assert grew(writer0, writer1, "capella_shared_flushes_total") >= 3
        assert grew(writer0, writer1, "capella_shared_objects_total") >= 3
        assert grew(writer0, writer1, "capella_shared_put_requests_total") >= 3
        assert grew(writer0, writer1, "capella_shared_put_bytes_total") >= 10_000
        assert grew(writer0, writer1, "capella_shared_commit_seconds_count") >= 3
        assert grew(writer0, writer1, "capella_shared_flush_seconds_count") >= 3
        assert grew(writer0, writer1, "capella_shared_duplicates_total") == 1
        # The reader wrote nothing and fetched the objects it read; it heard of the commits.
        assert grew(reader0, reader1, "capella_shared_put_requests_total") == 0
        assert grew(reader0, reader1, "capella_shared_get_requests_total") >= 1
        assert grew(reader0, reader1, "capella_shared_get_bytes_total") >= 10_000
        assert grew(reader0, reader1, "capella_shared_notifications_total") >= 2
