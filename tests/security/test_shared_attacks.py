"""Attacks by limited users on a shared cluster: the rules apply to shared queues exactly as to
local ones, on every node.

Three nodes with ``[auth]`` on. On each, the admin makes ``reader`` (``queue:read:orders``
alone) and ``dev`` (queues, handlers and subscriptions named ``dev-*``). The shared queues
``orders`` and ``payments`` and the local queue ``payroll`` (node 0) hold messages nobody
limited may touch. Every attack is tried against a shared queue and, where one exists, against
its local twin: the answers must be the same refusals, and nothing may change. A user cannot
turn a local queue shared or a shared one local (the name is taken), and a copy handler run as
a limited user reaches no shared queue its user could not read or write.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from support.shared import SharedRig
from support.shared_cluster import module_rig
from support.wait import until_blocking

pytestmark = pytest.mark.slow

ADMIN_PASSWORD = "admin-password-of-the-shared-cluster"
PASSWORDS = {
    "admin": ADMIN_PASSWORD,
    "reader": "reader-password",
    "dev": "dev-password",
    "copier": "copier-password",
}
RULES = {
    "reader": ["allow:queue:read:orders"],
    "dev": ["allow:handler:*:dev-*", "allow:queue:*:dev-*", "allow:subscription:*:dev-*/*"],
    # dev's rights, and a copy's cursor on any queue: only the queue's read right is missing.
    "copier": [
        "allow:handler:*:dev-*",
        "allow:queue:*:dev-*",
        "allow:subscription:*:dev-*/*",
        "allow:subscription:*:*/copy-to-dev-*",
    ],
}
AUTH = (
    '[auth]\nenabled = true\nbootstrap_user = "admin"\n'
    'bootstrap_password_env = "CAPELLA_SHARED_ADMIN_PASSWORD"\n'
)
NOTICE = 1.5


@dataclass
class Answer:
    status: int
    body: Any


def call(url: str, method: str, path: str, body: Any = None, *, user: str = "admin") -> Answer:
    headers = {"Authorization": "Basic " + base64.b64encode(f"{user}:{PASSWORDS[user]}".encode()).decode()}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(url + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30.0) as resp:
            raw, status = resp.read(), resp.status
    except urllib.error.HTTPError as exc:
        raw, status = exc.read(), exc.code
    try:
        return Answer(status, json.loads(raw) if raw else None)
    except ValueError:
        return Answer(status, raw)


def code(answer: Answer) -> tuple[int, str | None]:
    error = answer.body.get("error") if isinstance(answer.body, dict) else None
    return answer.status, None if error is None else error["code"]


FORBIDDEN = (403, "forbidden")


@pytest.fixture(scope="module")
def rig(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedRig]:
    rigs = module_rig(request, tmp_path_factory, extra=AUTH)
    with pytest.MonkeyPatch.context() as patch:
        # The nodes inherit this process's environment (support/servers.py ServerProcess).
        patch.setenv("CAPELLA_SHARED_ADMIN_PASSWORD", ADMIN_PASSWORD)
        built = next(rigs)
    try:
        for url in built.urls:
            for user, rules in RULES.items():
                made = call(url, "PUT", f"/v1/users/{user}", {"password": PASSWORDS[user], "rules": rules})
                assert made.status == 201, made.body
        first = built.urls[0]
        for name in ("orders", "payments", "dev-shared"):
            assert call(first, "PUT", f"/v1/queues/{name}", {"storage": "shared"}).status == 201
        assert call(first, "PUT", "/v1/queues/payroll", {}).status == 201  # node 0's own
        for name in ("orders", "payments", "payroll"):
            sent = {"messages": [{"data": f"{name} 1"}, {"data": f"{name} 2"}]}
            assert call(first, "POST", f"/v1/queues/{name}/messages?save=wait", sent).status == 200
        for url in built.urls:
            until_blocking(
                lambda url=url: all(
                    call(url, "GET", f"/v1/queues/{q}").status == 200
                    for q in ("orders", "payments", "dev-shared")
                ),
                NOTICE,
                "the shared queues on every node",
            )
        yield built
    finally:
        rigs.close()


def last_id(url: str, queue: str) -> int:
    answer = call(url, "GET", f"/v1/queues/{queue}")
    assert answer.status == 200, answer.body
    return int(answer.body["stats"]["last_id"])


def subscriptions(url: str, queue: str) -> list[str]:
    answer = call(url, "GET", f"/v1/queues/{queue}/subscriptions")
    assert answer.status == 200, answer.body
    return sorted(s["name"] for s in answer.body["subscriptions"])


def test_a_reader_of_orders_reads_it_on_every_node_and_can_do_nothing_else(rig: SharedRig) -> None:
    for url in rig.urls:
        read = call(url, "GET", "/v1/queues/orders/messages?after=0", user="reader")
        assert read.status == 200 and [m["data"] for m in read.body["messages"]] == ["orders 1", "orders 2"]
        # Produce to the queue it may read: refused, in every body form and save mode.
        for save in ("wait", "none", "immediate"):
            sent = call(
                url,
                "POST",
                f"/v1/queues/orders/messages?save={save}",
                {"messages": [{"data": "forged"}]},
                user="reader",
            )
            assert code(sent) == FORBIDDEN, sent.body
        # Change or drop it: refused.
        assert code(call(url, "PUT", "/v1/queues/orders", {"storage": "shared"}, user="reader")) == FORBIDDEN
        assert code(call(url, "DELETE", "/v1/queues/orders", user="reader")) == FORBIDDEN
        # Create a shared queue (or a local one): refused.
        for storage in ("shared", "local"):
            made = call(url, "PUT", "/v1/queues/orders-2", {"storage": storage}, user="reader")
            assert code(made) == FORBIDDEN, made.body
    for url in rig.urls:
        assert last_id(url, "orders") == 2
        assert call(url, "GET", "/v1/queues/orders-2").status == 404


@pytest.mark.parametrize("queue", ["payments", "payroll"])  # shared, and node 0's local twin
def test_a_queue_outside_the_pattern_cannot_be_read_in_any_form(rig: SharedRig, queue: str) -> None:
    urls = rig.urls if queue == "payments" else rig.urls[:1]
    for url in urls:
        for path in (
            f"/v1/queues/{queue}/messages?after=0",
            f"/v1/queues/{queue}/messages?after=0&wait=1",
            f"/v1/queues/{queue}/messages?after=0&segments=0-9",
            f"/v1/queues/{queue}/stream?after=0",
            f"/v1/queues/{queue}",
            f"/v1/queues/{queue}/subscriptions",
            f"/v1/queues/{queue}/subscriptions/orders/messages?commit=auto",
            f"/v1/queues/{queue}/replicas?id=1",
        ):
            for user in ("reader", "dev"):
                answer = call(url, "GET", path, user=user)
                assert code(answer) == FORBIDDEN, (url, path, user, answer.body)
        # A listing shows only what the caller may read.
        for user, visible in (("reader", {"orders"}), ("dev", {"dev-shared"})):
            listed = call(url, "GET", "/v1/queues", user=user)
            assert listed.status == 200
            assert {q["name"] for q in listed.body["queues"]} == visible, (user, listed.body)
    assert subscriptions(rig.urls[0], queue) == []


@pytest.mark.parametrize("queue", ["payments", "payroll"])
def test_a_user_cannot_commit_or_drop_a_cursor_of_another_queue(rig: SharedRig, queue: str) -> None:
    url = rig.urls[0]
    assert call(url, "PUT", f"/v1/queues/{queue}/subscriptions/audit", {"last_id": 1}).status == 201
    for target in rig.urls if queue == "payments" else [url]:
        for body in ({"last_id": 2}, {"last_id": 0, "reset": True}, {"replica": True}):
            answer = call(target, "PUT", f"/v1/queues/{queue}/subscriptions/audit", body, user="dev")
            assert code(answer) == FORBIDDEN, answer.body
        # Named like one of its own (dev-*): the queue is still not its.
        answer = call(target, "PUT", f"/v1/queues/{queue}/subscriptions/dev-mine", {"last_id": 2}, user="dev")
        assert code(answer) == FORBIDDEN, answer.body
        assert (
            code(call(target, "DELETE", f"/v1/queues/{queue}/subscriptions/audit", user="dev")) == FORBIDDEN
        )
    # Its own queue's cursors it may commit, through any node.
    assert call(
        rig.urls[1], "PUT", "/v1/queues/dev-shared/subscriptions/mine", {"last_id": 0}, user="dev"
    ).status in (
        200,
        201,
    )
    for target in rig.urls if queue == "payments" else [url]:
        sub = call(target, "GET", f"/v1/queues/{queue}/subscriptions/audit")
        assert sub.status == 200 and sub.body["last_id"] == 1, sub.body
        assert subscriptions(target, queue) == ["audit"]
    assert call(url, "DELETE", f"/v1/queues/{queue}/subscriptions/audit").status == 204


def test_a_user_cannot_turn_a_local_queue_shared_or_a_shared_queue_local(rig: SharedRig) -> None:
    first = rig.urls[0]
    assert call(first, "PUT", "/v1/queues/dev-ledger", {}, user="dev").status == 201  # node 0's own
    sent = {"messages": [{"data": "local entry"}]}
    assert call(first, "POST", "/v1/queues/dev-ledger/messages?save=wait", sent, user="dev").status == 200

    # The name is taken on its node: it cannot be redefined as shared there, by anyone.
    for user in ("dev", "admin"):
        answer = call(first, "PUT", "/v1/queues/dev-ledger", {"storage": "shared"}, user=user)
        assert code(answer) == (400, "invalid_request"), answer.body
        assert "is local: its storage cannot change" in answer.body["error"]["message"]
    # And a shared queue cannot be redefined local, through any node.
    for url in rig.urls:
        answer = call(url, "PUT", "/v1/queues/dev-shared", {"storage": "local"}, user="dev")
        assert code(answer) == (400, "invalid_request"), answer.body
        assert "is shared: its storage cannot change" in answer.body["error"]["message"]
        assert call(url, "GET", "/v1/queues/dev-shared", user="dev").body["definition"]["storage"] == "shared"

    # Through another node, whose local queues it cannot know, a shared dev-ledger can be made;
    # node 0 keeps serving its own local dev-ledger under that name, untouched by the shared one.
    made = call(rig.urls[1], "PUT", "/v1/queues/dev-ledger", {"storage": "shared"}, user="dev")
    assert made.status == 201, made.body
    sent = {"messages": [{"data": "shared entry"}]}
    assert (
        call(rig.urls[1], "POST", "/v1/queues/dev-ledger/messages?save=wait", sent, user="dev").status == 200
    )
    until_blocking(
        lambda: call(rig.urls[2], "GET", "/v1/queues/dev-ledger").status == 200,
        NOTICE,
        "dev-ledger on node 2",
    )
    on_first = call(first, "GET", "/v1/queues/dev-ledger/messages?after=0", user="dev")
    assert [m["data"] for m in on_first.body["messages"]] == ["local entry"]
    assert call(first, "GET", "/v1/queues/dev-ledger", user="dev").body["definition"]["storage"] == "local"
    on_third = call(rig.urls[2], "GET", "/v1/queues/dev-ledger/messages?after=0", user="dev")
    assert [m["data"] for m in on_third.body["messages"]] == ["shared entry"]
    # Dropping it on node 0 drops node 0's local queue, never the shared one.
    assert call(first, "DELETE", "/v1/queues/dev-ledger", user="dev").status == 204
    assert call(rig.urls[1], "DELETE", "/v1/queues/dev-ledger", user="dev").status == 204


def handler_status(url: str, name: str) -> dict[str, Any]:
    ran = call(url, "POST", f"/v1/handlers/{name}/run")
    assert ran.status == 200, ran.body
    status: dict[str, Any] = ran.body["status"]
    return status


@pytest.mark.parametrize("source", ["payments", "payroll"])
def test_a_copy_handler_of_a_limited_user_cannot_read_a_queue_its_user_cannot(
    rig: SharedRig, source: str
) -> None:
    url = rig.urls[0]
    name = f"dev-copy-{source}"
    target = f"dev-stolen-{source}"
    assert call(url, "PUT", f"/v1/queues/{target}", {}, user="copier").status == 201
    definition = {"type": "copy", "params": {"from": source, "to": target}, "started": False}
    defined = call(url, "PUT", f"/v1/handlers/{name}", definition, user="copier")
    # Defined (its queues are named in params), as for a local queue; every pass is refused:
    # copier may keep the copy's cursor on any queue, so the read right alone refuses it.
    assert defined.status == 201, defined.body
    status = handler_status(url, name)
    assert status["last_error"]["code"] == "forbidden", status
    assert call(url, "DELETE", f"/v1/handlers/{name}", user="copier").status == 204
    assert last_id(url, target) == 0
    assert "copy-to-" + target not in subscriptions(url, source)


@pytest.mark.parametrize("destination", ["payments", "payroll"])
def test_a_copy_handler_of_a_limited_user_cannot_write_a_queue_its_user_cannot(
    rig: SharedRig, destination: str
) -> None:
    url = rig.urls[0]
    name = f"dev-into-{destination}"
    before = last_id(url, destination)
    definition = {"type": "copy", "params": {"from": "dev-shared", "to": destination}, "started": False}
    sent = {"messages": [{"data": "planted"}]}
    assert call(url, "POST", "/v1/queues/dev-shared/messages?save=wait", sent, user="dev").status == 200
    defined = call(url, "PUT", f"/v1/handlers/{name}", definition, user="dev")
    # Defined (its queues are named in params), as for a local queue; every pass is refused.
    assert defined.status == 201, defined.body
    status = handler_status(url, name)
    assert status["last_error"]["code"] == "forbidden", status
    assert call(url, "DELETE", f"/v1/handlers/{name}", user="dev").status == 204
    assert last_id(url, destination) == before


def test_a_copy_handler_of_a_limited_user_copies_its_own_shared_queue(rig: SharedRig) -> None:
    """The other side of the two tests above: what the user may read and write, it copies."""
    url = rig.urls[2]
    assert call(url, "PUT", "/v1/queues/dev-backup", {}, user="dev").status == 201
    sent = {"messages": [{"data": "mine 1"}, {"data": "mine 2"}]}
    assert (
        call(rig.urls[1], "POST", "/v1/queues/dev-shared/messages?save=wait", sent, user="dev").status == 200
    )
    total = last_id(rig.urls[1], "dev-shared")
    until_blocking(lambda: last_id(url, "dev-shared") == total, NOTICE, "dev-shared's head on node 2")
    definition = {
        "type": "copy",
        "params": {"from": "dev-shared", "to": "dev-backup", "wait": 0},
        "started": False,
    }
    assert call(url, "PUT", "/v1/handlers/dev-backup-copy", definition, user="dev").status == 201
    status = handler_status(url, "dev-backup-copy")
    assert status.get("last_error") is None, status
    deadline = time.monotonic() + 10.0
    while last_id(url, "dev-backup") < total:
        assert time.monotonic() < deadline
        handler_status(url, "dev-backup-copy")
    copied = call(url, "GET", "/v1/queues/dev-backup/messages?after=0", user="dev")
    assert [m["data"] for m in copied.body["messages"]][-2:] == ["mine 1", "mine 2"]
    assert call(url, "DELETE", "/v1/handlers/dev-backup-copy", user="dev").status == 204
