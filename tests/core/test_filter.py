"""Which messages an operator's filter picks: source, segments, headers and JSON fields."""

from __future__ import annotations

from typing import Any

import pytest

from capella.core.filter import MessageFilter, matches, parse_path
from capella.core.message import LogMessage


def message(payload: bytes = b"{}", **fields: Any) -> LogMessage:
    values: dict[str, Any] = {"source": "web", "segment": 0, "headers": {}} | fields
    return LogMessage(1, 0.0, values["source"], 1, 0.0, values["segment"], payload, values["headers"])


def test_an_empty_filter_matches_everything() -> None:
    assert MessageFilter().empty and matches(MessageFilter(), message(b"not json"))


def test_source_segments_and_headers_must_all_match() -> None:
    f = MessageFilter(source="web", segments=((0, 2), (9, 9)), headers=(("k", "v"),))
    assert matches(f, message(segment=9, headers={"k": "v", "other": "x"}))
    assert not matches(f, message(segment=5, headers={"k": "v"}))
    assert not matches(f, message(source="app", headers={"k": "v"}))
    assert not matches(f, message(headers={"k": "w"}))


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("customer.id", 42, True),
        ("customer.id", "42", False),
        ("items.1.sku", "b", True),
        ("items.5.sku", "b", False),
        ("rush", True, True),
        ("count", True, False),  # 1 is not true in JSON
        ("count", 1, True),
        ("missing", None, False),
        ("customer.id.deeper", 1, False),
    ],
)
def test_json_fields_compare_as_json_values(path: str, value: Any, expected: bool) -> None:
    payload = b'{"customer": {"id": 42}, "items": [{"sku": "a"}, {"sku": "b"}], "rush": true, "count": 1}'
    assert matches(MessageFilter(fields=((parse_path(path), value),)), message(payload)) is expected


def test_a_payload_that_is_not_json_never_matches_a_field() -> None:
    assert not matches(MessageFilter(fields=((("a",), 1),)), message(b"\xff not json"))
