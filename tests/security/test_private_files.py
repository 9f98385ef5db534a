"""Everything under the data directory is private to the broker's user whatever the umask:
files 0600, directories 0700; a looser tree is fixed at start, with a warning naming each path."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import stat
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.servers import ServerProcess

from capella.auth.store import AuthStore
from capella.storage.file import FileStorage
from security.conftest import Answer, Secured, StartSecured

pytestmark = pytest.mark.slow


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    """The umask a server started inside inherits (the usual one of a login shell, 022)."""
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def modes(root: Path) -> dict[str, int]:
    """Every file and directory under ``root`` (and ``root`` itself) → its permission bits."""
    found = {".": stat.S_IMODE(root.stat().st_mode)}
    for path in root.rglob("*"):
        found[str(path.relative_to(root))] = stat.S_IMODE(path.lstat().st_mode)
    return found


def not_private(root: Path) -> dict[str, str]:
    """The paths under ``root`` that are neither a 0600 file, a 0700 directory nor a symlink."""
    return {
        name: oct(mode)
        for name, mode in modes(root).items()
        if not (root / name).is_symlink() and mode != (0o700 if (root / name).is_dir() else 0o600)
    }


def ok(answer: Answer) -> None:
    assert 200 <= answer.status < 300, answer.body


def test_definitions_secrets_and_messages_are_0600_in_0700_under_umask_022(
    start_secured: StartSecured,
) -> None:
    with umask(0o022):
        secured: Secured = start_secured()
    data = secured.server.data_dir
    admin = {"user": "admin"}
    ok(secured.call("PUT", "/v1/queues/orders", {"block": {"max_messages": 5}}, **admin))
    for i in range(12):
        ok(secured.call("POST", "/v1/queues/orders/messages?save=immediate", {"data": f"m{i}"}, **admin))
    later = {"data": "later", "delay": "1h"}
    ok(secured.call("POST", "/v1/queues/orders/messages?save=immediate", later, **admin))
    ok(secured.call("PUT", "/v1/queues/orders/subscriptions/reader", {}, **admin))
    ok(secured.call("GET", "/v1/queues/orders/subscriptions/reader/messages", **admin))
    handler = {"type": "expire", "queues": ["orders"], "params": {"max_age": "7d", "interval": "10m"}}
    ok(secured.call("PUT", "/v1/handlers/expire-orders", handler, **admin))
    # An external cluster is only stored: nothing connects to its URL. The password is kept encrypted
    # under the cluster's key file, which is created for it.
    definition = {"url": "http://127.0.0.1:9/", "username": "copier", "password": "cluster-password"}
    ok(secured.call("PUT", "/v1/clusters/dc2", definition, **admin))
    ok(secured.call("POST", "/v1/tokens", {}, **admin))

    written = modes(data)
    for name in (".capella/queues.json", ".capella/handlers.json", ".capella/clusters.json"):
        assert f"queues/{name}" in written
    assert {"auth/users.json", "auth/tokens.json"} <= written.keys()
    assert any(name.startswith("keys/") for name in written)
    assert any(name.endswith(".blk") or "/blocks/" in name for name in written), sorted(written)
    assert not_private(data) == {}

    # What a clean stop writes (flushed state, cursors) is private too.
    assert secured.server.stop() == 0
    assert not_private(data) == {}
    assert "permissions for others" not in secured.server.log_path.read_text()


async def test_a_looser_data_directory_is_fixed_at_start_and_each_path_named(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with umask(0o022):
        first = ServerProcess(data)
    try:
        await asyncio.to_thread(first.wait_ready)
        await asyncio.to_thread(seed, first)
    finally:
        assert first.stop() == 0
    # As an older version, a restore or a hand left it: readable (and partly writable) by others.
    for i in range(10):
        (data / "restored" / str(i)).mkdir(parents=True)
    for path in [data, *data.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    (data / "queues" / ".capella" / "handlers.json").chmod(0o666)
    (data / "notes.txt").write_text("left by hand")
    (data / "notes.txt").chmod(0o604)
    outside = tmp_path / "outside.txt"
    outside.write_text("not the broker's")
    outside.chmod(0o644)
    (data / "link-to-outside").symlink_to(outside)
    loose = {name for name, mode in modes(data).items() if mode & 0o077 and name != "link-to-outside"}
    assert len(loose) > 20

    with umask(0o022):
        second = ServerProcess(data)
    try:
        await asyncio.to_thread(second.wait_ready)
        log = second.log()
    finally:
        assert second.stop() == 0
    assert not_private(data) == {}
    # A symbolic link is neither followed nor changed.
    assert stat.S_IMODE(outside.stat().st_mode) == 0o644
    warnings = [line for line in log.splitlines() if "permissions for others removed" in line]
    assert "handlers.json mode=0666 now=0600" in log
    assert "notes.txt mode=0604 now=0600" in log
    # The first 20 by path are named, the rest counted.
    named = [line for line in warnings if " path=" in line]
    assert len(named) == 20
    assert f"path={data} mode=0755 now=0700" in named[0]
    assert f"removed from {len(loose) - 20} more paths under {data} (0 could not be changed)" in log


def seed(server: ServerProcess) -> None:
    """A queue with sealed blocks and a handler, written by a server with auth off."""

    def call(method: str, path: str, body: object) -> None:
        request = urllib.request.Request(
            server.url + path,
            data=json.dumps(body).encode(),
            method=method,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as resp:
            assert resp.status < 300

    call("PUT", "/v1/queues/orders", {"block": {"max_messages": 5}})
    for i in range(12):
        call("POST", "/v1/queues/orders/messages?save=immediate", {"data": f"m{i}"})
    handler = {"type": "expire", "queues": ["orders"], "params": {"max_age": "7d"}}
    call("PUT", "/v1/handlers/expire-orders", handler)


async def test_an_odd_umask_neither_opens_files_to_others_nor_locks_the_broker_out(tmp_path: Path) -> None:
    # 0277 would leave a new file read-only for its owner: the next journal open would fail.
    store = FileStorage(tmp_path / "mount")
    with umask(0o277):
        await store.put("q/meta.json", b"{}")
        journal = await store.journal("q/blocks/1.journal")
        await journal.append_and_sync(b"record")
        await journal.close()
    reopened = await store.journal("q/blocks/1.journal")
    await reopened.close()
    assert not_private(tmp_path / "mount") == {}


def test_a_temporary_file_left_by_a_crash_does_not_keep_its_mode(tmp_path: Path) -> None:
    users = AuthStore(tmp_path / "auth")
    users.add_user("root", "root-password", admin=True)
    left = tmp_path / "auth" / "users.tmp"
    left.write_text("half written")
    left.chmod(0o644)
    with umask(0o022):
        users.add_user("other", "other-password")
    assert not_private(tmp_path / "auth") == {}
