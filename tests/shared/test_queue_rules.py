"""The pure rules of a shared queue's write and read paths: identity runs, the answers a commit
gives, and a stored batch stamped with what its commit decided."""

from __future__ import annotations

from capella.core.log.writer import Appended
from capella.core.message import Draft, drafts_batch
from capella.records import record_batch
from capella.shared.catalog import Committed, Run, Segment
from capella.shared.node import stamped
from capella.shared.queue import answers, runs_of


def test_a_monotonic_producers_identities_are_one_run() -> None:
    assert runs_of([("a", 5), ("a", 6), ("a", 7)]) == [Run("a", 5, 7, 0)]


def test_a_run_breaks_at_a_gap_a_new_source_and_a_message_without_identity() -> None:
    identities: list[tuple[str, int | None]] = [
        ("a", 1), ("a", 2), ("a", 4), ("b", 5), ("b", 6), ("b", None), ("b", 7), ("a", 3),
    ]  # fmt: skip
    assert runs_of(identities) == [
        Run("a", 1, 2, 0),
        Run("a", 4, 4, 2),
        Run("b", 5, 6, 3),
        Run("b", 7, 7, 6),
        Run("a", 3, 3, 7),
    ]


def test_falling_external_ids_are_a_run_each() -> None:
    assert runs_of([("a", 3), ("a", 2)]) == [Run("a", 3, 3, 0), Run("a", 2, 2, 1)]


def test_no_identity_no_run() -> None:
    assert runs_of([("a", None), ("a", None)]) == []


def test_answers_give_kept_messages_consecutive_ids_and_duplicates_their_own() -> None:
    committed = Committed(first_id=10, time=1.0, duplicates={1: 4, 3: 7})
    assert answers(committed, 5) == [
        Appended(10, False),
        Appended(4, True),
        Appended(11, False),
        Appended(7, True),
        Appended(12, False),
    ]


def test_a_batch_of_duplicates_alone_takes_no_id() -> None:
    assert answers(Committed(first_id=0, time=1.0, duplicates={0: 3, 1: 4}), 2) == [
        Appended(3, True),
        Appended(4, True),
    ]


def test_a_stored_batch_is_read_with_its_ids_time_and_source_and_without_its_duplicates() -> None:
    drafts = [
        Draft(b"a", external_id=100),
        Draft(b"b", external_id=101, headers={"k": "v"}),
        Draft(b"c"),
        Draft(b"d", source="far", external_id=9, segment=3),
    ]
    data = drafts_batch(drafts, source="own")  # as a node buffers it: base id 0, no time
    segment = Segment("q", 20, 22, "shared/x.cpo", 0, len(data), 4, (1,), 1700000000.5)

    messages = stamped(data, segment, "own").messages

    assert [(m.id, m.payload, m.external_id, m.source) for m in messages] == [
        (20, b"a", 100, "own"),
        (21, b"c", 21, "own"),  # no identity given: (own, its own id)
        (22, b"d", 9, "far"),
    ]
    assert {m.time for m in messages} == {1700000000.5}
    assert messages[2].segment == 3
    assert record_batch.framed(data).base_id == 0  # the object's bytes are left as they were


def test_a_batch_with_nothing_skipped_is_stamped_without_being_decoded_again() -> None:
    data = drafts_batch([Draft(b"x"), Draft(b"y")], source="own")
    batch = stamped(data, Segment("q", 7, 8, "k", 0, len(data), 2, (), 5.0), "own")
    assert list(batch.ids) == [7, 8]
    assert [m.payload for m in batch.messages] == [b"x", b"y"]
