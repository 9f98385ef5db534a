"""Secrets bound to hosts: a granted secret goes only where ``[secrets.NAME] hosts`` says.

A granted secret is a readable one: its grantee can point a push handler, a PostgreSQL DSN or
an external cluster at a receiver of their own, anywhere the egress policy allows. With
``hosts`` the operator binds it; a definition that would send it elsewhere is refused when it
is defined and each time the secret is read for use.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from support.receiver import Receiver, listening
from support.servers import ServerProcess
from support.wait import until

from capella.config import SecretSettings, parse_config
from capella.errors import InvalidConfig
from security.conftest import ADMIN_PASSWORD, DEV_PASSWORD, DEV_RULES, Secured, StartSecured, write_config

LOOPBACK = '[egress]\nallow = ["127.0.0.0/8", "::1/128"]\n\n'
HOOK_TOKEN = "hook-token-value"
RULES = [*DEV_RULES, "allow:secret:use:dev-*", "allow:external_cluster:admin:dev-*"]


@pytest.fixture
async def two_addresses() -> AsyncIterator[Receiver]:
    """A recording receiver on 127.0.0.1 and 127.0.0.2, one port."""
    found = Receiver()
    async with listening(found.handle, hosts=("127.0.0.1", "127.0.0.2")) as port:
        found.url = f"http://127.0.0.1:{port}"
        yield found


def push(url: str) -> dict[str, object]:
    return {"type": "push", "queue": "dev-q", "params": {"url": url, "max_attempts": 1, "token": "dev-hook"}}


def grant(secured: Secured) -> None:
    answer = secured.call("PUT", "/v1/users/dev", {"password": DEV_PASSWORD, "rules": RULES}, user="admin")
    assert answer.status in (200, 201), answer.body


def test_a_host_pattern_matches_the_names_and_addresses_it_says() -> None:
    bound = SecretSettings(env="X", hosts=("db1.internal", "*.example.com", "10.0.0.0/24", "fd00::1"))
    for host in ("db1.internal", "DB1.Internal", "a.example.com", "a.b.example.com", "10.0.0.7", "[fd00::1]"):
        assert bound.sends_to(host), host
    for host in ("db2.internal", "example.com", "badexample.com", "10.0.1.1", "fd00::2", "db1.internal.evil"):
        assert not bound.sends_to(host), host
    assert SecretSettings(env="X").sends_to("anywhere.example")


@pytest.mark.parametrize(
    "hosts", ["[]", '["https://db1.internal"]', '["db1.internal:5432"]', '["a b"]', '"db1"']
)
def test_a_bad_hosts_list_stops_the_start(hosts: str) -> None:
    raw = {"secrets": {"s": {"env": "X", "hosts": json.loads(hosts)}}}
    with pytest.raises(InvalidConfig, match=r"secrets\.s\.hosts"):
        parse_config(raw, {}, base=Path("/"))


async def test_a_bound_secret_is_refused_for_another_host_and_sent_to_its_own(
    start_secured: StartSecured, two_addresses: Receiver
) -> None:
    extra = LOOPBACK + '[secrets.dev-hook]\nenv = "HOOK_TOKEN"\nhosts = ["127.0.0.1"]\n\n'
    secured = start_secured(extra, env={"HOOK_TOKEN": HOOK_TOKEN})
    grant(secured)
    assert secured.call("PUT", "/v1/queues/dev-q", {}).status == 201
    other = two_addresses.url.replace("127.0.0.1", "127.0.0.2")
    for url in (other, two_addresses.url.replace("127.0.0.1", "localhost")):
        refused = secured.call("PUT", "/v1/handlers/dev-hook", push(url))
        assert refused.status == 400, refused.body
        assert refused.body["error"]["code"] == "secret_not_for_host"
        assert refused.body["error"]["field"] == "params.token"
        assert HOOK_TOKEN not in json.dumps(refused.body)
    defined = secured.call("PUT", "/v1/handlers/dev-hook", push(two_addresses.url))
    assert defined.status == 201, defined.body
    assert secured.call("POST", "/v1/queues/dev-q/messages", {"messages": [{"data": "one"}]}).status in (
        200,
        201,
    )
    await until(lambda: two_addresses.seen, 15.0, "the push to the secret's own host")
    assert [r.headers["Authorization"] for r in two_addresses.seen] == [f"Bearer {HOOK_TOKEN}"]


async def test_a_secret_bound_after_the_definition_is_refused_at_use(
    tmp_path: Path, two_addresses: Receiver
) -> None:
    declared = '[secrets.dev-hook]\nenv = "HOOK_TOKEN"\n'
    config = write_config(tmp_path, LOOPBACK + declared)
    env = {"CAPELLA_ADMIN_PASSWORD": ADMIN_PASSWORD, "HOOK_TOKEN": HOOK_TOKEN}
    server = ServerProcess(tmp_path / "data", config=config, env=env)
    try:
        server.wait_ready()
        secured = Secured(server, server.url)
        grant(secured)
        assert secured.call("PUT", "/v1/queues/dev-q", {}).status == 201
        other = two_addresses.url.replace("127.0.0.1", "127.0.0.2")
        defined = secured.call("PUT", "/v1/handlers/dev-hook", push(other) | {"started": False})
        assert defined.status == 201, defined.body
    finally:
        assert server.stop() == 0
    # The operator binds the secret: the stored definition may no longer send it there.
    config.write_text(config.read_text().replace(declared, declared + 'hosts = ["127.0.0.1"]\n'))
    server = ServerProcess(tmp_path / "data", config=config, env=env)
    try:
        server.wait_ready()
        secured = Secured(server, server.url)
        secured.call("POST", "/v1/queues/dev-q/messages", {"messages": [{"data": "one"}]})
        ran = secured.call("POST", "/v1/handlers/dev-hook/run")
        assert ran.status == 200, ran.body
        assert "may be sent only to 127.0.0.1" in (ran.body["pass"]["error"] or ""), ran.body
        assert two_addresses.seen == []
    finally:
        server.stop()


def test_a_dsn_and_a_cluster_url_are_checked_against_the_hosts(start_secured: StartSecured) -> None:
    extra = LOOPBACK + (
        '[secrets.dev-db]\nenv = "DB_PASSWORD"\nhosts = ["db1.internal"]\n\n'
        '[secrets.dev-dsn]\nenv = "DEV_DSN"\nhosts = ["*.example.com"]\n\n'
        '[secrets.dev-token]\nenv = "FAR_TOKEN"\nhosts = ["127.0.0.1"]\n\n'
    )
    env = {"DB_PASSWORD": "db-pw", "DEV_DSN": "postgresql://app:pw@127.0.0.1:1/db", "FAR_TOKEN": "far-token"}
    secured = start_secured(extra, env=env)
    grant(secured)
    assert secured.call("PUT", "/v1/queues/dev-q", {}).status == 201
    for params, field in (
        (
            {"dsn": "postgresql://app@127.0.0.1:1/db?sslmode=disable", "password_secret": "dev-db"},
            "password_secret",
        ),
        ({"dsn_secret": "dev-dsn"}, "dsn_secret"),
    ):
        body = {"type": "pg_outbox", "started": False, "params": {"to": "dev-q", **params}}
        refused = secured.call("PUT", "/v1/handlers/dev-out", body)
        assert refused.status == 400, refused.body
        assert refused.body["error"]["code"] == "secret_not_for_host"
        assert refused.body["error"]["field"] == f"params.{field}"
        assert "db-pw" not in json.dumps(refused.body) and ":pw@" not in json.dumps(refused.body)

    cluster = {"url": "http://127.0.0.2:1", "token_secret": "dev-token"}
    refused = secured.call("PUT", "/v1/clusters/dev-far", cluster)
    assert refused.status == 400 and refused.body["error"]["code"] == "secret_not_for_host", refused.body
    taken = secured.call("PUT", "/v1/clusters/dev-far", cluster | {"url": "http://127.0.0.1:1"})
    assert taken.status == 201, taken.body
