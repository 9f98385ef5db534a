"""Messages of every kind a reader can meet: text, bytes that are not UTF-8, escapes, headers, every field."""

from __future__ import annotations

import base64
from typing import Any

NOT_UTF8 = b"\xff\x00\x80 not text"
SHAPES: list[dict[str, Any]] = [
    {"data": "plain text"},
    {"data_b64": base64.b64encode(NOT_UTF8).decode()},
    {"data": ""},
    {"data": 'ünïcødé "quoted" \\ back\nslash\ttab \u0001'},
    {"data": '{"order": {"id": 42, "lines": [1, 2]}}', "headers": {"x": "1"}},
    {"data": "all fields", "source": "dc1", "external_id": -5, "external_time": 1.7e9, "segment": 3},
    {"data": "unicode headers", "headers": {"x": "2", "ünï": "çødé ✓", "empty": ""}},
    {"data_b64": base64.b64encode(bytes(range(256))).decode(), "segment": 7},
]
