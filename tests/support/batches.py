"""Record batches for property tests: a producer's columns (``drafts``) and stored messages (``stored``)."""

from __future__ import annotations

from hypothesis import strategies as st

from capella.records.record_batch import Fields

I64 = st.integers(-(2**63), 2**63 - 1)
TIMES = st.floats(allow_nan=False)
SOURCES = st.sampled_from(["edge-1", "dc-eu", "zürich-☃", ""])
HEADERS = st.dictionaries(st.text(max_size=8), st.text(max_size=16), max_size=3)
PAYLOADS = st.binary(max_size=300)


@st.composite
def drafts(draw: st.DrawFn, max_size: int = 8) -> dict[str, list[object]]:
    """A producer's columns: each optional value present or left to default."""
    n = draw(st.integers(1, max_size))

    def column(values: st.SearchStrategy[object]) -> list[object]:
        return [draw(values) for _ in range(n)]

    return {
        "payloads": column(PAYLOADS),
        "sources": column(st.none() | SOURCES),
        "external_ids": column(st.none() | I64),
        "external_times": column(st.none() | TIMES),
        "segments": column(st.just(0) | I64),
        "headers": column(st.just({}) | HEADERS),
    }


@st.composite
def stored(draw: st.DrawFn, max_size: int = 10) -> Fields:
    """Stored messages: increasing ids, with runs of consecutive ids sharing a time."""
    n = draw(st.integers(1, max_size))
    ids, times = [], []
    next_id = draw(st.integers(0, 2**40))
    time = draw(TIMES)
    for _ in range(n):
        if draw(st.booleans()):
            next_id += draw(st.integers(1, 5))
            time = draw(TIMES)
        ids.append(next_id)
        times.append(time)
        next_id += 1
    return Fields(
        ids,
        times,
        [draw(SOURCES) for _ in range(n)],
        [draw(st.sampled_from([i, i + 7]) | I64) for i in ids],
        [draw(st.sampled_from([t]) | TIMES) for t in times],
        [draw(st.just(0) | I64) for _ in range(n)],
        [draw(PAYLOADS) for _ in range(n)],
        [draw(st.just({}) | HEADERS) for _ in range(n)],
    )
