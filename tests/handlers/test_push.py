"""The push handler against a real HTTP receiver on 127.0.0.1 that fails on purpose.

The receiver answers each message by a script (500, a slow answer past the timeout, 429 with
Retry-After, a connection reset, 400) and records every request it saw, in the order it saw
them; the tests check the ordering modes, retries, dead letters and signatures on that record.
"""

from __future__ import annotations

import asyncio
import email.utils
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import msgspec
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from support.receiver import Received, listening
from support.supervisor import build_push, launched, refused, started
from support.wait import until

from capella import metrics
from capella.api.app import SUPERVISOR, document
from capella.auth.rule import AccessRule, Identity
from capella.auth.secret import Secrets
from capella.config import Config, SecretSettings, parse_config
from capella.core.cluster import Cluster
from capella.core.message import Draft, SaveMode
from capella.errors import Forbidden, QueueNotFound
from capella.handlers.delivery import header_value, retry_after
from capella.handlers.push import PushHandler, policy_of, push_params
from capella.handlers.signature import sign, verify
from capella.links.reach import Reach
from capella.links.registry import Links
from capella.wire.params import decode_params
from capella.wire.push import PushParams

# Short everything: a retry waits 50 ms, a request 1 s at most (a slow answer takes 2 s).
FAST = {"delay": "50ms", "max_delay": "200ms", "jitter": 0, "timeout": "1s", "wait": 0}


@dataclass
class Receiver:
    """An aiohttp server that answers each message id by a script (then 200) and records requests."""

    url: str = ""
    script: dict[int, list[str]] = field(default_factory=dict)
    seen: list[Received] = field(default_factory=list)
    active: int = 0
    most_active: int = 0
    check: Callable[[web.Request, bytes], None] | None = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        ids = [int(i) for i in request.headers["Capella-Ids"].split(",")]
        if self.check is not None:
            self.check(request, body)
        steps = [self.script[i].pop(0) for i in ids if self.script.get(i)]
        answer = steps[0] if steps else "200"
        self.seen.append(Received(request.method, request.path_qs, dict(request.headers), body, answer))
        if answer == "slow":
            # The sender gave up after its timeout: this request no longer counts as in flight.
            await asyncio.sleep(2.0)
            return web.Response(text="too late")
        self.active += 1
        self.most_active = max(self.most_active, self.active)
        try:
            await asyncio.sleep(0.01)  # let concurrent requests overlap
            if answer == "reset":
                assert request.transport is not None
                request.transport.abort()
                return web.Response()
            if answer == "429":
                return web.Response(status=429, headers={"Retry-After": "1"}, text="slow down")
            if answer == "400":
                return web.Response(status=400, text='{"error": "no such customer"}\n' + "x" * 1000)
            if answer == "200-late":  # within the sender's timeout
                await asyncio.sleep(0.5)
                return web.Response(text="ok")
            return web.Response(status=int(answer), text="ok")
        finally:
            self.active -= 1

    def ok(self) -> list[int]:
        """Ids in the order the receiver answered them with a 2xx."""
        return [i for s in self.seen if s.answer.startswith("2") for i in s.ids]


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    rec = Receiver()
    async with listening(rec.handle, route="/hook") as port:
        rec.url = f"http://127.0.0.1:{port}/hook"
        yield rec


@pytest.fixture
def cluster_config(tmp_path: Path) -> Config:
    return parse_config({"cluster": {"name": "dc1", "data_dir": str(tmp_path / "data")}}, {}, base=tmp_path)


# Declared as an operator would in [secrets.NAME]; the definitions name them.
HOOK_SECRETS = {
    "hook-secret": SecretSettings(env="HOOK_SECRET"),
    "hook-token": SecretSettings(env="HOOK_TOKEN"),
    "hook-basic": SecretSettings(env="HOOK_BASIC"),
}


async def pusher(cluster: Cluster, receiver: Receiver, queue: str = "orders", **params: Any) -> PushHandler:
    reach = Reach(Links(cluster), Secrets(HOOK_SECRETS))
    _, handler = build_push(cluster, [queue], {"url": receiver.url, **FAST, **params}, "hook", reach)
    return handler


async def push_until_done(handler: PushHandler, passes: int = 20) -> None:
    """Passes until one ends with everything delivered or dead (a pass ends early then)."""
    for _ in range(passes):
        await handler.run_once()
        if not handler.status().lag:
            return
    raise AssertionError(f"not done after {passes} passes: {handler.status()}")


async def produce(cluster: Cluster, queue: str, count: int, segments: int = 1) -> None:
    q = (
        cluster.queue(queue)
        if queue in {x.name for x in cluster.queues()}
        else (await cluster.put_queue(queue, {}))[0]
    )
    await q.append([Draft(f"m{i}".encode(), segment=i % segments) for i in range(count)], SaveMode.WAIT)


async def test_batch_1_sends_the_payload_with_its_metadata_as_headers(
    cluster: Cluster, receiver: Receiver
) -> None:
    q, _ = await cluster.put_queue("orders", {})
    await q.append(
        [
            Draft(
                b'{"order": 1}',
                source="shop",
                external_id=77,
                external_time=1_700_000_000.5,
                segment=3,
                headers={"content-type": "application/json", "kind": "new ✓"},
            ),
            Draft(b"\xff\x00raw"),
        ],
        SaveMode.WAIT,
    )
    handler = await pusher(cluster, receiver, headers={"X-Team": "billing"})
    await push_until_done(handler)
    first, second = receiver.seen
    assert first.body == b'{"order": 1}' and second.body == b"\xff\x00raw"
    h = first.headers
    assert (h["Capella-Id"], h["Capella-Ids"], h["Idempotency-Key"]) == ("1", "1", "shop:77")
    assert (h["Capella-Source"], h["Capella-Segment"], h["Capella-External-Id"]) == ("shop", "3", "77")
    assert float(h["Capella-External-Time"]) == 1_700_000_000.5
    assert h["Content-Type"] == "application/json" and h["X-Team"] == "billing"
    assert h["Capella-Header-kind"] == "new %E2%9C%93" and h["Capella-Attempt"] == "1"
    assert h["Capella-Queue"] == "orders"
    assert second.headers["Idempotency-Key"] == "dc1:2"
    assert second.headers["Content-Type"] == "application/octet-stream"
    assert "Capella-Signature" not in h and "Authorization" not in h
    status = msgspec.to_builtins(handler.status())  # as the API renders it
    assert (status["delivered"], status["failed"], status["dead"], status["lag"]) == (2, 0, 0, 0)
    assert q.subscription("push-hook").last_id == 2  # acked: the cursor of the ack-mode subscription


async def test_batch_100_sends_json_arrays_in_id_order(cluster: Cluster, receiver: Receiver) -> None:
    await produce(cluster, "orders", 250)
    handler = await pusher(cluster, receiver, batch=100, concurrency=2)
    await push_until_done(handler)
    sizes = sorted(len(s.ids) for s in receiver.seen)
    assert sizes == [50, 100, 100]
    for s in receiver.seen:
        items = orjson.loads(s.body)
        assert [m["id"] for m in items] == s.ids == sorted(s.ids)
        assert s.headers["Content-Type"] == "application/json"
        assert (
            items[0]["idempotency_key"] == f"dc1:{items[0]['id']}"
            and items[0]["data"] == f"m{items[0]['id'] - 1}"
        )
        assert {"time", "source", "external_id", "external_time", "segment", "headers", "attempt"} <= set(
            items[0]
        )
    assert sorted(receiver.ok()) == list(range(1, 251))


async def test_failures_are_retried_by_the_policy_and_honour_retry_after(
    cluster: Cluster, receiver: Receiver
) -> None:
    await produce(cluster, "orders", 6)
    receiver.script = {1: ["500", "500"], 2: ["slow"], 3: ["429"], 4: ["reset"], 5: ["400"], 6: ["503"]}
    handler = await pusher(cluster, receiver, concurrency=6)
    await push_until_done(handler)
    assert sorted(receiver.ok()) == [1, 2, 3, 4, 5, 6]
    attempts = {i: [s.answer for s in receiver.seen if i in s.ids] for i in range(1, 7)}
    assert attempts == {
        1: ["500", "500", "200"],
        2: ["slow", "200"],
        3: ["429", "200"],
        4: ["reset", "200"],
        5: ["400", "200"],
        6: ["503", "200"],
    }
    # 429 said Retry-After: 1, far more than the 50 ms backoff.
    times = [s.at for s in receiver.seen if 3 in s.ids]
    assert times[1] - times[0] >= 0.9
    # The second try of 2 came after its first timed out (1 s), not after the slow answer.
    times = [s.at for s in receiver.seen if 2 in s.ids]
    assert 0.9 <= times[1] - times[0] < 1.9
    # The last attempt of each is numbered.
    last = [s for s in receiver.seen if 1 in s.ids][-1]
    assert last.headers["Capella-Attempt"] == "3"
    status = msgspec.to_builtins(handler.status())  # as the API renders it
    assert status["failed"] == 7 and status["delivered"] == 6 and status["retrying"] == 0
    assert handler.counters.requests["timeout"] == 1 and handler.counters.requests["connection"] == 1
    assert status["last_delivery_error"] is not None


async def test_what_is_refused_for_good_goes_to_the_dead_letters(
    cluster: Cluster, receiver: Receiver
) -> None:
    await produce(cluster, "orders", 5)
    await cluster.put_queue("orders.dead", {})
    receiver.script = {2: ["400"] * 3, 4: ["500"] * 3}
    handler = await pusher(cluster, receiver, max_attempts=3, dead_letter="orders.dead", ordering="ordered")
    await push_until_done(handler)
    assert receiver.ok() == [1, 3, 5]
    dead = (await cluster.queue("orders.dead").read_after(0, 100)).messages
    assert [m.payload for m in dead] == [b"m1", b"m3"]
    h = dead[0].headers
    assert h["capella-attempts"] == "3" and h["capella-dead-id"] == "2"
    assert h["capella-last-error"].startswith('HTTP 400 Bad Request: {"error": "no such customer"} xxx')
    assert len(h["capella-last-error"]) < 320  # the first bytes of the answer, not all of it
    assert dead[1].headers["capella-last-error"].startswith("HTTP 500")
    assert handler.status().dead == 2
    error = handler.status().last_delivery_error
    assert error is not None and error.status == 500


def in_order_of_acks(receiver: Receiver, group: Callable[[int], int]) -> None:
    """No request carried a message before every earlier message of its group was answered 2xx."""
    done: set[int] = set()
    every = {i for s in receiver.seen for i in s.ids}
    for s in sorted(receiver.seen, key=lambda s: s.at):
        for i in s.ids:
            earlier = {j for j in every if j < i and group(j) == group(i)}
            assert earlier <= done | set(s.ids), f"{i} sent before {sorted(earlier - done)} was acked"
        if s.answer.startswith("2"):
            done.update(s.ids)


@pytest.mark.parametrize("batch", [1, 3])
async def test_ordered_never_sends_n_plus_1_before_n_is_acked(
    cluster: Cluster, receiver: Receiver, batch: int
) -> None:
    await produce(cluster, "orders", 30)
    receiver.script = {3: ["500", "500"], 10: ["reset"], 17: ["slow"], 25: ["429"]}
    handler = await pusher(cluster, receiver, ordering="ordered", batch=batch, concurrency=8)
    await push_until_done(handler)
    assert receiver.most_active == 1
    in_order_of_acks(receiver, lambda i: 0)
    assert receiver.ok() == list(range(1, 31))


@pytest.mark.parametrize("batch", [1, 2])
async def test_by_segment_keeps_order_within_each_segment_only(
    cluster: Cluster, receiver: Receiver, batch: int
) -> None:
    await produce(cluster, "orders", 40, segments=4)
    segment = {i: (i - 1) % 4 for i in range(1, 41)}
    receiver.script = {2: ["500", "500", "500"], 7: ["slow"], 12: ["reset"]}
    handler = await pusher(cluster, receiver, ordering="by_segment", concurrency=4, batch=batch)
    await push_until_done(handler)
    in_order_of_acks(receiver, segment.__getitem__)
    assert sorted(receiver.ok()) == list(range(1, 41))
    assert 1 < receiver.most_active <= 4
    # Segment 1 was held up by message 2 while the others went on.
    assert receiver.ok().index(2) > receiver.ok().index(4)
    with pytest.raises(AssertionError):
        in_order_of_acks(receiver, lambda i: 0)  # not in order across segments


async def test_unordered_keeps_several_requests_in_flight(cluster: Cluster, receiver: Receiver) -> None:
    await produce(cluster, "orders", 40)
    receiver.script = {5: ["500"]}
    handler = await pusher(cluster, receiver, concurrency=8)
    await push_until_done(handler)
    assert sorted(receiver.ok()) == list(range(1, 41))
    assert 1 < receiver.most_active <= 8
    assert receiver.ok().index(5) > receiver.ok().index(6)  # 6 did not wait for 5


async def test_a_segment_filter_sends_only_those_segments(cluster: Cluster, receiver: Receiver) -> None:
    await produce(cluster, "orders", 20, segments=4)
    handler = await pusher(cluster, receiver, segments=[[1, 2]])
    await push_until_done(handler)
    assert sorted(receiver.ok()) == [i for i in range(1, 21) if (i - 1) % 4 in (1, 2)]
    assert cluster.queue("orders").subscription("push-hook").last_id == 20
    assert handler.counters.skipped == 10


async def test_signed_requests_verify_and_a_tampered_body_does_not(
    cluster: Cluster, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOOK_SECRET", "s3cr3t")
    monkeypatch.setenv("HOOK_TOKEN", "tok-123")
    results: list[bool] = []

    def check(request: web.Request, body: bytes) -> None:
        header = request.headers["Capella-Signature"]
        results.append(verify(b"s3cr3t", body, header, now=time.time()))
        results.append(not verify(b"s3cr3t", body + b" ", header, now=time.time()))
        results.append(not verify(b"other", body, header, now=time.time()))
        assert request.headers["Authorization"] == "Bearer tok-123"

    receiver.check = check
    await produce(cluster, "orders", 3)
    handler = await pusher(cluster, receiver, secret="hook-secret", token="hook-token", batch=2)
    await push_until_done(handler)
    assert len(results) == 6 and all(results)
    shown = msgspec.to_builtins(handler.params)  # as the API renders it
    assert "s3cr3t" not in str(shown) and "tok-123" not in str(shown)


def test_a_signature_is_refused_when_stale_or_malformed() -> None:
    header = sign(b"k", b"body", 1_700_000_000)
    assert verify(b"k", b"body", header, now=1_700_000_100)
    assert not verify(b"k", b"body", header, now=1_700_000_000 + 301)  # replayed too late
    assert not verify(b"k", b"body", header, now=1_700_000_000 - 301)
    assert not verify(b"k", b"body", header.replace("t=1700000000", "t=1700000001"), now=1_700_000_000)
    assert not verify(b"k", b"body", "v1=abc", now=1_700_000_000)
    assert not verify(b"k", b"body", "t=x,v1=abc", now=1_700_000_000)


async def test_basic_credentials_come_from_a_declared_secret(
    cluster: Cluster, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOOK_BASIC", "capella:pa:ss")
    await produce(cluster, "orders", 1)
    handler = await pusher(cluster, receiver, basic="hook-basic")
    await push_until_done(handler)
    assert receiver.seen[0].headers["Authorization"] == "Basic Y2FwZWxsYTpwYTpzcw=="


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({}, "params.url"),
        ({"url": "ftp://x"}, "params.url"),
        ({"url": "http://u:p@x/"}, "params.url"),
        ({"url": "http://x", "ordering": "sorted"}, "params.ordering"),
        ({"url": "http://x", "batch": 0}, "params.batch"),
        ({"url": "http://x", "concurrency": 5000}, "params.concurrency"),
        ({"url": "http://x", "timeout": 0}, "params.timeout"),
        ({"url": "http://x", "max_attempts": -1}, "params.max_attempts"),
        ({"url": "http://x", "backoff": "linear"}, "params.backoff"),
        ({"url": "http://x", "dead_letter": "nowhere"}, "params.dead_letter"),
        ({"url": "http://x", "dead_letter": "orders"}, "params.dead_letter"),
        ({"url": "http://x", "secret_env": "CAPELLA_TEST_UNSET_VARIABLE"}, "params.secret_env"),
        ({"url": "http://x", "secret": "undeclared"}, "params.secret"),
        ({"url": "http://x", "token": "A", "basic": "B"}, "params.basic"),
        ({"url": "http://x", "headers": {"Authorization": "Bearer x"}}, "params.headers"),
        ({"url": "http://x", "headers": {"X-Bad": "a\r\nb"}}, "params.headers"),
        ({"url": "http://x", "segments": [[3, 1]]}, "params.segments"),
        ({"url": "http://x", "colour": "red"}, "params.colour"),
    ],
)
async def test_bad_push_definitions_are_refused(
    cluster: Cluster, params: dict[str, object], field: str
) -> None:
    await cluster.put_queue("orders", {})
    async with started(cluster) as supervisor:
        error = await refused(supervisor, "p", {"type": "push", "queue": "orders", "params": params})
        assert error.details.get("field") == field
        error = await refused(
            supervisor, "p", {"type": "push", "queues": ["ord*"], "params": {"url": "http://x"}}
        )
        assert error.details.get("field") == "queue"


def test_params_round_trip_through_their_stored_form() -> None:
    params = push_params(
        decode_params(
            PushParams,
            {
                "url": "https://example.com/h",
                "batch": 10,
                "ordering": "by_segment",
                "max_attempts": 0,
                "delay": "2s",
                "segments": [[1, 4]],
                "headers": {"X-A": "b"},
            },
        ),
        "h",
    )
    assert push_params(decode_params(PushParams, msgspec.to_builtins(params)), "h") == params
    assert params.subscription == "push-h" and policy_of(params).max_attempts == 0


async def test_a_push_handler_over_http_shows_its_status_and_metrics(
    api: TestClient[web.Request, web.Application], receiver: Receiver
) -> None:
    assert (await api.put("/v1/queues/orders", json={})).status == 201
    receiver.script = {2: ["503"]}
    body = {"type": "push", "queue": "orders", "params": {"url": receiver.url, **FAST, "wait": "1s"}}
    resp = await api.put("/v1/handlers/hook", json=body)
    assert resp.status == 201, await resp.text()
    info = await resp.json()
    schema = {"$ref": "#/components/schemas/HandlerInfo", "components": document()["components"]}
    assert jsonschema.Draft202012Validator(schema).is_valid(info)
    assert info["params"]["subscription"] == "push-hook" and info["params"]["ordering"] == "unordered"
    resp = await api.post(
        "/v1/queues/orders/messages", json={"messages": [{"data": f"m{i}"} for i in range(3)]}
    )
    assert resp.status == 200

    async def all_delivered() -> bool:
        nonlocal info
        info = await (await api.get("/v1/handlers/hook")).json()
        return bool(info["status"]["delivered"] == 3)

    await until(all_delivered, what="three messages delivered")
    status = info["status"]
    assert (status["delivered"], status["failed"], status["dead"], status["lag"]) == (3, 1, 0, 0)
    assert status["last_delivery_error"]["status"] == 503
    assert status["last_delivery_error"]["message"].startswith("HTTP 503 Service Unavailable")
    assert jsonschema.Draft202012Validator(schema).is_valid(info)
    metrics = await (await api.get("/metrics")).text()
    labels = 'handler="hook",queue="orders"'
    assert f"capella_push_delivered_total{{{labels}}} 3" in metrics
    assert f"capella_push_failed_total{{{labels}}} 1" in metrics
    assert f'capella_push_requests_total{{{labels},outcome="5xx"}} 1' in metrics
    assert f"capella_push_delivery_seconds_count{{{labels}}} 3" in metrics
    resp = await api.put("/v1/handlers/bad", json={**body, "params": {"url": receiver.url, "batch": "many"}})
    assert resp.status == 400
    error = (await resp.json())["error"]
    assert error["code"] == "invalid_request" and error["field"] == "params.batch"


async def test_a_pass_cut_short_is_taken_back_and_sent_again(cluster: Cluster, receiver: Receiver) -> None:
    await produce(cluster, "orders", 3)
    receiver.script = {1: ["slow"]}
    handler = await pusher(cluster, receiver, ordering="ordered", timeout="5s")
    task = asyncio.create_task(handler.run_once())
    await until(lambda: receiver.seen, what="the first request")
    assert handler.status().in_flight == 1
    task.cancel()  # as a stop (or a crash) does, with message 1 in flight
    with pytest.raises(asyncio.CancelledError):
        await task
    assert handler.status().in_flight == 0
    await push_until_done(handler)
    assert receiver.ok() == [1, 2, 3]
    again = [s for s in receiver.seen if 1 in s.ids][1]
    assert again.headers["Capella-Attempt"] == "2"  # the cut request counted as an attempt


async def test_a_pass_fails_without_the_rights_or_the_queue(cluster: Cluster, receiver: Receiver) -> None:
    await produce(cluster, "orders", 1)
    handler = await pusher(cluster, receiver)
    handler.identity = Identity("reader", rules=(AccessRule("allow", "queue", "read", "orders"),))
    with pytest.raises(Forbidden, match="subscription"):
        await handler.run_once()
    assert not receiver.seen
    handler.identity = Identity("ops", admin=True)
    await cluster.drop_queue("orders")
    with pytest.raises(QueueNotFound):
        await handler.run_once()


async def test_a_definition_whose_secret_is_gone_after_a_restart_says_so(
    cluster: Cluster, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    await cluster.put_queue("orders", {})
    monkeypatch.setenv("HOOK_SECRET", "s")
    supervisor = await launched(cluster, secrets=Secrets(HOOK_SECRETS))
    definition = {
        "type": "push",
        "queue": "orders",
        "params": {"url": receiver.url, "secret": "hook-secret"},
    }
    await supervisor.put("hook", {**definition, "started": False})
    await supervisor.close()
    monkeypatch.delenv("HOOK_SECRET")
    supervisor = await launched(cluster, secrets=Secrets(HOOK_SECRETS))
    try:
        state = await supervisor.run_now("hook")
        assert state.last_error is not None and "'hook-secret' cannot be used" in state.last_error.message
        assert msgspec.to_builtins(state.info())["params"]["secret"] == "hook-secret"  # kept as it was
        # The metrics page still renders: a definition that did not load has no push counters.
        text = metrics.render(cluster, supervisor.handlers())
        assert 'capella_handler_error{handler="hook"' in text
        assert 'capella_push_delivered_total{handler="hook"' not in text
    finally:
        await supervisor.close()


def test_retry_after_takes_seconds_or_a_date_and_is_capped() -> None:
    now = 1_700_000_000.0
    assert retry_after("7", now) == 7.0
    assert retry_after(email.utils.formatdate(now + 30, usegmt=True), now) == 30.0
    assert retry_after(email.utils.formatdate(now - 30, usegmt=True), now) == 0.0
    assert retry_after("999999", now) == 3600.0
    assert retry_after("soon", now) is None and retry_after(None, now) is None
    assert header_value("100% ✓\r\n") == "100%25 %E2%9C%93%0D%0A"


async def test_a_deleted_subscription_is_defined_again_and_starts_over(
    cluster: Cluster, receiver: Receiver
) -> None:
    await produce(cluster, "orders", 2)
    handler = await pusher(cluster, receiver)
    await push_until_done(handler)
    await cluster.queue("orders").delete_subscription("push-hook")
    await produce(cluster, "orders", 1)
    await push_until_done(handler)
    assert sorted(receiver.ok()) == [1, 1, 2, 2, 3]
    assert cluster.queue("orders").subscription("push-hook").last_id == 3


async def test_a_push_handler_waiting_for_messages_stops_at_once_and_one_in_flight_finishes(
    api: TestClient[web.Request, web.Application], receiver: Receiver
) -> None:
    assert (await api.put("/v1/queues/orders", json={})).status == 201
    supervisor = api.server.app[SUPERVISOR]
    body = {"type": "push", "queue": "orders", "params": {"url": receiver.url, **FAST, "wait": "30s"}}
    loop = asyncio.get_running_loop()
    assert (await api.put("/v1/handlers/hook", json=body)).status == 201
    state = supervisor.handler("hook")
    await until(lambda: state.running and state.handler.interruptible, what="the pass's long poll")
    started = loop.time()
    assert (await api.post("/v1/handlers/hook/stop")).status == 200
    assert loop.time() - started < 1.0  # nothing in flight: no grace to sit out
    # With a request in flight the stop waits for its answer, and the pass ends there.
    receiver.script = {1: ["200-late"]}
    assert (await api.post("/v1/queues/orders/messages", json={"messages": [{"data": "m"}]})).status == 200
    assert (await api.post("/v1/handlers/hook/start")).status == 200
    await until(lambda: receiver.seen, what="the first request")
    assert not state.handler.interruptible
    started = loop.time()
    assert (await api.post("/v1/handlers/hook/stop")).status == 200
    assert loop.time() - started < 2.0  # the answer's 0.5 s, then no long poll after it
    assert receiver.ok() == [1] and state.handler.status().delivered == 1
    assert not state.running and not state.handler.stopping
