"""Transport hardening against real servers on 127.0.0.1: the JSON nesting limit."""

from __future__ import annotations

import orjson
import pytest
from aiohttp.test_utils import TestClient

from capella.api.request import nesting, shallow_enough

# --- JSON nesting ----------------------------------------------------------------------


def nested(depth: int) -> bytes:
    """A JSON object ``depth`` levels deep (the outer object counts)."""
    return b'{"x":' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"


async def test_json_deeper_than_max_json_depth_gets_400_json_too_deep(api: TestClient) -> None:
    deep = await api.put("/v1/queues/deep", data=nested(33))
    at_limit = await api.put("/v1/queues/deep", data=nested(32))

    assert deep.status == 400
    error = (await deep.json())["error"]
    assert error["code"] == "json_too_deep"
    assert error["limit"] == 32
    # Refused for what it says, not for how deep it is.
    assert (await at_limit.json())["error"]["code"] != "json_too_deep"


@pytest.mark.parametrize(
    ("body", "depth"),
    [
        (b"1", 0),
        (b"[]", 1),
        (b'{"a": [1, {"b": []}]}', 4),
        (b'{"a": "[[[[[[[[[[[["}', 1),  # brackets in strings do not count
        (b'{"a": "]]]]]]", "b": [[["["]]]}', 4),
        (b"[[1], [[2]], [[[3]]]]", 4),
    ],
)
def test_nesting_is_measured_exactly(body: bytes, depth: int) -> None:
    value = orjson.loads(body)

    assert nesting(value, 32) == depth
    assert shallow_enough(body, depth) or b'"' in body
    if depth:
        assert nesting(value, depth - 1) == depth  # counts one past the limit, then stops
        # The byte pre-check never calls a body shallow when it is deeper than the limit.
        assert not shallow_enough(body, depth - 1)


def test_the_precheck_passes_a_large_produce_body_without_walking_it() -> None:
    body = orjson.dumps({"messages": [{"data": f"m{i}", "headers": {"k": "v"}} for i in range(10_000)]})

    assert shallow_enough(body, 32)
    assert nesting(orjson.loads(body), 32) == 4
