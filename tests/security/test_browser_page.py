"""The browser attacks of issue 20 in a real browser: headless Chromium (Playwright) runs the
attacker's page against ``capella serve`` with authentication off on loopback.

A page on ``http://localhost:<port>`` is another site than ``http://127.0.0.1:<port>``, so the
browser marks its requests ``Sec-Fetch-Site: cross-site``. For DNS rebinding, Chromium resolves
``rebind.attacker.example`` to 127.0.0.1 (``--host-resolver-rules``), which is what the
attacker's DNS does once the page has loaded: the page's script then runs on the broker's
origin, as far as the browser can tell.
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Browser
from support.browser import PageServer, chromium, needs_chromium
from support.servers import ServerProcess, running

pytestmark = [needs_chromium, pytest.mark.slow]

REBIND = "rebind.attacker.example"
DELETE_ALL = '{"status": ["pending"]}'
# What a page on any site can send without a preflight: fetch in no-cors mode (text/plain or a
# form type), and a form whose text/plain body is made to read as JSON.
ATTACK = """<!doctype html>
<form id="form" method="POST" action="%(target)s" enctype="text/plain">
  <input name='{"status": ["pending"], "padding": "' value='"}'>
</form>
<script>
window.sent = (async () => {
  const sent = [];
  for (const type of ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"]) {
    await fetch("%(target)s", {method: "POST", mode: "no-cors", headers: {"Content-Type": type},
                               body: '%(body)s'});
    sent.push(type);
  }
  return sent;
})();
</script>
"""


def call(url: str, method: str = "GET", body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from running(ServerProcess(tmp_path_factory.mktemp("browser") / "data"))


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium(f"--host-resolver-rules=MAP {REBIND} 127.0.0.1") as browser:
        yield browser


def pending(broker: ServerProcess, subscription: str) -> list[int]:
    status, body = call(f"{broker.url}{subscription}/work?status=pending")
    assert status == 200, body
    return [m["id"] for m in body["messages"]]


def test_a_page_on_another_site_deletes_nothing_and_curl_still_does(
    broker: ServerProcess, browser: Browser
) -> None:
    subscription = "/v1/queues/jobs/subscriptions/workers"
    assert call(f"{broker.url}/v1/queues/jobs", "PUT", {})[0] == 201
    assert call(f"{broker.url}{subscription}", "PUT", {"mode": "ack"})[0] == 201
    messages = {"messages": [{"data": f"job {i}"} for i in range(3)]}
    assert call(f"{broker.url}/v1/queues/jobs/messages", "POST", messages)[0] == 200
    target = f"{broker.url}{subscription}/work/delete"
    attacker = PageServer({"/": ATTACK % {"target": target, "body": DELETE_ALL}})
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(f"http://localhost:{attacker.port}/")  # another site than 127.0.0.1

        assert page.evaluate("window.sent") == [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data",
        ]
        assert pending(broker, subscription) == [1, 2, 3]
        with page.expect_navigation():
            page.evaluate("document.getElementById('form').submit()")
        assert json.loads(page.inner_text("body"))["error"]["code"] == "cross_site_request"
        assert pending(broker, subscription) == [1, 2, 3]
    finally:
        context.close()
        attacker.close()

    done = subprocess.run(
        ["curl", "-s", "-X", "POST", target, "-d", DELETE_ALL], capture_output=True, text=True, check=True
    )
    assert json.loads(done.stdout)["deleted"] == [1, 2, 3]


def test_a_rebinding_page_can_neither_read_nor_write(broker: ServerProcess, browser: Browser) -> None:
    assert call(f"{broker.url}/v1/queues/secret-orders", "PUT", {})[0] == 201
    assert call(f"{broker.url}/v1/queues/flushed", "PUT", {})[0] in (200, 201)
    rebound = f"http://{REBIND}:{broker.port}"
    # The broker's answers carry a CSP that lets no script fetch; the attacker's own page would
    # not, so the page used here stands in for it without one.
    context = browser.new_context(bypass_csp=True)
    try:
        page = context.new_page()
        # The probes answer any Host: the page's document now lives on the broker's origin.
        page.goto(f"{rebound}/healthz")

        answers = page.evaluate(
            """async () => {
                const read = await fetch("/v1/queues");
                const write = await fetch("/v1/handlers/rebound", {
                    method: "PUT", headers: {"Content-Type": "application/json"},
                    body: JSON.stringify({type: "flush", queues: ["flushed"], started: false}),
                });
                return [[read.status, await read.json()], [write.status, await write.json()]];
            }"""
        )
        page.goto(f"{rebound}/ui/")
        console = json.loads(page.inner_text("body"))
    finally:
        context.close()

    for status, body in answers:
        assert (status, body["error"]["code"]) == (403, "host_not_allowed")
        assert "secret-orders" not in json.dumps(body)
    assert console["error"]["code"] == "host_not_allowed"
    assert call(f"{broker.url}/v1/handlers/rebound")[0] == 404
