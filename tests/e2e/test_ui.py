"""The web console in a real browser: headless Chromium from Debian (``make tools`` installs it),
driven by Playwright, against real ``capella serve`` processes holding data.

Every page is clicked through and what it shows is checked against the API; screenshots go
to ``tmp_path`` (never into git). A page on another origin reads the stream with
``EventSource`` and resumes after the server restarts, with ``Last-Event-ID``.
"""

from __future__ import annotations

import base64
import json
import os
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect
from support.browser import PageServer, chromium, needs_chromium
from support.servers import ServerProcess, running
from support.wait import until_blocking

pytestmark = [needs_chromium, pytest.mark.slow]

# A payload that would run if the console ever put message text into the DOM as HTML.
HOSTILE = '<img src=x onerror="document.body.dataset.pwned=1">'
ADMIN_PASSWORD = "console-admin-password"


class Api:
    """The broker's API over urllib, as the tests' source of truth."""

    def __init__(self, url: str, auth: str | None = None) -> None:
        self.url = url
        self.auth = auth

    def __call__(self, method: str, path: str, body: Any = None, expect_status: int | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if self.auth:
            request.add_header("Authorization", self.auth)
        try:
            with urllib.request.urlopen(request, timeout=10) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            with exc:
                status, raw = exc.code, exc.read()
        if expect_status is not None:
            assert status == expect_status, (method, path, status, raw)
        elif status >= 400:
            raise AssertionError(f"{method} {path}: {status} {raw!r}")
        return json.loads(raw) if raw else None


def seed(api: Api) -> None:
    """Queues with blocks on two tiers' worth of data, a copy handler, a failing one, a work
    queue with a failed and a dead message, and a scheduled message."""
    tiers = {"marks": {"0": "default", "1": "cold"}}
    api("PUT", "/v1/queues/orders", {"block": {"max_messages": 5}, "mounts": tiers})
    api("PUT", "/v1/queues/copied", {})
    api("PUT", "/v1/queues/jobs", {})
    api("PUT", "/v1/queues/jobs.dead", {})
    messages = [
        {
            "data": json.dumps({"customer": {"id": i % 3}, "n": i, "tags": ["a", "b"] if i == 5 else []}),
            "source": "shop" if i % 2 else "web",
            "headers": {"kind": "even" if i % 2 == 0 else "odd"},
            "segment": i % 4,
        }
        for i in range(1, 13)
    ]
    messages.append({"data": HOSTILE, "source": "evil"})
    api("POST", "/v1/queues/orders/messages", {"messages": messages})
    api("PUT", "/v1/handlers/flush-all", {"type": "flush", "queues": ["*"]})
    # The sealed blocks move to tier 1 (a compressed mount); the open one stays.
    archive = {"conditions": [{"mark": 1, "from_age": 0}]}
    api("PUT", "/v1/handlers/archive", {"type": "archive", "queue": "orders", "params": archive})

    def archived() -> bool:
        if "1" in api("GET", "/v1/queues/orders")["stats"]["blocks"]["by_mark"]:
            return True
        # Blocks are sealed in the background: move them once they are.
        api("POST", "/v1/handlers/archive/run")
        return False

    until_blocking(archived, every=0.05, what="blocks archived to tier 1")
    api("PUT", "/v1/handlers/orders-copy", {"type": "copy", "queue": "orders", "params": {"to": "copied"}})
    api("POST", "/v1/handlers/orders-copy/run")
    api("PUT", "/v1/queues/orders/subscriptions/billing", {"last_id": 4})
    # An external cluster nobody answers: its ping fails, and a copy handler through it fails its passes.
    api("PUT", "/v1/clusters/dc2", {"url": "http://127.0.0.1:9", "connect_timeout": "1s", "timeout": "1s"})
    api("PUT", "/v1/handlers/to-dc2", {"type": "copy", "queue": "copied", "params": {"to": "dc2/orders"}})
    api("POST", "/v1/handlers/to-dc2/run")
    policy = {"max_attempts": 2, "delay": "1h", "max_delay": "1h", "jitter": 0, "dead_letter": "jobs.dead"}
    api("PUT", "/v1/queues/jobs/subscriptions/workers", {"mode": "ack", "policy": policy})
    api("POST", "/v1/queues/jobs/messages", {"messages": [{"data": f"job {i}"} for i in range(1, 5)]})
    claimed = api("POST", "/v1/queues/jobs/subscriptions/workers/claim?limit=2")["messages"]
    api(
        "POST",
        "/v1/queues/jobs/subscriptions/workers/nack",
        {"receipt": claimed[0]["receipt"], "error": "boom"},
    )
    # The second one fails twice: its second failure is its last attempt, so it dies.
    api("POST", "/v1/queues/jobs/subscriptions/workers/nack", {"receipt": claimed[1]["receipt"], "delay": 0})
    again = api("POST", "/v1/queues/jobs/subscriptions/workers/claim?limit=1")["messages"]
    assert again[0]["id"] == claimed[1]["id"], again
    api(
        "POST",
        "/v1/queues/jobs/subscriptions/workers/nack",
        {"receipt": again[0]["receipt"], "error": "fatal"},
    )
    api("POST", "/v1/queues/orders/messages", {"data": "later", "delay": "1h", "source": "cron"})


@pytest.fixture(scope="module")
def origin() -> Iterator[PageServer]:
    server = PageServer()
    yield server
    server.close()


def config(tmp: Path, origin: str, auth: bool = False) -> Path:
    path = tmp / ("auth.toml" if auth else "open.toml")
    text = f'[server.cors]\norigins = ["{origin}"]\n'
    text += '[mounts.default]\nprovider = "file"\npath = "queues"\n'
    text += '[mounts.cold]\nprovider = "file"\npath = "cold"\ncompression = "zstd"\n'
    if auth:
        text += '[auth]\nenabled = true\nbootstrap_user = "admin"\nbootstrap_password_env = "CONSOLE_ADMIN"\n'
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, origin: PageServer) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("console")
    for process in running(ServerProcess(tmp / "data", config=config(tmp, origin.url))):
        seed(Api(process.url))
        yield process


@pytest.fixture(scope="module")
def server_api(server: ServerProcess) -> Api:
    return Api(server.url)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as browser:
        yield browser


@pytest.fixture
def page(browser: Browser, tmp_path: Path) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.set_default_timeout(10_000)
    yield page
    page.screenshot(path=str(tmp_path / "final.png"), full_page=True)
    context.close()
    assert not errors, errors


def num(n: int) -> str:
    return f"{n:,}"


def iso(t: float) -> str:
    """A time as the console writes it (dom.js ``time``)."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def failing_since(status: dict[str, Any]) -> float:
    """When a handler's failures began; before the API had ``failing_since``, its last error."""
    since = status.get("failing_since", status["last_error"]["time"] if status["last_error"] else None)
    assert since is not None, status
    return float(since)


def row(page: Page, testid: str, text: str) -> Any:
    return page.get_by_test_id(testid).locator("tbody tr").filter(has_text=text)


# --- overview ------------------------------------------------------------------------------


def test_overview_shows_each_queue_and_the_failing_handlers(
    page: Page, server_api: Api, server: ServerProcess, tmp_path: Path
) -> None:
    page.goto(f"{server.url}/ui/?sample=0.3")
    queues = {q["name"]: q["stats"] for q in server_api("GET", "/v1/queues")["queues"]}
    table = page.get_by_test_id("queues")
    expect(table.locator("tbody tr")).to_have_count(len(queues))
    for name, stats in queues.items():
        line = table.locator("tbody tr").filter(has=page.get_by_role("link", name=name, exact=True))
        expect(line.get_by_test_id("messages")).to_have_text(num(stats["messages"]))
    by_mark = queues["orders"]["blocks"]["by_mark"]
    orders = table.locator("tbody tr").filter(has=page.get_by_role("link", name="orders", exact=True))
    expect(orders).to_contain_text(", ".join(f"tier {m}: {n}" for m, n in sorted(by_mark.items())))
    failing = [h for h in server_api("GET", "/v1/handlers")["handlers"] if h["status"]["last_error"]]
    assert [h["name"] for h in failing] == ["to-dc2"]
    expect(row(page, "failing", "to-dc2")).to_contain_text(failing[0]["status"]["last_error"]["message"][:40])
    expect(page.get_by_test_id("card-failing")).to_have_text("1")
    expect(row(page, "failing", "to-dc2").get_by_test_id("failing-since")).to_contain_text("ago")
    page.screenshot(path=str(tmp_path / "overview.png"), full_page=True)
    # The charts fill as the page samples: a produced batch shows as a produce rate.
    server_api("POST", "/v1/queues/copied/messages", {"messages": [{"data": "x"}] * 3})
    expect(orders.locator("svg.spark").first).not_to_have_attribute("data-points", re.compile(r"^[01]$"))


# --- a queue -------------------------------------------------------------------------------


def test_queue_page_blocks_subscriptions_tail_produce_and_find(
    page: Page, server_api: Api, server: ServerProcess, tmp_path: Path
) -> None:
    page.goto(f"{server.url}/ui/#/queue/orders")
    stats = server_api("GET", "/v1/queues/orders")["stats"]
    expect(page.get_by_test_id("stat-messages")).to_have_text(num(stats["messages"]))
    blocks = server_api("GET", "/v1/queues/orders/blocks")["blocks"]
    expect(page.locator("svg.blocks rect.tier")).to_have_count(len(blocks))
    moved = [b for b in blocks if b["state"] == "sealed" and b["mark"] == 1]
    assert moved and len(moved) == stats["blocks"]["by_mark"]["1"]
    expect(row(page, "tiers", "tier 1").get_by_test_id("tier-blocks")).to_have_text(str(len(moved)))
    expect(page.locator("svg.blocks rect.tier1")).to_have_count(len(moved))
    for sub in server_api("GET", "/v1/queues/orders/subscriptions")["subscriptions"]:
        expect(row(page, "subscriptions", sub["name"]).get_by_test_id("lag")).to_have_text(num(sub["lag"]))

    # The tail shows the last ten messages, then a message produced from the page.
    page.get_by_test_id("tail-toggle").click()
    expect(page.get_by_test_id("tail-state")).to_have_text("live")
    expect(page.locator(f'[data-testid=tail] tr[data-id="{stats["last_id"]}"]')).to_contain_text(HOSTILE)
    page.get_by_test_id("produce-data").fill('{"customer": {"id": 7}, "note": "from the console"}')
    page.get_by_test_id("produce-source").fill("console")
    page.get_by_test_id("produce-headers").fill("kind=test")
    page.get_by_test_id("produce-send").click()
    expect(page.get_by_test_id("produce-result")).to_contain_text("stored as id")
    new_id = int(page.get_by_test_id("produce-result").inner_text().split()[3])
    stored = server_api("GET", f"/v1/queues/orders/messages?after={new_id - 1}&limit=1")["messages"][0]
    assert (stored["id"], stored["source"], stored["headers"]) == (new_id, "console", {"kind": "test"})
    expect(page.locator(f'[data-testid=tail] tr[data-id="{new_id}"]')).to_contain_text("from the console")
    page.screenshot(path=str(tmp_path / "queue.png"), full_page=True)

    # Find: what the page finds is what the API holds, filtered as the work filter would.
    every = server_api("GET", "/v1/queues/orders/messages?limit=1000")["messages"]

    def find(**fields: str) -> list[int]:
        for name in ("from", "to", "source", "segments", "header", "json"):
            page.get_by_test_id(f"find-{name}").fill(fields.get(name, ""))
        page.get_by_test_id("find-go").click()
        expect(page.get_by_test_id("find-status")).to_contain_text("found")
        results = page.get_by_test_id("find-results")
        if results.evaluate("e => e.tagName") != "TABLE":
            return []
        return [int(t) for t in results.locator("tbody tr td:first-child").all_inner_texts()]

    def payload(m: dict[str, Any]) -> Any:
        try:
            return json.loads(m["data"])
        except ValueError:
            return None

    assert find(source="shop", header="kind=odd") == [
        m["id"] for m in every if m["source"] == "shop" and m["headers"].get("kind") == "odd"
    ]
    assert find(json="customer.id=1") == [
        m["id"] for m in every if isinstance(p := payload(m), dict) and p.get("customer", {}).get("id") == 1
    ]
    assert find(**{"from": "3", "to": "6"}) == [3, 4, 5, 6]
    assert find(json='tags=["a", "b"]') == [5]
    assert find(segments="1-2", source="web") == [
        m["id"] for m in every if 1 <= m["segment"] <= 2 and m["source"] == "web"
    ]
    assert find(source="evil") == [13]
    # A payload is text, never markup.
    expect(page.get_by_test_id("find-results")).to_contain_text(HOSTILE)
    assert page.locator("main img").count() == 0
    assert page.evaluate("document.body.dataset.pwned") is None


def test_a_page_whose_queue_is_dropped_says_why_it_cannot_refresh(
    page: Page, server_api: Api, server: ServerProcess
) -> None:
    server_api("PUT", "/v1/queues/short-lived", {})
    page.goto(f"{server.url}/ui/?sample=0.3#/queue/short-lived")
    expect(page.get_by_test_id("queue-name")).to_have_text("short-lived")
    # The page's first load is done (its stats are drawn): a drop during that load would
    # show the page's error instead of a failed refresh.
    expect(page.get_by_test_id("queue-stats")).to_be_visible()
    server_api("DELETE", "/v1/queues/short-lived")
    expect(page.get_by_test_id("status")).to_contain_text("Could not refresh: no queue")
    page.goto(f"{server.url}/ui/?sample=0.3#/")
    expect(page.get_by_test_id("status")).to_be_empty()
    page.goto(f"{server.url}/ui/#/queue/short-lived")
    expect(page.get_by_test_id("page-error")).to_contain_text("no queue")


# --- handlers ------------------------------------------------------------------------------


def test_handlers_page_shows_state_and_starts_stops_and_runs(
    page: Page, server_api: Api, server: ServerProcess, tmp_path: Path
) -> None:
    page.goto(f"{server.url}/ui/#/handlers")
    for handler in server_api("GET", "/v1/handlers")["handlers"]:
        state = "started" if handler["started"] else "stopped"
        expect(row(page, "handlers", handler["name"]).get_by_test_id("handler-state")).to_have_text(
            re.compile(f"{state}|running")
        )
    page.screenshot(path=str(tmp_path / "handlers-before.png"), full_page=True)
    page.get_by_test_id("stop-flush-all").click()
    expect(row(page, "handlers", "flush-all").get_by_test_id("handler-state")).to_have_text("stopped")
    assert server_api("GET", "/v1/handlers/flush-all")["started"] is False
    page.get_by_test_id("start-flush-all").click()
    expect(row(page, "handlers", "flush-all").get_by_test_id("handler-state")).to_have_text(
        re.compile("started|running")
    )
    assert server_api("GET", "/v1/handlers/flush-all")["started"] is True

    # A failing handler: when its failures began, its last run (a failed one) and its last
    # success (never) are three things.
    failing = row(page, "handlers", "to-dc2")
    until_blocking(
        lambda: (
            failing.get_by_test_id("handler-failing-since").get_attribute("title")
            == iso(failing_since(server_api("GET", "/v1/handlers/to-dc2")["status"]))
        )
    )
    expect(failing.get_by_test_id("handler-last-run")).not_to_have_text("—")
    expect(failing.get_by_test_id("handler-last-success")).to_have_text("—")
    healthy = row(page, "handlers", "orders-copy")
    expect(healthy.get_by_test_id("handler-failing-since")).to_have_count(0)
    expect(healthy.get_by_test_id("handler-last-success")).not_to_have_text("—")

    runs = server_api("GET", "/v1/handlers/to-dc2")["status"]["runs"]
    page.get_by_test_id("run-to-dc2").click()
    expect(page.locator(".toast.error")).to_contain_text("the pass failed")
    after = server_api("GET", "/v1/handlers/to-dc2")["status"]
    assert after["runs"] > runs
    expect(row(page, "handlers", "to-dc2").get_by_test_id("handler-runs")).to_have_text(num(after["runs"]))
    expect(row(page, "handlers", "to-dc2").get_by_test_id("handler-error")).to_contain_text(
        after["last_error"]["message"][:40]
    )


# --- replication ---------------------------------------------------------------------------


def test_replication_page_pings_clusters_and_shows_copy_lag_and_replicas(
    page: Page, server_api: Api, server: ServerProcess, tmp_path: Path
) -> None:
    page.goto(f"{server.url}/ui/?sample=0.3#/replication")
    ping = server_api("POST", "/v1/clusters/dc2/ping")
    assert ping["ok"] is False
    expect(row(page, "links", "dc2").get_by_test_id("ping")).to_contain_text(ping["error"]["code"])
    # The lag as of the handler's last pass (what it could not copy yet), sampled over time.
    lag = server_api("GET", "/v1/handlers/orders-copy")["status"]["lag"]
    expect(row(page, "copies", "orders-copy").get_by_test_id("copy-lag")).to_have_text(num(lag))
    expect(row(page, "copies", "orders-copy").locator("svg.spark")).not_to_have_attribute(
        "data-points", re.compile(r"^[01]$")
    )
    replicas = server_api("GET", "/v1/queues/orders/replicas?id=1")
    assert replicas["count"] >= 1
    page.get_by_test_id("replicas-queue").select_option("orders")
    page.get_by_test_id("replicas-id").fill("1")
    page.get_by_test_id("replicas-go").click()
    expect(page.get_by_test_id("replicas-result")).to_contain_text(", ".join(replicas["subscriptions"]))
    page.screenshot(path=str(tmp_path / "replication.png"), full_page=True)


# --- work queues ---------------------------------------------------------------------------


def test_work_pages_count_and_retry_move_back_and_delete(
    page: Page, server_api: Api, server: ServerProcess, tmp_path: Path
) -> None:
    base = "/v1/queues/jobs/subscriptions/workers"
    page.goto(f"{server.url}/ui/#/work")
    work = server_api("GET", base)["work"]
    line = row(page, "work-queues", "workers")
    for key, testid in (
        ("backlog", "pending"),
        ("in_flight", "in_flight"),
        ("failed", "failed"),
        ("dead", "dead"),
    ):
        expect(line.get_by_test_id(f"count-{testid}")).to_have_text(num(work[key]))
    assert (work["failed"], work["dead"]) == (1, 1)
    page.screenshot(path=str(tmp_path / "work-queues.png"), full_page=True)

    line.get_by_role("link", name="workers").click()
    shown = server_api("GET", f"{base}/work?status=in_flight,failed,dead")["messages"]
    table = page.get_by_test_id("work-messages")
    expect(table.locator("tbody tr")).to_have_count(len(shown))
    for m in shown:
        tr = table.locator("tbody tr").filter(
            has=page.get_by_test_id("work-id").get_by_text(str(m["id"]), exact=True)
        )
        expect(tr.get_by_test_id("work-status")).to_have_text(m["status"].replace("_", " "))
        expect(tr.get_by_test_id("work-attempts")).to_have_text(str(m["attempts"]))
        expect(tr.get_by_test_id("work-error")).to_have_text(m["last_error"] or "none")
    failed = next(m["id"] for m in shown if m["status"] == "failed")
    page.screenshot(path=str(tmp_path / "work-queue.png"), full_page=True)
    dead = next(m["id"] for m in shown if m["status"] == "dead")

    page.get_by_test_id(f"moveback-{dead}").click()
    expect(page.get_by_test_id(f"moveback-{dead}")).to_have_count(0)
    assert server_api("GET", f"{base}/work/{dead}")["status"] == "pending"
    page.get_by_test_id(f"retry-{failed}").click()
    expect(page.get_by_test_id(f"retry-{failed}")).to_have_count(0)
    assert server_api("GET", f"{base}/work/{failed}")["status"] == "pending"
    page.get_by_test_id("status-pending").check()
    page.get_by_test_id("work-show").click()
    # Delete asks first, naming the message; dismissing it keeps the message.
    page.get_by_test_id(f"delete-{failed}").click()
    expect(page.get_by_test_id("confirm")).to_contain_text(f"Delete message {failed} from jobs / workers?")
    page.get_by_test_id("confirm-cancel").click()
    expect(page.get_by_test_id("confirm")).to_have_count(0)
    assert server_api("GET", f"{base}/work/{failed}")["status"] == "pending"
    expect(page.get_by_test_id(f"delete-{failed}")).to_have_count(1)
    page.get_by_test_id(f"delete-{failed}").click()
    page.get_by_test_id("confirm-ok").click()
    expect(page.get_by_test_id(f"delete-{failed}")).to_have_count(0)
    # Finished without processing: "deleted", or "done" once every id before it is finished.
    assert server_api("GET", f"{base}/work/{failed}")["status"] in ("deleted", "done")
    work = server_api("GET", base)["work"]
    counts = f"pending {work['backlog']}, in flight {work['in_flight']}, failed {work['failed']}"
    expect(page.get_by_test_id("work-counts")).to_have_text(f"{counts}, dead {work['dead']}")


# --- scheduled -----------------------------------------------------------------------------


def test_scheduled_page_lists_what_falls_due_and_cancels(
    page: Page, server_api: Api, server: ServerProcess, tmp_path: Path
) -> None:
    page.goto(f"{server.url}/ui/#/scheduled")
    listed = server_api("GET", "/v1/queues/orders/scheduled")
    expect(row(page, "scheduled-queues", "orders").get_by_test_id("scheduled-count")).to_have_text(
        num(listed["count"])
    )
    sid = listed["scheduled"][0]["scheduled_id"]
    expect(row(page, "scheduled", "cron").get_by_test_id("scheduled-id")).to_have_text(str(sid))
    page.screenshot(path=str(tmp_path / "scheduled-before.png"), full_page=True)
    # Cancel asks first; "Keep it" (or Escape) keeps the message scheduled.
    page.get_by_test_id(f"cancel-{sid}").click()
    expect(page.get_by_test_id("confirm")).to_contain_text(f"Cancel scheduled message {sid} of orders?")
    page.get_by_test_id("confirm-cancel").click()
    page.get_by_test_id(f"cancel-{sid}").click()
    page.keyboard.press("Escape")
    expect(page.get_by_test_id("confirm")).to_have_count(0)
    assert server_api("GET", f"/v1/queues/orders/scheduled/{sid}")["scheduled_id"] == sid
    page.get_by_test_id(f"cancel-{sid}").click()
    page.get_by_test_id("confirm-ok").click()
    expect(page.get_by_test_id(f"cancel-{sid}")).to_have_count(0)
    error = server_api("GET", f"/v1/queues/orders/scheduled/{sid}", expect_status=404)["error"]
    assert error["code"] == "scheduled_not_found"


# --- asking before deleting ---------------------------------------------------------------


def test_every_delete_asks_first_and_a_queue_wants_its_name_typed(
    page: Page, server_api: Api, server: ServerProcess, tmp_path: Path
) -> None:
    server_api("PUT", "/v1/queues/doomed", {})
    server_api("POST", "/v1/queues/doomed/messages", {"data": "keep me"})
    server_api("PUT", "/v1/queues/doomed/subscriptions/reader", {})
    server_api("PUT", "/v1/handlers/doomed-flush", {"type": "flush", "queue": "doomed"})
    server_api("PUT", "/v1/clusters/spare", {"url": "http://127.0.0.1:9"})
    dialog = page.get_by_test_id("confirm")

    def ask(button: str, question: str, cancel: bool = False) -> None:
        page.get_by_test_id(button).click()
        expect(dialog).to_contain_text(question)
        if cancel:
            page.get_by_test_id("confirm-cancel").click()

    def confirm(button: str) -> None:
        page.get_by_test_id(button).click()
        page.get_by_test_id("confirm-ok").click()
        expect(page.get_by_test_id(button)).to_have_count(0)

    page.goto(f"{server.url}/ui/#/queue/doomed")
    ask("delete-queue", "Delete queue doomed?")
    # Not until the name is typed, exactly.
    expect(page.get_by_test_id("confirm-ok")).to_be_disabled()
    page.get_by_test_id("confirm-typed").fill("doome")
    expect(page.get_by_test_id("confirm-ok")).to_be_disabled()
    page.screenshot(path=str(tmp_path / "confirm-queue.png"))
    page.get_by_test_id("confirm-cancel").click()
    expect(dialog).to_have_count(0)
    assert server_api("GET", "/v1/queues/doomed")["stats"]["messages"] == 1

    # A subscription: dismissed, then confirmed.
    ask("delete-subscription-reader", "Delete subscription reader of doomed?")
    page.keyboard.press("Escape")
    expect(dialog).to_have_count(0)
    assert server_api("GET", "/v1/queues/doomed/subscriptions/reader")["name"] == "reader"
    confirm("delete-subscription-reader")
    server_api("GET", "/v1/queues/doomed/subscriptions/reader", expect_status=404)

    # A handler.
    page.goto(f"{server.url}/ui/#/handlers")
    ask("delete-doomed-flush", "Delete handler doomed-flush?", cancel=True)
    assert server_api("GET", "/v1/handlers/doomed-flush")["name"] == "doomed-flush"
    confirm("delete-doomed-flush")
    server_api("GET", "/v1/handlers/doomed-flush", expect_status=404)

    # An external cluster.
    page.goto(f"{server.url}/ui/#/replication")
    ask("delete-link-spare", "Delete the link to spare?", cancel=True)
    assert "spare" in [c["name"] for c in server_api("GET", "/v1/clusters")["clusters"]]
    confirm("delete-link-spare")
    assert "spare" not in [c["name"] for c in server_api("GET", "/v1/clusters")["clusters"]]

    # The queue, once its name is typed: gone, and the console is back on the overview.
    page.goto(f"{server.url}/ui/#/queue/doomed")
    page.get_by_test_id("delete-queue").click()
    page.get_by_test_id("confirm-typed").fill("doomed")
    page.get_by_test_id("confirm-ok").click()
    expect(page.locator("[data-page=overview]")).to_be_visible()
    server_api("GET", "/v1/queues/doomed", expect_status=404)


# --- a queue's latest messages and an ack subscription's links ------------------------------


def test_a_queue_page_shows_its_latest_messages_newest_first_at_once(
    page: Page, server_api: Api, server: ServerProcess
) -> None:
    page.goto(f"{server.url}/ui/#/queue/orders")
    last = server_api("GET", "/v1/queues/orders")["stats"]["last_id"]
    newest = server_api("GET", f"/v1/queues/orders/messages?after={max(0, last - 20)}&limit=20")["messages"]
    ids = page.get_by_test_id("latest").locator("tbody tr td:first-child")
    expect(ids).to_have_text([str(m["id"]) for m in reversed(newest)])
    # Payloads are text here too.
    expect(page.get_by_test_id("latest")).to_contain_text(HOSTILE)
    assert page.evaluate("document.body.dataset.pwned") is None
    # A new message shows with the next sample, on top.
    page.goto(f"{server.url}/ui/?sample=0.3#/queue/orders")
    made = server_api("POST", "/v1/queues/orders/messages", {"data": "the newest"})["results"][0]["id"]
    expect(ids.first).to_have_text(str(made))


def test_an_ack_subscription_links_to_its_work_queue_and_dead_letter_queue(
    page: Page, server_api: Api, server: ServerProcess
) -> None:
    page.goto(f"{server.url}/ui/#/queue/jobs")
    workers = row(page, "subscriptions", "workers")
    expect(workers.get_by_test_id("dead-letter-link")).to_have_text("jobs.dead")
    workers.get_by_test_id("work-link").click()
    expect(page).to_have_url(re.compile("#/work/jobs/workers$"))
    expect(page.get_by_test_id("work-counts")).to_contain_text("pending")
    # The work page links back to its queue and on to the dead letters.
    expect(page.get_by_test_id("queue-link")).to_have_attribute("href", "#/queue/jobs")
    page.get_by_test_id("dead-letter-link").click()
    expect(page.get_by_test_id("queue-name")).to_have_text("jobs.dead")
    page.goto(f"{server.url}/ui/#/work")
    row(page, "work-queues", "workers").get_by_test_id("dead-letter-link").click()
    expect(page.get_by_test_id("queue-name")).to_have_text("jobs.dead")


# --- charts --------------------------------------------------------------------------------


def test_charts_have_a_scale_and_a_time_window_the_user_chooses(
    page: Page, server_api: Api, server: ServerProcess, tmp_path: Path
) -> None:
    page.goto(f"{server.url}/ui/?sample=0.3")
    orders = (
        page.get_by_test_id("queues")
        .locator("tbody tr")
        .filter(has=page.get_by_role("link", name="orders", exact=True))
    )
    size = orders.locator("[data-chart=Size] svg.spark")
    # The y axis in the series' units (0 at the bottom), the x axis the window up to now.
    expect(size.locator("text.y-min")).to_have_text("0 B")
    expect(size.locator("text.y-max")).to_have_text(re.compile(r"^[0-9.]+ (B|KiB|MiB)$"))
    expect(size.locator("text.x-window")).to_have_text("last 5 min")
    expect(size.locator("text.x-now")).to_have_text("now")
    produce = orders.locator("[data-chart=Produce] svg.spark")
    expect(produce.locator("text.y-max")).to_have_text(re.compile(r"/s$"))
    # Another window redraws every chart at once, and is kept for the next visit.
    page.get_by_test_id("window").select_option(label="1 h")
    expect(size.locator("text.x-window")).to_have_text("last 1 h")
    page.goto(f"{server.url}/ui/#/queue/orders")
    expect(page.locator("[data-chart=Messages] text.x-window")).to_have_text("last 1 h")
    expect(page.locator("[data-chart=Messages] text.y-max")).not_to_be_empty()
    page.screenshot(path=str(tmp_path / "charts.png"), full_page=True)
    page.get_by_test_id("window").select_option(label="5 min")


# --- layout --------------------------------------------------------------------------------

# Every card, section, table box and the page itself: what does not fit its box horizontally.
OVERFLOWING = """() => {
  const boxes = document.querySelectorAll("header, main, section, .card, .table-wrap");
  return [document.documentElement, ...boxes]
    .filter((e) => e.scrollWidth > e.clientWidth + 1)
    .map((e) => `${e.tagName}.${e.className} ${e.querySelector("h2")?.textContent ?? ""}: `
      + `${e.scrollWidth} > ${e.clientWidth}`);
}"""


@pytest.mark.parametrize("width", [800, 1400])
def test_every_page_fits_its_cards_from_800_px_up(
    browser: Browser, server: ServerProcess, tmp_path: Path, width: int
) -> None:
    context = browser.new_context(viewport={"width": width, "height": 900})
    page = context.new_page()
    page.set_default_timeout(10_000)
    pages = {
        "overview": ("#/", "queues"),
        "queue": ("#/queue/orders", "latest"),
        "handlers": ("#/handlers", "handlers"),
        "replication": ("#/replication", "copies"),
        "work": ("#/work", "work-queues"),
        "work-queue": ("#/work/jobs/workers", "work-counts"),
        "scheduled": ("#/scheduled", "scheduled-queues"),
    }
    try:
        for name, (address, testid) in pages.items():
            page.goto(f"{server.url}/ui/?sample=0.3{address}")
            expect(page.get_by_test_id(testid)).to_be_visible()
            page.wait_for_timeout(700)  # a couple of samples: the charts have lines and labels
            page.screenshot(path=str(tmp_path / f"{name}-{width}.png"), full_page=True)
            assert page.evaluate(OVERFLOWING) == [], name
    finally:
        context.close()


# --- sign-in -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def secured_server(tmp_path_factory: pytest.TempPathFactory, origin: PageServer) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("secured")
    os.environ["CONSOLE_ADMIN"] = ADMIN_PASSWORD  # read by the server at its first start
    try:
        process = ServerProcess(tmp / "data", config=config(tmp, origin.url, auth=True))
    finally:
        del os.environ["CONSOLE_ADMIN"]
    yield from running(process)


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_sign_in_with_a_password_keeps_a_token_and_hides_what_the_user_may_not_do(
    page: Page, secured_server: ServerProcess
) -> None:
    admin = Api(secured_server.url, basic("admin", ADMIN_PASSWORD))
    admin("PUT", "/v1/queues/orders", {})
    admin("POST", "/v1/queues/orders/messages", {"data": "hi"})
    admin("PUT", "/v1/handlers/flush", {"type": "flush", "queue": "orders"})
    rules = ["allow:queue:read:*", "allow:handler:read:*", "allow:subscription:read:*"]
    admin("PUT", "/v1/users/viewer", {"password": "viewer-password", "rules": rules})

    page.goto(f"{secured_server.url}/ui/")
    dialog = page.locator("dialog#signin")
    expect(dialog).to_be_visible()
    dialog.get_by_label("User").fill("viewer")
    dialog.get_by_label("Password").fill("wrong-password")
    dialog.get_by_role("button", name="Sign in").click()
    expect(page.locator("#signin-error")).to_have_text("Wrong user, password or token.")
    dialog.get_by_label("Password").fill("viewer-password")
    dialog.get_by_role("button", name="Sign in").click()
    expect(dialog).to_be_hidden()
    expect(page.get_by_test_id("who")).to_have_text("viewer")
    expect(page.get_by_test_id("queues").locator("tbody tr")).to_have_count(1)
    # /metrics needs cluster read: the produce rate comes from the last ids instead.
    expect(page.get_by_text("Consume rates need read access to /metrics")).to_be_visible()

    # The token (never the password) is kept in this tab's sessionStorage, and it is the
    # viewer's: the API says so.
    token = page.evaluate("sessionStorage.getItem('capella.auth')")
    assert token.startswith("Bearer cap_")
    assert "viewer-password" not in json.dumps(page.evaluate("Object.entries(sessionStorage)"))
    assert Api(secured_server.url, token)("GET", "/v1/me")["user"] == "viewer"
    made = [t for t in admin("GET", "/v1/tokens")["tokens"] if t["user"] == "viewer"]
    assert [t["description"] for t in made] == ["console"]

    page.goto(f"{secured_server.url}/ui/#/handlers")
    expect(page.get_by_test_id("run-flush")).to_be_disabled()
    expect(page.get_by_test_id("stop-flush")).to_be_disabled()
    page.goto(f"{secured_server.url}/ui/#/queue/orders")
    expect(page.get_by_test_id("produce-send")).to_be_disabled()
    expect(page.get_by_test_id("stat-messages")).to_have_text("1")

    # A revoked (or expired) token: the next call is refused and the console asks again.
    token_id = page.evaluate("sessionStorage.getItem('capella.auth.id')")
    admin("DELETE", f"/v1/tokens/{token_id}")
    page.goto(f"{secured_server.url}/ui/#/handlers")
    expect(dialog).to_be_visible()
    dialog.get_by_label("User").fill("viewer")
    dialog.get_by_label("Password").fill("viewer-password")
    dialog.get_by_role("button", name="Sign in").click()
    expect(page.get_by_test_id("run-flush")).to_be_disabled()
    token = page.evaluate("sessionStorage.getItem('capella.auth')")

    # Signing out revokes the token.
    page.get_by_test_id("signout").click()
    expect(dialog).to_be_visible()
    Api(secured_server.url, token)("GET", "/v1/me", expect_status=401)


# --- another origin ------------------------------------------------------------------------

FOLLOWER = """<!doctype html><title>follower</title><script>
window.seen = []; window.opened = 0;
const source = new EventSource("%(url)s/v1/queues/feed/stream?after=0");
source.onopen = () => { window.opened += 1; };
source.addEventListener("message", (e) => window.seen.push(Number(e.lastEventId)));
window.errors = 0;
source.onerror = () => { window.errors += 1; };
</script>"""


def test_a_page_on_another_origin_follows_the_stream_and_resumes_after_a_restart(
    browser: Browser, origin: PageServer, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    with ExitStack() as stack:
        first = ServerProcess(data, config=config(tmp_path, origin.url))
        stack.callback(first.stop)
        first.wait_ready()
        feed = Api(first.url)
        feed("PUT", "/v1/queues/feed", {})
        feed("POST", "/v1/queues/feed/messages?save=immediate", {"messages": [{"data": "a"}, {"data": "b"}]})
        origin.pages["/follow.html"] = FOLLOWER % {"url": first.url}
        context = browser.new_context()
        stack.callback(context.close)
        page = context.new_page()
        page.goto(f"{origin.url}/follow.html")
        page.wait_for_function("window.seen.length === 2")
        # The same page from an origin that is not listed (localhost is another host name)
        # gets no CORS headers: the browser fails its stream and shows it nothing.
        stranger = context.new_page()
        stranger.goto(f"{origin.url.replace('127.0.0.1', 'localhost')}/follow.html")
        stranger.wait_for_function("window.errors >= 1")
        assert stranger.evaluate("[window.opened, window.seen]") == [0, []]
        stranger.close()

        first.stop()  # ends the stream; the browser reconnects by itself
        second = ServerProcess(data, port=first.port, config=config(tmp_path, origin.url))
        stack.callback(second.stop)
        second.wait_ready()
        Api(second.url)("POST", "/v1/queues/feed/messages", {"data": "c"})
        page.wait_for_function("window.opened >= 2 && window.seen.length >= 3", timeout=15_000)
        # Resumed after the last id it had (Last-Event-ID), not from after=0 again.
        assert page.evaluate("window.seen") == [1, 2, 3]
        page.screenshot(path=str(tmp_path / "follower.png"))
