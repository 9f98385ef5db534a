"""A limited user points the broker at its own network position: refused unless the operator allowed it.

With ``[auth]`` on, push receivers and clusters may only be public addresses; loopback in
any spelling (another 127/8 address, ``[::1]``, the IPv4-mapped ``[::ffff:127.0.0.1]``, the name
``localhost``) is refused at connect time, shown in the handler's status naming the address and
``[egress] allow``, and costs the message no attempt. The same definitions deliver once the
operator lists loopback in ``[egress] allow``.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from support.receiver import listening
from support.wait import eventually, holds

from security.conftest import Answer, Secured, StartSecured

ALLOW_LOOPBACK = '[egress]\nallow = ["127.0.0.0/8", "::1/128"]\n'


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@dataclass
class Loopback:
    """One receiver on 127.0.0.1, 127.0.0.2 and (where there is IPv6) ::1, on the same port."""

    port: int = 0
    seen: list[str] = field(default_factory=list)  # the path of each request
    hosts: list[str] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        self.seen.append(request.path)
        return web.Response(text="ok")

    def urls(self) -> dict[str, str]:
        """Handler name → a URL naming loopback one way, its path naming the handler."""
        forms = {"dev-two": "127.0.0.2", "dev-mapped": "[::ffff:127.0.0.1]", "dev-localhost": "localhost"}
        if "::1" in self.hosts:
            forms["dev-six"] = "[::1]"
        return {name: f"http://{host}:{self.port}/{name}" for name, host in forms.items()}


@pytest.fixture
async def loopback() -> AsyncIterator[Loopback]:
    found = Loopback()
    found.hosts = ["127.0.0.1", "127.0.0.2"] + (["::1"] if ipv6_loopback() else [])
    async with listening(found.handle, hosts=found.hosts) as port:
        found.port = port
        yield found


async def call(secured: Secured, method: str, path: str, body: Any = None, user: str = "dev") -> Answer:
    # In a thread: the receivers share this test's event loop and must answer meanwhile.
    return await asyncio.to_thread(secured.call, method, path, body, user=user)


async def define_pushes(secured: Secured, urls: dict[str, str]) -> None:
    assert (await call(secured, "PUT", "/v1/queues/dev-orders", {})).status == 201
    for name, url in urls.items():
        params = {"url": url, "wait": 0, "delay": "50ms", "max_delay": "100ms", "timeout": "2s"}
        made = await call(
            secured, "PUT", f"/v1/handlers/{name}", {"type": "push", "queue": "dev-orders", "params": params}
        )
        assert made.status == 201, made.body
    produced = await call(
        secured, "POST", "/v1/queues/dev-orders/messages", {"messages": [{"data": "hello"}]}
    )
    assert produced.status == 200, produced.body


async def statuses_when(
    secured: Secured, names: list[str], done: Any, seconds: float = 15.0
) -> dict[str, Any]:
    found: dict[str, Any] = {}

    async def all_done() -> bool:
        nonlocal found
        found = {name: (await call(secured, "GET", f"/v1/handlers/{name}")).body["status"] for name in names}
        return all(done(s) for s in found.values())

    await eventually(all_done, within=seconds, every=0.1)
    return found


async def test_loopback_in_any_spelling_is_refused_and_costs_no_attempt(
    start_secured: StartSecured, loopback: Loopback
) -> None:
    secured = start_secured()
    urls = loopback.urls()
    await define_pushes(secured, urls)

    statuses = await statuses_when(secured, list(urls), lambda s: s["last_error"] is not None)
    await holds(lambda: loopback.seen == [], 0.3, "nothing leaving")  # a few more passes

    assert loopback.seen == []
    for name, status in statuses.items():
        message = status["last_error"]["message"]
        assert "refused by the egress policy" in message, (name, status)
        assert "[egress] allow" in message
        assert status["last_error"]["code"] == "egress_refused", (name, status)
        assert (status["delivered"], status["failed"], status["dead"], status["lag"]) == (0, 0, 0, 1)
    assert "127.0.0.2" in statuses["dev-two"]["last_error"]["message"]
    assert "localhost (" in statuses["dev-localhost"]["last_error"]["message"]


async def test_the_operator_can_allow_loopback(start_secured: StartSecured, loopback: Loopback) -> None:
    secured = start_secured(ALLOW_LOOPBACK)
    urls = loopback.urls()
    await define_pushes(secured, urls)

    statuses = await statuses_when(secured, list(urls), lambda s: s["delivered"] == 1)

    assert sorted(loopback.seen) == sorted(f"/{name}" for name in urls)
    assert all(s["last_error"] is None and s["delivered"] == 1 for s in statuses.values()), statuses


async def test_an_external_cluster_on_loopback_is_refused(
    start_secured: StartSecured, loopback: Loopback
) -> None:
    secured = start_secured()
    made = await call(
        secured, "PUT", "/v1/clusters/inside", {"url": f"http://127.0.0.2:{loopback.port}"}, user="admin"
    )
    assert made.status == 201, made.body

    ping = await call(secured, "POST", "/v1/clusters/inside/ping", user="admin")

    assert ping.status == 200
    assert ping.body["ok"] is False
    assert ping.body["error"]["code"] == "egress_refused"
    assert "[egress] allow" in ping.body["error"]["message"]
    assert loopback.seen == []
