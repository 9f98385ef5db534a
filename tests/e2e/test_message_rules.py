"""The same over-limit messages through every way in, against real servers with small limits.

``small`` runs with ``max_message_size = 1KiB`` and ``max_batch = 100`` and the original
protocol on; ``big`` runs with the defaults and holds what ``small`` must refuse. Each way in
(each ``/v1`` form, ``POST /cluster``, a copy from ``big``) gets the same messages: each is
refused in that way's error shape, and the queue's last id stays where it was (a refusal
stores nothing and uses up no id).
"""

from __future__ import annotations

import base64
import gzip
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.original import envelope
from support.servers import ServerProcess

from capella.records import record_batch

INT64_MAX = 2**63 - 1
BIG_PAYLOAD = "x" * 2048
LONG_SOURCE = "s" * 300
HUGE_SOURCE = "s" * 70_000
# (name, messages as /v1 JSON objects): each breaks one rule of ``small``.
OVER: list[tuple[str, list[dict[str, Any]]]] = [
    ("payload", [{"data": "ok"}, {"data": BIG_PAYLOAD}]),
    ("source", [{"data": "ok"}, {"data": "a", "source": LONG_SOURCE}]),
    ("huge source", [{"data": "a", "source": HUGE_SOURCE}]),
    ("batch", [{"data": str(i)} for i in range(101)]),
]
# What each case is refused with on /v1: status, code, and the message's index where one is named.
V1_REFUSAL = {
    "payload": (413, "payload_too_large", 1),
    "source": (400, "invalid_message", 1),
    "huge source": (400, "invalid_message", 0),
    "batch": (413, "payload_too_large", None),
}
INVALID = 10990006  # the original's envelope code for a refused request (capella/api/original/codes.py)


def config(tmp: Path, name: str, extra: str = "") -> Path:
    path = tmp / f"{name}.toml"
    path.write_text(f'[cluster]\nname = "{name}"\n[compat]\noriginal = true\n{extra}')
    return path


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    tmp = tmp_path_factory.mktemp("rules")
    limits = '[server]\nmax_message_size = "1KiB"\nmax_batch = 100\n'
    small = ServerProcess(tmp / "small", config=config(tmp, "small", limits))
    big = ServerProcess(tmp / "big", config=config(tmp, "big"))
    try:
        small.wait_ready()
        big.wait_ready()
        v1(small, "PUT", "/v1/clusters/far", {"url": big.url})
        v1(small, "PUT", "/v1/queues/q", {})
        v1(big, "PUT", "/v1/queues/src", {})
        yield small, big
    finally:
        small.stop()
        big.stop()


@pytest.fixture
def small(servers: tuple[ServerProcess, ServerProcess]) -> ServerProcess:
    """The server with small limits (1 KiB a message, 100 a batch)."""
    return servers[0]


def v1(
    server: ServerProcess,
    method: str,
    path: str,
    body: object = None,
    *,
    data: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    raw = data if data is not None else None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(server.url + path, data=raw, method=method)
    request.add_header("Content-Type", "application/json")
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            text = resp.read()
            return resp.status, json.loads(text) if text else None
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def last_id(server: ServerProcess, queue: str = "q") -> int:
    status, info = v1(server, "GET", f"/v1/queues/{queue}")
    assert status == 200
    return int(info["stats"]["last_id"])


def original(
    server: ServerProcess, action: str, body: object, queue: str = "q", gzipped: bool = False
) -> Any:
    """``POST /cluster`` with the original's envelope; its ``responce``."""
    sent = envelope(action, body, password=None, object_name=queue)
    data = json.dumps(sent).encode()
    request = urllib.request.Request(f"{server.url}/cluster", data=gzip.compress(data) if gzipped else data)
    request.add_header("Compress-Type", "gzip" if gzipped else "")
    with urllib.request.urlopen(request, timeout=60) as resp:
        answer = resp.read()
        if resp.headers.get("Compress-Type") == "gzip":
            answer = gzip.decompress(answer)
    return json.loads(answer)["responce"]


def as_original(message: dict[str, Any]) -> dict[str, Any]:
    shaped: dict[str, Any] = {"msg": base64.b64encode(message["data"].encode()).decode()}
    if "source" in message:
        shaped["src"] = message["source"]
    return shaped


def check_v1(case: str, status: int, answer: Any) -> None:
    want_status, code, index = V1_REFUSAL[case]
    assert (status, answer["error"]["code"]) == (want_status, code), answer
    if index is not None:
        assert answer["error"]["index"] == index


def stored_nothing(server: ServerProcess, before: int) -> None:
    """The queue's last id is where it was, and the next message gets the next id (none used up)."""
    assert last_id(server) == before
    status, answer = v1(server, "POST", "/v1/queues/q/messages", {"data": "probe"})
    assert status == 200 and answer["results"][0]["id"] == before + 1


@pytest.mark.parametrize(("case", "messages"), OVER, ids=[c for c, _ in OVER])
def test_every_v1_form_refuses_it(small: ServerProcess, case: str, messages: list[dict[str, Any]]) -> None:
    before = last_id(small)
    # JSON, a list and (for one message) the single object.
    check_v1(case, *v1(small, "POST", "/v1/queues/q/messages", {"messages": messages}))
    # NDJSON.
    ndjson = b"\n".join(json.dumps(m).encode() for m in messages)
    check_v1(
        case,
        *v1(
            small,
            "POST",
            "/v1/queues/q/messages",
            data=ndjson,
            headers={"Content-Type": "application/x-ndjson"},
        ),
    )
    # Delayed messages (scheduled: they would enter the log later).
    delayed = [{**m, "delay": "1h"} for m in messages]
    check_v1(case, *v1(small, "POST", "/v1/queues/q/messages", {"messages": delayed}))
    if case != "huge source":  # a record batch holds a source of at most 64 KiB; a URL less
        # A binary record batch, as the SDK sends it; and a body of two batches.
        batch = record_batch.encode(
            [m["data"].encode() for m in messages], sources=[m.get("source") for m in messages]
        )
        binary = {"Content-Type": "application/vnd.capella.batch"}
        check_v1(case, *v1(small, "POST", "/v1/queues/q/messages", data=batch, headers=binary))
        two = record_batch.encode([b"first"]) + batch
        status, answer = v1(small, "POST", "/v1/queues/q/messages", data=two, headers=binary)
        assert status == V1_REFUSAL[case][0], answer
    # Raw bytes, one message: its payload and its source in the query.
    last = messages[-1]
    if case not in ("batch", "huge source"):
        query = "" if "source" not in last else "?source=" + last["source"]
        status, answer = v1(
            small,
            "POST",
            f"/v1/queues/q/messages{query}",
            data=last["data"].encode(),
            headers={"Content-Type": "application/octet-stream"},
        )
        assert (status, answer["error"]["code"]) == V1_REFUSAL[case][:2], answer
    stored_nothing(small, before)


@pytest.mark.parametrize(("case", "messages"), OVER, ids=[c for c, _ in OVER])
def test_post_cluster_refuses_it_in_the_original_envelope(
    small: ServerProcess, case: str, messages: list[dict[str, Any]]
) -> None:
    before = last_id(small)
    shaped = [as_original(m) for m in messages]
    listed = original(small, "q_add_list", {"msgs": shaped, "sm": 1})
    assert listed["error"]["code"] == INVALID, listed
    assert listed["body"] == []
    unique = original(
        small, "q_add_unique_list", {"msgs": [{**m, "eid": i + 1} for i, m in enumerate(shaped)]}
    )
    assert unique["error"]["code"] == INVALID, unique
    if case != "batch":
        one = original(small, "q_add", {"msg": shaped[-1], "sm": 1})
        assert one["error"]["code"] == INVALID, one
        assert one["body"] == 0
        assert "struct" not in one["error"]["msg"]
    stored_nothing(small, before)


def test_a_small_gzip_body_of_300000_messages_is_refused_before_they_are_built(
    small: ServerProcess,
) -> None:
    before = last_id(small)
    started = time.monotonic()
    refused = original(small, "q_add_list", {"msgs": [{}] * 300_000}, gzipped=True)
    assert refused["error"]["code"] == INVALID, refused
    assert "300000 messages" in refused["error"]["msg"] and "limit is 100" in refused["error"]["msg"]
    assert time.monotonic() - started < 10
    stored_nothing(small, before)


def test_a_cursor_past_int64_is_refused_on_every_way_in(small: ServerProcess) -> None:
    for cursor in (2**64 - 1, INT64_MAX + 1):
        answer = original(small, "q_subs_set_last", {"sbscr": "far_out", "id": cursor, "sm": 1})
        assert answer["error"]["code"] == INVALID, answer
        status, refused = v1(small, "PUT", "/v1/queues/q/subscriptions/far_out", {"last_id": cursor})
        assert status == 400, refused
        assert v1(small, "GET", "/v1/queues/q/subscriptions/far_out")[0] == 404
    # int64's largest is a cursor like any other.
    assert original(small, "q_subs_set_last", {"sbscr": "edge", "id": INT64_MAX, "sm": 1})["error"] is None
    assert original(small, "q_subs_get_last", "edge")["body"] == INT64_MAX


def copy_once(small: ServerProcess, big: ServerProcess, name: str, messages: list[dict[str, Any]]) -> Any:
    """``messages`` stored on ``big`` (default limits), then one pass on ``small`` copying them to q."""
    v1(big, "PUT", f"/v1/queues/{name}", {})
    status, answer = v1(big, "POST", f"/v1/queues/{name}/messages", {"messages": messages})
    assert status == 200, answer
    definition = {"type": "copy", "params": {"from": f"far/{name}", "to": "q", "wait": 0}, "started": False}
    assert v1(small, "PUT", f"/v1/handlers/{name}", definition)[0] in (200, 201)
    status, ran = v1(small, "POST", f"/v1/handlers/{name}/run")
    assert status == 200, ran
    v1(small, "DELETE", f"/v1/handlers/{name}")
    return ran


def test_a_copy_from_another_cluster_refuses_it(servers: tuple[ServerProcess, ServerProcess]) -> None:
    small, big = servers
    # The source limit is the same everywhere; a payload limit is each server's own.
    before = last_id(small)
    ran = copy_once(small, big, "big-payload", OVER[0][1])
    assert ran["pass"]["ok"] is False, ran
    error = ran["status"]["last_error"]
    assert error["code"] == "payload_too_large" or "payload of 2048 bytes" in error["message"], error
    stored_nothing(small, before)


def test_a_copy_appends_a_long_read_as_several_batches(servers: tuple[ServerProcess, ServerProcess]) -> None:
    small, big = servers
    before = last_id(small)
    ran = copy_once(small, big, "long-read", OVER[3][1])  # 101 messages, max_batch 100
    assert ran["pass"]["ok"] is True, ran
    assert last_id(small) == before + 101
