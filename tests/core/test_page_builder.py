"""A page holds each id once, in order, even when the batches it is given overlap (a shared
queue's read that meets a compacted block holding ids it served from older segments)."""

from __future__ import annotations

from capella.core.base_queue import PageBuilder
from capella.core.log.batch import Batch
from capella.core.message import LogMessage


def batch(first: int, last: int) -> Batch:
    return Batch.of_messages(
        [LogMessage(i, 0.0, "s", i, 0.0, 0, f"m{i}".encode(), {}) for i in range(first, last + 1)]
    )


def test_an_overlapping_batch_adds_only_the_ids_past_the_page() -> None:
    page = PageBuilder(after=5, limit=100)
    assert not page.add(batch(6, 10))
    assert not page.add(batch(1, 20))  # a block over what the page holds already
    assert [m.id for m in page.page().messages()] == list(range(6, 21))
    assert page.page().last_id == 20


def test_a_page_is_cut_at_its_limit_across_overlapping_batches() -> None:
    page = PageBuilder(after=0, limit=7)
    assert not page.add(batch(1, 4))
    assert page.add(batch(3, 9))
    assert [m.id for m in page.page().messages()] == list(range(1, 8))
