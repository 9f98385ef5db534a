"""A stored ciphertext is bound to its definition: moved elsewhere, it does not decrypt.

Issue 20: a ``PUT`` with another handler's ``dsn_password_encrypted`` beside a new host sent
that handler's password to the new host. The API now refuses ``*_encrypted`` params, and a
ciphertext is AES-GCM sealed with the handler's name and DSN (a cluster's name, URL and user) as
associated data, so even one copied inside the registry file sends nothing.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import msgspec
import orjson
import pytest
from cryptography.fernet import Fernet

from capella.auth.sealed import Sealer
from capella.core.cluster import Cluster
from capella.errors import CorruptData, InvalidRequest
from capella.handlers.supervisor import Supervisor
from capella.links.registry import Links
from capella.storage.keys import HANDLERS as REGISTRY_KEY
from security.fake_pg import FakePostgres, serving

PASSWORD = "the-real-password"


@pytest.fixture
def fake_pg() -> Iterator[FakePostgres]:
    yield from serving()


@pytest.fixture
async def cluster(cluster: Cluster) -> Cluster:
    """The conftest's cluster, with the queue "q"."""
    await cluster.put_queue("q", {})
    return cluster


def supervisor(cluster: Cluster, tmp_path: Path) -> Supervisor:
    return Supervisor(cluster, links=Links(cluster, key_file=tmp_path / "keys" / "links.key"))


async def test_a_ciphertext_moved_to_another_handler_or_host_sends_nothing(
    cluster: Cluster, tmp_path: Path, fake_pg: FakePostgres
) -> None:
    first = supervisor(cluster, tmp_path)
    await first.start()
    dsn = f"postgresql://app:{PASSWORD}@127.0.0.1:{fake_pg.port}/db?sslmode=disable"
    try:
        await first.put("a", {"type": "pg_inbox", "queue": "q", "params": {"dsn": dsn}, "started": False})
        # The handler's own ciphertext works: the fake server gets the password.
        await first.run_now("a")
        assert fake_pg.passwords == [PASSWORD]
    finally:
        await first.close()
    stored = orjson.loads(await cluster.home.get(REGISTRY_KEY))
    entry = stored["handlers"]["a"]
    assert entry["params"]["dsn_password_encrypted"].startswith("v2:")
    assert PASSWORD.encode() not in await cluster.home.get(REGISTRY_KEY)
    # Copied under another handler's name, and beside another host (the same port: still the
    # fake server, which would record anything sent).
    elsewhere = orjson.loads(orjson.dumps(entry))
    elsewhere["params"]["dsn"] = f"postgresql://app@localhost:{fake_pg.port}/db?sslmode=disable"
    stored["handlers"] = {"a": elsewhere, "b": entry}
    await cluster.home.put(REGISTRY_KEY, orjson.dumps(stored))

    again = supervisor(cluster, tmp_path)
    await again.start()
    try:
        for name in ("a", "b"):
            shown = msgspec.to_builtins((await again.run_now(name)).info())
            assert "cannot be decrypted" in shown["status"]["last_error"]["message"], shown
            assert "dsn_password_encrypted" not in shown["params"]
    finally:
        await again.close()
    assert fake_pg.passwords == [PASSWORD]


async def test_the_api_refuses_any_ciphertext_param(cluster: Cluster, tmp_path: Path) -> None:
    api = supervisor(cluster, tmp_path)
    await api.start()
    try:
        for key in ("dsn_password_encrypted", "password_encrypted"):
            params = {"dsn": "postgresql://app@127.0.0.1:1/db", key: "v2:AAAA"}
            with pytest.raises(InvalidRequest) as refused:
                await api.put("a", {"type": "pg_inbox", "queue": "q", "params": params})
            assert refused.value.details["field"] == f"params.{key}"
    finally:
        await api.close()


async def test_an_older_unbound_ciphertext_is_read_and_sealed_bound(cluster: Cluster, tmp_path: Path) -> None:
    sealer = Links(cluster, key_file=tmp_path / "keys" / "links.key").sealer
    sealed = sealer.encrypt("x", ("any",))  # creates the key file
    assert sealed.startswith("v2:")
    legacy = Fernet(sealer._key()).encrypt(PASSWORD.encode()).decode()
    definition = {
        "type": "pg_inbox",
        "queues": ["q"],
        "params": {"dsn": "postgresql://app@127.0.0.1:1/db", "dsn_password_encrypted": legacy},
        "started": False,
        "user": None,
    }
    await cluster.home.put(REGISTRY_KEY, orjson.dumps({"version": 1, "handlers": {"old": definition}}))
    loaded = supervisor(cluster, tmp_path)
    await loaded.start()
    try:
        assert msgspec.to_builtins(loaded.handler("old").info())["params"]["password"] == "stored encrypted"
        await loaded.stop_handler("old")  # any save writes the bound form
        await loaded.start_handler("old")
        await loaded.stop_handler("old")
    finally:
        await loaded.close()
    rewritten = orjson.loads(await cluster.home.get(REGISTRY_KEY))["handlers"]["old"]["params"]
    assert rewritten["dsn_password_encrypted"].startswith("v2:")


async def test_a_cluster_ciphertext_is_bound_to_the_cluster(cluster: Cluster, tmp_path: Path) -> None:
    links = Links(cluster, key_file=tmp_path / "keys" / "links.key")
    await links.start()
    await links.put("a", {"url": "http://a.example", "username": "u", "password": PASSWORD})
    await links.put("b", {"url": "http://b.example"})
    doc = orjson.loads(await cluster.home.get(".capella/clusters.json"))
    doc["clusters"]["b"]["credentials"] = doc["clusters"]["a"]["credentials"]
    await cluster.home.put(".capella/clusters.json", orjson.dumps(doc))
    again = Links(cluster, key_file=tmp_path / "keys" / "links.key")
    await again.start()
    assert again.link("a").secret == PASSWORD
    moved = again.link("b")
    assert moved.secret is None and moved.error is not None and "cannot be decrypted" in moved.error
    assert msgspec.to_builtins(moved.info())["error"] == moved.error
    with pytest.raises(Exception, match="cannot be decrypted"):
        await again.client("b")


def test_a_tampered_ciphertext_is_refused(tmp_path: Path) -> None:
    sealer = Sealer(tmp_path / "links.key")
    token = sealer.encrypt(PASSWORD, ("pg handler", "a"))
    raw = bytearray(base64.urlsafe_b64decode(token[3:]))
    raw[-1] ^= 1
    with pytest.raises(CorruptData):
        sealer.decrypt("v2:" + base64.urlsafe_b64encode(bytes(raw)).decode(), ("pg handler", "a"))
    with pytest.raises(CorruptData):
        sealer.decrypt(token, ("pg handler", "b"))
    assert sealer.decrypt(token, ("pg handler", "a")) == PASSWORD
