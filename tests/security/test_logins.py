"""Floods of logins: every path a stranger can fill is bounded, and no flood locks out a token.

Password checks (scrypt, two at a time) are the expensive part of a login. A stranger may not
queue them without bound (``429 too_many_logins`` past ``LOGINS_WAITING``), nor guess without
bound from one address or against one user name (``429 too_many_failed_logins``, with no hash
run), and neither may delay or refuse a bearer token. Clients come from different loopback
addresses (127.0.0.0/8 is all loopback on Linux) to be different addresses to the server.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from support.clock import Clock
from support.servers import ServerProcess, running
from support.supervisor import launched

from capella.api import create_app
from capella.auth.authenticator import LOGINS_WAITING, Authenticator
from capella.auth.store import AuthStore
from capella.auth.throttle import Throttle, client_key
from capella.config import AuthSettings, ServerSettings
from capella.core.cluster import Cluster
from capella.handlers.supervisor import Supervisor

ALICE = ("alice", "alice-password")
ROOT = ("root", "root-password")


def basic(name: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{name}:{password}".encode()).decode()}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# --- the budget itself (pure: the time is passed in) ---------------------------------------


def test_a_budget_spends_failures_and_earns_them_back_evenly() -> None:
    budget = Throttle(3, 60.0)
    for _ in range(3):
        assert budget.wait("a", now=0.0) == 0.0
        budget.take("a", now=0.0)
    assert budget.wait("a", now=0.0) == pytest.approx(20.0)  # one token per 20 s
    assert budget.wait("a", now=15.0) == pytest.approx(5.0)
    assert budget.wait("a", now=20.0) == 0.0
    assert budget.wait("b", now=0.0) == 0.0, "each key has its own"


def test_a_success_gives_its_token_back_and_a_full_bucket_is_forgotten() -> None:
    budget = Throttle(2, 60.0)
    budget.take("a", now=0.0)
    budget.take("a", now=0.0)
    budget.give("a", now=0.0)
    assert budget.wait("a", now=0.0) == 0.0
    budget.give("a", now=0.0)
    assert len(budget) == 0


def test_the_number_of_keys_is_capped() -> None:
    budget = Throttle(1, 60.0, size=100)
    for i in range(1000):
        budget.take(f"k{i}", now=0.0)
    assert len(budget) == 100
    assert budget.wait("k999", now=0.0) > 0, "the most recent keys are kept"


@pytest.mark.parametrize(
    ("address", "key"),
    [
        ("203.0.113.7", "203.0.113.7"),
        ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:ffff::1", "2001:db8:1:2::/64"),
        ("::ffff:203.0.113.7", "203.0.113.7"),
        ("", ""),
    ],
)
def test_an_ipv6_client_is_one_key_per_64(address: str, key: str) -> None:
    assert client_key(address) == key


# --- the real app on loopback, clients from several addresses ------------------------------


class Broker:
    """The app behind a real TCP server on 127.0.0.1; ``session(address)`` connects from there."""

    def __init__(self, server: TestServer, store: AuthStore, clock: Clock) -> None:
        self.server = server
        self.store = store
        self.clock = clock

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"

    @asynccontextmanager
    async def session(self, address: str = "127.0.0.1") -> AsyncIterator[aiohttp.ClientSession]:
        connector = aiohttp.TCPConnector(local_addr=(address, 0), limit=0)
        async with aiohttp.ClientSession(self.url, connector=connector) as session:
            yield session

    async def me(self, address: str, headers: dict[str, str]) -> tuple[int, str | None, str | None]:
        """(status, error code, Retry-After) of ``GET /v1/me`` with these credentials."""
        async with self.session(address) as session, session.get("/v1/me", headers=headers) as resp:
            body = await resp.json()
            return resp.status, body.get("error", {}).get("code"), resp.headers.get("Retry-After")

    def token(self, user: str) -> str:
        return self.store.create_token(user, 3600)[1]


MakeBroker = Callable[..., Any]


@pytest.fixture
async def make_broker(
    aiohttp_server: Callable[[web.Application], Any], cluster: Cluster, tmp_path: Path
) -> AsyncIterator[MakeBroker]:
    supervisors: list[Supervisor] = []

    async def make(**auth: Any) -> Broker:
        store = AuthStore(tmp_path / f"auth-{len(supervisors)}")
        store.add_user(*ROOT, admin=True)
        store.add_user(*ALICE)
        supervisor = await launched(cluster, users=store)
        supervisors.append(supervisor)
        clock = Clock()
        authenticator = Authenticator(store, AuthSettings(enabled=True, **auth), clock=clock)
        app = create_app(cluster, ServerSettings(), supervisor, authenticator=authenticator)
        return Broker(await aiohttp_server(app), store, clock)

    yield make
    for supervisor in supervisors:
        await supervisor.close()


async def test_failed_logins_from_one_address_run_out_and_tokens_still_work(make_broker: MakeBroker) -> None:
    broker: Broker = await make_broker()
    token = broker.token("alice")

    answers = [await broker.me("127.0.0.2", basic("alice", f"guess-{i}")) for i in range(12)]

    assert answers[:10] == [(401, "unauthorized", None)] * 10
    for status, code, retry_after in answers[10:]:
        assert (status, code) == (429, "too_many_failed_logins")
        assert retry_after is not None and 1 <= int(retry_after) <= 6  # 10 a minute: one per 6 s
    # The address is spent, for the right password too: its next check would be a guess as well.
    assert (await broker.me("127.0.0.2", basic(*ALICE)))[:2] == (429, "too_many_failed_logins")
    # Tokens need no password check: never delayed, never refused by a flood of Basic logins.
    assert (await broker.me("127.0.0.2", bearer(token)))[0] == 200
    # Alice herself, from another address: her name's budget (20) is not spent by 10 guesses.
    assert (await broker.me("127.0.0.3", basic(*ALICE)))[0] == 200
    # The budget comes back with time: one failure per 6 s.
    broker.clock.now += 7.0
    assert (await broker.me("127.0.0.2", basic(*ALICE)))[0] == 200


async def test_the_answers_do_not_tell_whether_a_user_exists(make_broker: MakeBroker) -> None:
    broker: Broker = await make_broker()

    known = [await broker.me("127.0.0.4", basic("alice", f"guess-{i}")) for i in range(12)]
    unknown = [await broker.me("127.0.0.5", basic("nobody", f"guess-{i}")) for i in range(12)]

    assert known == unknown


async def test_a_flood_on_one_user_from_many_addresses_spares_the_addresses_it_knows(
    make_broker: MakeBroker,
) -> None:
    # cache_ttl 0: every login checks the password, so only the known address lets Alice in.
    broker: Broker = await make_broker(cache_ttl=0)
    assert (await broker.me("127.0.0.10", basic(*ALICE)))[0] == 200  # Alice's own machine

    guesses = [await broker.me(f"127.0.1.{i // 5}", basic("alice", f"guess-{i}")) for i in range(25)]

    assert guesses[:20] == [(401, "unauthorized", None)] * 20
    # Her name's budget is spent: it refuses every address that has been guessing. The fifth
    # address's first guess is checked (it had not failed yet), its next ones are refused.
    assert guesses[20][:2] == (401, "unauthorized")
    assert {g[:2] for g in guesses[21:]} == {(429, "too_many_failed_logins")}, "her name's budget is spent"
    # A guessing address is refused by her name's budget, even with the right password (it
    # could be the next guess); the address Alice signed in from keeps its own budget.
    assert (await broker.me("127.0.1.0", basic(*ALICE)))[:2] == (429, "too_many_failed_logins")
    assert (await broker.me("127.0.0.10", basic(*ALICE)))[0] == 200
    # Other users are not touched.
    assert (await broker.me("127.0.0.11", basic(*ROOT)))[0] == 200


async def test_guesses_at_a_name_from_many_addresses_do_not_lock_its_owner_out(
    make_broker: MakeBroker,
) -> None:
    # Issue 33: 36 wrong passwords for a name from three addresses made the right one answer
    # 429 from a fourth address that had never failed: lockout by name, which anyone can cause.
    broker: Broker = await make_broker(cache_ttl=0)
    guesses = [await broker.me(f"127.0.2.{1 + i % 3}", basic("alice", f"guess-{i}")) for i in range(36)]
    assert {g[:2] for g in guesses[30:]} == {(429, "too_many_failed_logins")}, "the guessers are refused"

    # Alice from an address that has not been guessing, and has never signed in before.
    assert (await broker.me("127.0.2.4", basic(*ALICE)))[0] == 200
    # Sustained: more guesses keep coming, from fresh addresses too; Alice still gets in.
    for i in range(20):
        await broker.me(f"127.0.3.{i}", basic("alice", f"again-{i}"))
    assert (await broker.me("127.0.2.5", basic(*ALICE)))[0] == 200
    # A guessing address stays refused, the right password too (it could be its next guess).
    assert (await broker.me("127.0.2.1", basic(*ALICE)))[:2] == (429, "too_many_failed_logins")


async def test_checks_waiting_for_a_hash_slot_are_bounded(make_broker: MakeBroker) -> None:
    broker: Broker = await make_broker(max_failed_logins_per_address=1000, max_failed_logins_per_user=1000)

    async with broker.session("127.0.0.6") as session:

        async def guess(i: int) -> tuple[int, str | None, str | None]:
            async with session.get("/v1/me", headers=basic(f"user-{i}", f"guess-{i}")) as resp:
                code = (await resp.json())["error"]["code"]
                return resp.status, code, resp.headers.get("Retry-After")

        answers = await asyncio.gather(*(guess(i) for i in range(LOGINS_WAITING * 3)))

    assert {a for a in answers if a[0] != 401} == {(429, "too_many_logins", "1")}
    assert sum(1 for a in answers if a[0] == 401) >= LOGINS_WAITING


async def test_the_same_login_at_once_costs_one_check(make_broker: MakeBroker) -> None:
    # A client that opens many connections at once, before its first answer: more than the
    # waiting bound and the address's budget, yet every one is let in.
    broker: Broker = await make_broker()
    async with broker.session("127.0.0.7") as session:

        async def sign_in() -> int:
            async with session.get("/v1/me", headers=basic(*ALICE)) as resp:
                return resp.status

        assert await asyncio.gather(*(sign_in() for _ in range(LOGINS_WAITING * 2))) == [200] * (
            LOGINS_WAITING * 2
        )


async def test_a_password_change_checks_the_old_password_within_the_budget(make_broker: MakeBroker) -> None:
    # A stolen token must not make the old_password check a way around the login budget.
    broker: Broker = await make_broker()
    token = bearer(broker.token("alice"))
    async with broker.session("127.0.0.8") as session:
        statuses = []
        for i in range(12):
            body = {"password": "alice-password-2", "old_password": f"guess-{i}"}
            async with session.post("/v1/users/alice/password", json=body, headers=token) as resp:
                statuses.append((resp.status, (await resp.json())["error"]["code"]))

    assert statuses[:10] == [(403, "forbidden")] * 10
    assert set(statuses[10:]) == {(429, "too_many_failed_logins")}


# --- a real server process ---------------------------------------------------------------

ADMIN_PASSWORD = "admin-password-of-the-flood-test"
FLOOD = 100


@pytest.fixture
def flooded_server(tmp_path: Path) -> Iterator[ServerProcess]:
    """Auth on; budgets high enough that every wrong login of the flood reaches the hash queue."""
    config = tmp_path / "capella.toml"
    config.write_text(
        '[auth]\nenabled = true\nbootstrap_user = "admin"\nbootstrap_password_env = "FLOOD_ADMIN_PASSWORD"\n'
        "max_failed_logins_per_address = 1000\nmax_failed_logins_per_user = 1000\n"
    )
    server = ServerProcess(tmp_path / "data", config=config, env={"FLOOD_ADMIN_PASSWORD": ADMIN_PASSWORD})
    yield from running(server)


async def test_a_hundred_wrong_logins_in_flight_do_not_delay_a_token(flooded_server: ServerProcess) -> None:
    url = flooded_server.url
    admin = basic("admin", ADMIN_PASSWORD)
    async with (
        aiohttp.ClientSession(url) as session,
        session.post("/v1/tokens", json={}, headers=admin) as resp,
    ):
        assert resp.status == 201, await resp.text()
        token = (await resp.json())["token"]

    flood_connector = aiohttp.TCPConnector(local_addr=("127.0.0.2", 0), limit=0)
    async with (
        aiohttp.ClientSession(url, connector=flood_connector) as flood,
        aiohttp.ClientSession(url) as user,
    ):

        async def guess(i: int) -> tuple[int, str, str | None]:
            async with flood.get("/v1/me", headers=basic(f"guess-{i}", f"wrong-{i}")) as resp:
                return resp.status, (await resp.json())["error"]["code"], resp.headers.get("Retry-After")

        guesses = asyncio.gather(*(guess(i) for i in range(FLOOD)))
        await asyncio.sleep(0.3)  # all hundred sent: two hashing, the rest waiting or refused
        started = time.monotonic()
        async with user.get("/v1/me", headers=bearer(token)) as resp:
            assert resp.status == 200
            assert (await resp.json())["user"] == "admin"
        took = time.monotonic() - started
        answers = await guesses

        assert took < 1.0, f"a token login took {took:.3f} s during the flood"
        assert {a[:2] for a in answers} <= {(401, "unauthorized"), (429, "too_many_logins")}
        refused = [a for a in answers if a[0] == 429]
        assert refused and all(a[2] == "1" for a in refused), "past the waiting bound: 429 with Retry-After"

        # After the flood a good Basic login from another address gets in.
        async with user.get("/v1/me", headers=basic("admin", ADMIN_PASSWORD)) as resp:
            assert resp.status == 200
