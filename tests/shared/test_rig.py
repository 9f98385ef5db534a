"""The shared-cluster rig itself: N nodes start on one PostgreSQL and one bucket, die, come back,
and a node whose ``[shared]`` table is wrong refuses to start, naming the key."""

from __future__ import annotations

import json
import signal
import tomllib
import urllib.request

import pytest
from support.shared import CLUSTER, MOUNT, SharedRig

from capella.config import load_config
from capella.storage import open_storage

pytestmark = pytest.mark.slow


def healthz(url: str) -> tuple[int, dict[str, object]]:
    with urllib.request.urlopen(f"{url}/healthz", timeout=5.0) as resp:
        return resp.status, json.loads(resp.read() or b"{}")


def test_three_nodes_start_on_one_database_and_one_bucket(shared_rig: SharedRig) -> None:
    nodes = shared_rig.start(3)

    assert len({node.url for node in nodes}) == 3
    for i, node in enumerate(nodes):
        assert healthz(node.url)[0] == 200
        config = tomllib.loads(shared_rig.config_path(i).read_text())
        assert config["cluster"]["name"] == CLUSTER
        assert config["shared"] == {
            "node": f"node-{i}",
            "mount": MOUNT,
            "dsn": shared_rig.dsn,
            "flush_interval": "100ms",
        }
        assert config["mounts"][MOUNT]["bucket"] == shared_rig.bucket
        assert config["mounts"]["default"] == {"provider": "file", "path": "queues"}
    assert shared_rig.pg.psql(shared_rig.database, "select current_database()").strip() == shared_rig.database


def test_a_killed_node_comes_back_on_its_port_and_data_dir(shared_rig: SharedRig) -> None:
    shared_rig.start(2)
    before = shared_rig.node(1)
    shared_rig.kill(1)
    assert before.process.returncode == -signal.SIGKILL
    assert not shared_rig.running(1)
    assert healthz(shared_rig.node(0).url)[0] == 200

    after = shared_rig.restart(1)
    assert after is not before
    assert (after.url, after.data_dir) == (before.url, before.data_dir)
    assert healthz(after.url)[0] == 200
    # One log per node, kept across its lives.
    assert shared_rig.node(1).log_path == before.log_path


@pytest.mark.shared_rig(flush_interval="50ms", shared={"flush_bytes": "1MiB"})
def test_rig_options_reach_each_node_s_config(shared_rig: SharedRig) -> None:
    config = tomllib.loads(shared_rig.config_text(2))
    assert config["shared"]["flush_interval"] == "50ms"
    assert config["shared"]["flush_bytes"] == "1MiB"
    assert config["shared"]["node"] == "node-2"


@pytest.mark.parametrize(
    ("shared", "mounts", "message"),
    [
        ({"mount": "nowhere"}, None, "shared.mount 'nowhere' is not a configured mount"),
        (
            {"mount": "default"},
            None,
            "shared.mount 'default' is a file mount: shared queues need an s3 mount",
        ),
        ({"dsn_secret": "shared-dsn"}, None, "shared: give one of dsn and dsn_secret"),
        ({"dsn": None}, None, "shared: give one of dsn and dsn_secret"),
        (
            {"flush_intervall": "1s"},
            None,
            "unknown key shared.flush_intervall (did you mean shared.flush_interval?)",
        ),
        ({"node": "a/b"}, None, "shared.node 'a/b'"),
    ],
)
def test_a_node_with_a_broken_shared_table_refuses_to_start_naming_the_key(
    shared_rig: SharedRig, shared: dict[str, str | None], mounts: str | None, message: str
) -> None:
    text = shared_rig.config_text(0, shared=shared, mounts=mounts)
    if "dsn_secret" in shared:
        text += '\n[secrets.shared-dsn]\nenv = "CAPELLA_TEST_SHARED_DSN"\n'

    code, output = shared_rig.refusal(0, text)

    assert code == 2, output
    assert message in output
    assert str(shared_rig.config_path(0)) in output
    assert not shared_rig.running(0)


@pytest.mark.shared_rig(durable=True)
def test_a_durable_rig_has_a_postgresql_of_its_own_that_fsyncs(
    shared_rig: SharedRig, pg_server: object
) -> None:
    assert shared_rig.pg is not pg_server
    show = [
        shared_rig.pg.psql(shared_rig.database, f"show {name}").strip()
        for name in ("fsync", "synchronous_commit", "full_page_writes")
    ]
    assert show == ["on", "on", "on"]
    shared_rig.start(1)
    shared_rig.pg.stop("immediate")
    shared_rig.pg.start()
    assert shared_rig.pg.psql(shared_rig.database, "select 1").strip() == "1"
    assert healthz(shared_rig.node(0).url)[0] == 200


def test_the_session_postgresql_stays_fast(pg_server: object) -> None:
    from support.pg import PgServer

    assert isinstance(pg_server, PgServer) and not pg_server.durable
    assert pg_server.psql("postgres", "show synchronous_commit").strip() == "off"


@pytest.mark.shared_rig(proxy=True)
async def test_a_proxied_rig_counts_each_kind_of_s3_call_of_a_node_s_mount(shared_rig: SharedRig) -> None:
    config = load_config(shared_rig.write_config(0))
    assert config.shared is not None and config.shared.node == "node-0"
    mount = config.mounts[config.shared.mount]
    assert shared_rig.proxy is not None and mount.options["endpoint_url"] == shared_rig.proxy.url
    store = open_storage(mount.provider, mount.options)
    try:
        await store.put("shared/2026/12/02/node-0/x.cpo", b"0123456789")
        assert await store.get_range("shared/2026/12/02/node-0/x.cpo", 2, 3) == b"234"
        assert await store.get("shared/2026/12/02/node-0/x.cpo") == b"0123456789"
        assert await store.list("shared/") == ["shared/2026/12/02/node-0/x.cpo"]
    finally:
        await store.close()
    assert shared_rig.proxy.calls == {"PUT": 1, "GET range": 1, "GET": 1, "LIST": 1}
    assert shared_rig.objects() == ["shared/2026/12/02/node-0/x.cpo"]
    assert shared_rig.sql("select 40 + 2").strip() == "42"
