"""Users and tokens from the clients and the command line, against a real ``capella serve``.

One server per module runs with ``[auth] enabled = true``; its first admin is written into
the data directory before it starts, as an operator would bootstrap it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from conftest import ServerProcess

from capella.auth.store import AuthStore
from capella.client import AsyncClient, Client
from capella.errors import Forbidden, TokenNotFound, Unauthorized, UserNotFound

pytestmark = pytest.mark.slow  # a real server process per module

ADMIN = "admin"
ADMIN_PASSWORD = "admin-secret-1"


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("auth")
    AuthStore(root / "data" / "auth").add_user(ADMIN, ADMIN_PASSWORD, admin=True)
    config = root / "capella.toml"
    config.write_text("[auth]\nenabled = true\n")
    server = ServerProcess(root / "data", config=config)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture
async def admin(auth_server: ServerProcess) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(auth_server.url, timeout=10.0, username=ADMIN, password=ADMIN_PASSWORD) as c:
        yield c


# --- client ------------------------------------------------------------------------------


async def test_client_users_are_created_listed_changed_and_dropped(admin: AsyncClient) -> None:
    created = await admin.put_user("c-alice", password="alice-pass-1", rules=["allow:queue:read:c-*"])
    assert (created["name"], created["admin"], created["enabled"]) == ("c-alice", False, True)
    assert "password_hash" not in created

    assert "c-alice" in [u["name"] for u in await admin.users()]
    rules = (await admin.user("c-alice"))["rules"]
    assert rules == [{"effect": "allow", "type": "queue", "action": "read", "name": "c-*"}]
    assert (await admin.put_user("c-alice", enabled=False))["enabled"] is False

    await admin.drop_user("c-alice")
    with pytest.raises(UserNotFound):
        await admin.user("c-alice")


async def test_client_me_and_a_password_change_with_the_old_password(
    admin: AsyncClient, auth_server: ServerProcess
) -> None:
    await admin.put_user("c-bob", password="bob-pass-1")
    async with AsyncClient(auth_server.url, username="c-bob", password="bob-pass-1") as bob:
        assert await bob.me() == {"user": "c-bob", "admin": False, "via": "basic", "rules": []}
        with pytest.raises(Unauthorized):
            await bob.change_password("c-bob", "bob-pass-2")  # no old password
        await bob.change_password("c-bob", "bob-pass-2", old_password="bob-pass-1")
        with pytest.raises(Unauthorized):
            await bob.me()  # the old password stops working at once
    async with AsyncClient(auth_server.url, username="c-bob", password="bob-pass-2") as bob:
        assert (await bob.me())["user"] == "c-bob"
        assert await bob.users() == []  # only the users bob may read
        with pytest.raises(Forbidden):
            await bob.put_user("c-bob", admin=True)


async def test_client_tokens_are_created_listed_used_and_revoked(
    admin: AsyncClient, auth_server: ServerProcess
) -> None:
    answer = await admin.create_token(ttl="1h", description="client test")
    assert answer["token"].startswith("cap_")
    assert (answer["user"], answer["description"]) == (ADMIN, "client test")
    assert answer["expires"] - answer["created"] == pytest.approx(3600)
    listed = {t["id"]: t for t in await admin.tokens()}
    assert "token" not in listed[answer["id"]]

    with Client(auth_server.url, timeout=10.0, token=answer["token"]) as by_token:
        assert by_token.me()["via"] == "token"
        with pytest.raises(Forbidden):
            by_token.create_token()  # a token cannot make more tokens
        await admin.revoke_token(answer["id"])
        with pytest.raises(Unauthorized):
            by_token.me()
    with pytest.raises(TokenNotFound):
        await admin.revoke_token(answer["id"])


def test_the_blocking_client_manages_users_for_another_user_s_token(auth_server: ServerProcess) -> None:
    with Client(auth_server.url, timeout=10.0, username=ADMIN, password=ADMIN_PASSWORD) as client:
        client.put_user("c-carol", password="carol-pass-1", rules=[])
        token = client.create_token(ttl=60, user="c-carol")
        assert token["user"] == "c-carol"
        assert token["id"] in [t["id"] for t in client.tokens()]
        client.change_password("c-carol", "carol-pass-2")  # an admin needs no old password
        assert client.user("c-carol")["name"] == "c-carol"
        client.drop_user("c-carol")
        assert token["id"] not in [t["id"] for t in client.tokens()]  # revoked with its user
        assert "c-carol" not in [u["name"] for u in client.users()]
