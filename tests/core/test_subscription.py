"""A cursor's group and metadata (core/subscription.py): kept by commits, bounded, in the saved
document and change-log records, and absent from both when None, so older ones load as before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from support.configs import file_config

from capella.core.cluster import Cluster
from capella.core.limits import MAX_GROUP_BYTES, MAX_METADATA_BYTES
from capella.core.message import SaveMode
from capella.core.subscription import Subscriptions, SubscriptionState
from capella.errors import CorruptData, InvalidSubscriptionGroup, SubscriptionMetadataTooLarge


def commit(
    subs: Subscriptions,
    last_id: int | None,
    *,
    reset: bool = False,
    now: float = 5.0,
    group: Any = None,
    metadata: Any = None,
) -> tuple[SubscriptionState, bool]:
    """A commit of cursor ``kafka.g`` as a group's would be (``group``, ``metadata``: Any, to try
    values that are not text)."""
    return subs.commit("kafka.g", last_id, replica=None, reset=reset, now=now, group=group, metadata=metadata)


def replayed(records: list[bytes]) -> Subscriptions:
    subs = Subscriptions()
    for record in records:
        subs.apply(record)
    return subs


def test_a_commit_keeps_the_group_and_metadata_and_none_keeps_what_is_there() -> None:
    subs = Subscriptions()
    sub, created = commit(subs, 9, group="g", metadata="m1")
    assert created and (sub.last_id, sub.group, sub.metadata) == (9, "g", "m1")
    sub, created = commit(subs, 12, now=6.0)
    assert not created and (sub.last_id, sub.group, sub.metadata, sub.updated) == (12, "g", "m1", 6.0)
    sub, _ = commit(subs, None, metadata="")  # an empty metadata is one, not none
    assert (sub.last_id, sub.group, sub.metadata) == (12, "g", "")
    # A group commit may move the cursor back (Kafka allows it): with reset.
    sub, _ = commit(subs, 3, reset=True, metadata="back")
    assert (sub.last_id, sub.metadata) == (3, "back")
    assert subs.get("kafka.g") == sub


def test_a_commit_that_changes_nothing_writes_no_record() -> None:
    subs = Subscriptions()
    commit(subs, 9, group="g", metadata="m")
    assert len(subs.take_records()) == 1
    # A consumer's periodic commit of the same offset and metadata: nothing to save.
    sub, created = commit(subs, 9, group="g", metadata="m", now=7.0)
    assert not created and sub.updated == 5.0
    assert subs.take_records() == []
    commit(subs, 9, metadata="other")
    assert len(subs.take_records()) == 1


def test_the_fields_round_trip_through_the_document_and_the_change_log() -> None:
    subs = Subscriptions()
    commit(subs, 9, group="billing/eu 🇪🇺", metadata='{"a": "\\n"}')
    commit(subs, 10)
    subs.commit("plain", 4, replica=True, reset=False, now=1.0)
    records = subs.take_records()
    assert replayed(records).all() == subs.all()
    loaded = Subscriptions()
    loaded.load(subs.dump())
    assert loaded.all() == subs.all()
    # A cursor without them saves neither field: what older versions wrote and read.
    assert orjson.loads(records[-1]) == {
        "name": "plain",
        "last_id": 4,
        "replica": True,
        "created": 1.0,
        "updated": 1.0,
    }
    assert orjson.loads(records[0])["group"] == "billing/eu 🇪🇺"


def test_records_and_documents_saved_before_the_fields_load_without_them() -> None:
    old_record = b'{"name":"dc2","last_id":12,"replica":true,"created":1.0,"updated":2.0}'
    subs = replayed([old_record])
    assert subs.get("dc2") == SubscriptionState("dc2", 12, True, 1.0, 2.0)
    assert (subs.get("dc2").group, subs.get("dc2").metadata) == (None, None)
    old_document = (
        b'{"version":1,"subscriptions":{"dc2":{"last_id":12,"replica":false,"created":1.0,"updated":2.0}}}'
    )
    subs = Subscriptions()
    subs.load(old_document)
    assert subs.get("dc2") == SubscriptionState("dc2", 12, False, 1.0, 2.0)
    # The first commit with a group adds it to what the old record had.
    sub, created = subs.commit("dc2", 13, replica=None, reset=False, now=3.0, group="g")
    assert not created and (sub.last_id, sub.replica, sub.created, sub.group) == (13, False, 1.0, "g")


@pytest.mark.parametrize("field", ["group", "metadata"])
def test_a_field_that_is_not_text_in_a_record_is_corrupt(field: str) -> None:
    record = orjson.dumps(
        {"name": "s", "last_id": 1, "replica": False, "created": 1.0, "updated": 1.0, field: 7}
    )
    with pytest.raises(CorruptData, match="subscription change record"):
        replayed([record])


def test_metadata_over_its_limit_is_refused_with_its_own_error() -> None:
    subs = Subscriptions()
    commit(subs, 1, metadata="m" * MAX_METADATA_BYTES)  # at the limit: kept
    # The limit counts UTF-8 bytes: 1,366 euro signs are 4,098 of them.
    for metadata in ("m" * (MAX_METADATA_BYTES + 1), "€" * 1366):
        with pytest.raises(SubscriptionMetadataTooLarge) as refused:
            commit(subs, 2, metadata=metadata)
        assert refused.value.details == {"field": "metadata", "limit": MAX_METADATA_BYTES}
    assert subs.get("kafka.g").last_id == 1  # a refused commit changes nothing
    for bad in ("nul\x00", "\ud800", 5):
        with pytest.raises(SubscriptionMetadataTooLarge):
            commit(subs, 2, metadata=bad)


def test_a_group_must_be_text_of_one_to_its_limit_of_bytes() -> None:
    subs = Subscriptions()
    commit(subs, 1, group="g" * MAX_GROUP_BYTES)
    for bad in ("", "g" * (MAX_GROUP_BYTES + 1), "nul\x00", "\udfff", b"g"):
        with pytest.raises(InvalidSubscriptionGroup) as refused:
            commit(subs, 2, group=bad)
        assert refused.value.details == {"field": "group", "limit": MAX_GROUP_BYTES}
    assert subs.get("kafka.g").group == "g" * MAX_GROUP_BYTES


async def test_a_queue_keeps_a_cursors_group_and_metadata_across_a_restart(tmp_path: Path) -> None:
    config = file_config(tmp_path)
    cluster = await Cluster.open(config)
    try:
        q, _ = await cluster.put_queue("orders", {})
        await q.commit("kafka.0123abcd", 4, group="g" * 300, metadata="gen 7", save=SaveMode.IMMEDIATE)
        await q.commit("kafka.0123abcd", 2, reset=True, metadata="gen 8", save=SaveMode.IMMEDIATE)
        await q.commit("plain", 1, save=SaveMode.IMMEDIATE)
    finally:
        await cluster.close()
    log = tmp_path / "data" / "queues" / "orders" / "subscriptions" / "log" / f"{0:020d}.log"
    assert b'"metadata":"gen 8"' in log.read_bytes()
    cluster = await Cluster.open(config)
    try:
        q = cluster.queue("orders")
        sub = q.subscription("kafka.0123abcd")
        assert (sub.last_id, sub.group, sub.metadata) == (2, "g" * 300, "gen 8")
        assert (q.subscription("plain").group, q.subscription("plain").metadata) == (None, None)
        # An HTTP-style commit (no group, no metadata) moves the cursor and keeps both.
        sub, _ = await q.commit("kafka.0123abcd", 9)
        assert (sub.last_id, sub.group, sub.metadata) == (9, "g" * 300, "gen 8")
    finally:
        await cluster.close()
