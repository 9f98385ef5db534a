"""The original's handler, external-cluster and ``capsec`` commands against real Capella servers.

Two Capella processes with authentication, ``west`` and ``east`` (``east`` is ``west``'s
external cluster), are set up only through the original tools: ``capsec`` makes the users and
rules, ``cap exc_add`` the cluster, ``cap h_add`` the handlers of ``config/examples``. A copy
handler then moves messages from ``west`` to ``east`` as its user; answers are compared with
the captures (lists as sets, shapes as key sets). A user with narrow rules tries what ``/v1``
would refuse it. Last, the same ``cap`` commands run against the original ``capserver`` and a
Capella side by side, and their outputs are compared.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.servers import ServerProcess, free_port
from support.wait import holds_blocking, until_blocking

from e2e.test_original import (
    CAPTURES,
    EXAMPLES,
    KIT,
    PASSWORD,
    call,
    cap,
    captured_code,
    capx,
    code_in,
    connection,
    envelope,
    start,
    tool,
)

pytestmark = pytest.mark.slow

AUTH = '[auth]\nenabled = true\nbootstrap_user = "admin"\nbootstrap_password_env = "TEST_ORIGINAL_PWD"\n'
# The servers reach each other on loopback, which the egress policy allows only when listed.
EGRESS = '[egress]\nallow = ["127.0.0.1/32"]\n'
TECH = "example_tech_user"
# How cap prints the original's answer for a handler that never completed (wire/047's body).
NEVER = "0001-01-01 00:00:00 +0000 UTC"


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    tmp = tmp_path_factory.mktemp("pair")
    servers = [
        start(tmp, name, AUTH + EGRESS, env={"TEST_ORIGINAL_PWD": PASSWORD}) for name in ("west", "east")
    ]
    try:
        for server in servers:
            server.wait_ready()
        yield servers[0], servers[1]
    finally:
        for server in servers:
            server.stop()


def capsec(conn: Path, *args: str, who: str = "admin") -> tuple[int, str]:
    return tool("capsec", conn, *args, who=who)


def v1(url: str, path: str, user: str = "admin", password: str = PASSWORD) -> Any:
    request = urllib.request.Request(f"{url}{path}")
    request.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
    with urllib.request.urlopen(request, timeout=10) as resp:
        return json.loads(resp.read())


def original_body(number: str) -> Any:
    return CAPTURES[number]["resp_json"]["responce"]["body"]


def test_capsec_users_and_rules_map_onto_capella_users(
    pair: tuple[ServerProcess, ServerProcess], tmp_path: Path
) -> None:
    _, east = pair
    conn = connection(tmp_path, east.url)
    assert capsec(conn, "-cmd", "create_user", "-un", TECH, "-pwd_flag", "-pwd", PASSWORD)[0] == 0
    code, out = capsec(conn, "-cmd", "create_user", "-un", TECH, "-pwd_flag", "-pwd", PASSWORD)
    assert code == 1 and code_in(out) == captured_code("059")
    # A new user is disabled until enable_user, as in the original.
    assert v1(east.url, f"/v1/users/{TECH}")["enabled"] is False
    assert capsec(conn, "-cmd", "enable_user", "-un", TECH)[0] == 0
    assert capsec(conn, "-cmd", "add_sec_user", "-un", TECH)[0] == 0
    for action, name in (("GET_QUEUE", "*"), ("ADD_MESSAGE", "example_queue2"), ("GET_EXT_CLUSTER", "*")):
        args = ("-cmd", "set_rule", "-un", TECH, "-a", "-ot", "CLUSTER_SELF", "-act", action, "-on", name)
        assert capsec(conn, *args)[0] == 0, action
    args = ("-cmd", "drop_rule", "-un", TECH, "-ot", "CLUSTER_SELF", "-act", "GET_EXT_CLUSTER", "-on", "*")
    assert capsec(conn, *args)[0] == 0
    assert v1(east.url, f"/v1/users/{TECH}")["rules"] == [
        {"effect": "allow", "type": "queue", "action": "read", "name": "*"},
        {"effect": "allow", "type": "queue", "action": "write", "name": "example_queue2"},
    ]
    code, out = capsec(conn, "-cmd", "get_users")
    users = json.loads(out[out.index("[") :])
    assert set(users[0]) == set(original_body("060")[0])
    assert {u["name"] for u in users} == {"admin", TECH}
    rights = capx(conn, "SecurityATRZ_get")["body"]["users"]
    assert set(rights[TECH]) == set(original_body("067")["users"][TECH])
    assert rights[TECH]["rule"]["CLUSTER_SELF"]["GET_QUEUE"] == {"*": True}
    assert rights["admin"]["is_admin"] is True

    # A password change, a disabled user, a dropped user: through capsec, seen through /v1 logins.
    assert capsec(conn, "-cmd", "create_user", "-un", "u1", "-pwd_flag", "-pwd", "p1-long-enough")[0] == 0
    body = json.dumps({"name": "u1", "pwd": "p2-long-enough"})
    assert capx(conn, "SecurityATCB_update_use_cluster", "-body", body)["error"] is None
    assert capsec(conn, "-cmd", "enable_user", "-un", "u1")[0] == 0
    # Signed in with the new password; u1 holds no rules, so no PING right (as the original answers).
    pinged = call(east.url, envelope("ping", user="u1", password="p2-long-enough"))["error"]
    assert pinged["code"] == 10101010, pinged
    assert capsec(conn, "-cmd", "disable_user", "-un", "u1")[0] == 0
    assert call(east.url, envelope("ping", user="u1", password="p2-long-enough"))["error"]["code"] == 10300903
    assert capsec(conn, "-cmd", "drop_user", "-un", "u1")[0] == 0
    assert "u1" not in {u["name"] for u in v1(east.url, "/v1/users")["users"]}
    unknown = capx(conn, "SecurityATRZ_user_role_set", "-body", json.dumps({"name": TECH, "action": "NOPE"}))
    assert unknown["error"]["code"] == 10990006


def test_external_clusters_and_handlers_through_cap(
    pair: tuple[ServerProcess, ServerProcess], tmp_path: Path
) -> None:
    west, east = pair
    # east's example_tech_user and its rules come from the test above (a module runs in order).
    conn = connection(tmp_path, west.url)
    far = connection(tmp_path, east.url)
    # The handlers' user on west: an admin there, made with capsec.
    assert capsec(conn, "-cmd", "create_user", "-un", TECH, "-pwd_flag", "-pwd", PASSWORD)[0] == 0
    assert capsec(conn, "-cmd", "enable_user", "-un", TECH)[0] == 0
    assert capsec(conn, "-cmd", "add_sec_user", "-un", TECH, "-is_admin")[0] == 0
    assert cap(conn, "-cmd", "q_add", "-pf", str(EXAMPLES / "new_queue.json")) == (0, "OK\n")
    assert cap(far, "-cmd", "q_add", "-pf", str(EXAMPLES / "new_queue2.json")) == (0, "OK\n")

    definition = json.loads((EXAMPLES / "new_external_cluster.json").read_text())
    definition["params"]["connection"]["server"] = east.url
    (tmp_path / "ec.json").write_text(json.dumps(definition))
    assert cap(conn, "-cmd", "exc_add", "-pf", str(tmp_path / "ec.json")) == (0, "OK\n")
    code, out = cap(conn, "-cmd", "exc_list")
    assert set(json.loads(out)) == set(original_body("071"))
    code, out = cap(conn, "-cmd", "exc_descr", "-name", "example_external_cluster")
    shown = json.loads(out)
    original = original_body("070")
    assert set(shown) == set(original) and set(shown["params"]) == set(original["params"])
    assert shown["params"]["connection"]["server"] == east.url
    assert shown["params"]["auth_info"] is None  # never shown back, not even encrypted
    stored = v1(west.url, "/v1/clusters/example_external_cluster")["credentials"]
    assert stored == {"kind": "password", "username": TECH, "source": "stored encrypted"}
    bad = {"name": "bad_ec", "type": "http_cluster", "params": {"connection": {"server": east.url}}}
    assert capx(conn, "add_ec", "-body", json.dumps(bad))["error"]["code"] == captured_code("073")
    # The cluster works: a nested call signs in on east as the cluster's user.
    nested = capx(conn, "list_q", "-nest", "example_external_cluster")
    assert "example_queue2" in (nested["body"] or []), nested

    for example in ("copy", "regularly_save", "unload", "delete", "mark"):
        assert cap(conn, "-cmd", "h_add", "-pf", str(EXAMPLES / f"new_{example}_handler.json")) == (0, "OK\n")
    code, out = cap(conn, "-cmd", "h_list")
    assert set(original_body("050")) & set(json.loads(out)) == {"example_queue_to_queue_2_copy_unique"}
    assert len(json.loads(out)) == 5
    code, out = cap(conn, "-cmd", "h_descr", "-name", "example_queue_to_queue_2_copy_unique")
    shown, original = json.loads(out), original_body("049")
    # Every field Capella keeps maps both ways; wait (the original's request timeout) is 0.
    assert shown == original | {"params": original["params"] | {"wait": 0}}
    copy = "example_queue_to_queue_2_copy_unique"
    assert cap(conn, "-cmd", "h_is_started", "-name", copy)[1].strip() == "false"
    assert cap(conn, "-cmd", "h_last_complete", "-name", copy)[1].strip() == NEVER
    assert cap(conn, "-cmd", "h_start", "-name", copy) == (0, "OK\n")
    assert cap(conn, "-cmd", "h_is_started", "-name", copy)[1].strip() == "true"
    msgs = ("-cmd", "q_au", "-name", "example_queue", "-pf", str(EXAMPLES / "new_messages.json"))
    assert cap(conn, *msgs, "-save_mode", "1")[0] == 0

    def copied() -> list[int]:
        _, out = cap(far, "-cmd", "q_get", "-name", "example_queue2", "-qty", "10", "-id", "0")
        return [m["eid"] for m in json.loads(out) or []]

    until_blocking(lambda: len(copied()) == 2, what="both messages copied east")
    assert cap(conn, "-cmd", "h_last_error", "-name", copy)[0] == 0
    assert cap(conn, "-cmd", "h_last_complete", "-name", copy)[1].strip() != NEVER
    # Stop means stop (the original's worker went on copying): nothing more reaches east.
    assert cap(conn, "-cmd", "h_stop", "-name", copy) == (0, "OK\n")
    assert cap(conn, "-cmd", "h_is_started", "-name", copy)[1].strip() == "false"
    runs = v1(west.url, f"/v1/handlers/{copy}")["status"]["runs"]
    more = ("-cmd", "q_au", "-name", "example_queue", "-pf", str(EXAMPLES / "new_messages2.json"))
    assert cap(conn, *more, "-save_mode", "1")[0] == 0
    holds_blocking(lambda: len(copied()) == 2, 1.0, "a stopped copy not copying")
    assert len(copied()) == 2
    assert v1(west.url, f"/v1/handlers/{copy}")["status"]["runs"] == runs

    # The Capella definitions behind the original types.
    kinds = {h["name"]: h["type"] for h in v1(west.url, "/v1/handlers")["handlers"]}
    assert sorted(kinds.values()) == ["archive", "copy", "expire", "flush", "unload"]
    assert {h["user"] for h in v1(west.url, "/v1/handlers")["handlers"]} == {TECH}

    # A flush of a queue on another cluster (wire/090) is the far cluster's own handler's job.
    code, out = cap(conn, "-cmd", "h_add", "-pf", str(EXAMPLES / "new_regularly_save_handler2.json"))
    assert code == 1 and code_in(out) == captured_code("040")
    code, out = cap(conn, "-cmd", "h_start", "-name", "nope")
    assert code == 1 and code_in(out) == captured_code("051")
    bad_h = {"name": "bad_h", "type": "regularly_save", "queue_names": ["example_queue"]}
    bad_h["params"] = {"interval": 0, "wait": 1}
    assert capx(conn, "add_h", "-body", json.dumps(bad_h))["error"]["code"] == captured_code("040")
    # segments as a list, not the original's {"s": [...]}: refused as the bad definition it is
    # (it was an internal error, 10990000), and nothing is defined.
    listed = {"name": "bad_copy", "type": "copy_unique", "queue_names": ["example_queue", "example_queue_2"]}
    listed["params"] = {"segments": [{"from": 1, "to": 2}]}
    assert capx(conn, "add_h", "-body", json.dumps(listed))["error"]["code"] == captured_code("040")
    assert "bad_copy" not in {h["name"] for h in v1(west.url, "/v1/handlers")["handlers"]}

    # The cluster is in use: refused until its handler goes.
    assert cap(conn, "-cmd", "exc_drop", "-name", "example_external_cluster")[0] == 1
    assert cap(conn, "-cmd", "h_drop", "-name", copy) == (0, "OK\n")
    assert cap(conn, "-cmd", "exc_drop", "-name", "example_external_cluster") == (0, "OK\n")
    assert json.loads(cap(conn, "-cmd", "exc_list")[1]) in ([], None)


def test_a_failing_handler_shows_its_error_as_the_original(
    pair: tuple[ServerProcess, ServerProcess], tmp_path: Path
) -> None:
    west, _ = pair
    conn = connection(tmp_path, west.url)
    queue = {"name": "test_queue", "type": "simple_queue", "params": {}}
    assert capx(conn, "add_q", "-body", json.dumps(queue))["error"] is None
    # "nobody" may sign in but holds no rights: a handler running as it fails, as in wire/046.
    assert capsec(conn, "-cmd", "create_user", "-un", "nobody", "-pwd_flag", "-pwd", PASSWORD)[0] == 0
    assert capsec(conn, "-cmd", "enable_user", "-un", "nobody")[0] == 0
    handler = {
        "name": "rs_nobody",
        "user_name": "nobody",
        "type": "regularly_save",
        "queue_names": ["test_queue"],
        "params": {"interval": 200_000_000, "wait": 1_000_000_000},
    }
    assert capx(conn, "add_h", "-body", json.dumps(handler))["error"] is None
    assert cap(conn, "-cmd", "h_start", "-name", "rs_nobody") == (0, "OK\n")
    until_blocking(lambda: capx(conn, "h_last_error", "-object", "rs_nobody")["error"], what="a last error")
    failed = capx(conn, "h_last_error", "-object", "rs_nobody")["error"]
    want = CAPTURES["046"]["resp_json"]["responce"]["error"]
    assert failed["code"] == want["code"] and set(failed) == set(want)
    assert '[user:"nobody"]' in failed["msg"] and "may not" in failed["ie"]["msg"]
    # The numeric codes are the original's; the /v1 code of the pass's error rides in iet.
    assert failed["ie"]["iet"] == "forbidden"
    code, out = cap(conn, "-cmd", "h_last_error", "-name", "rs_nobody")
    assert code == 1 and code_in(out) == want["code"]
    assert cap(conn, "-cmd", "h_last_complete", "-name", "rs_nobody")[1].strip() == NEVER
    assert cap(conn, "-cmd", "h_stop", "-name", "rs_nobody") == (0, "OK\n")


def test_a_limited_user_can_do_through_cluster_only_what_v1_allows(
    pair: tuple[ServerProcess, ServerProcess], tmp_path: Path
) -> None:
    west, east = pair
    conn = connection(tmp_path, west.url)
    assert capsec(conn, "-cmd", "create_user", "-un", "limited", "-pwd_flag", "-pwd", PASSWORD)[0] == 0
    assert capsec(conn, "-cmd", "enable_user", "-un", "limited")[0] == 0
    assert capsec(conn, "-cmd", "add_sec_user", "-un", "limited")[0] == 0
    for action in ("GET_QUEUE", "ADD_USER", "GET_HANDLER"):
        args = ("-cmd", "set_rule", "-un", "limited", "-a", "-ot", "CLUSTER_SELF", "-act", action, "-on", "*")
        assert capsec(conn, *args)[0] == 0
    handler = {
        "name": "limited_h",
        "type": "regularly_save",
        "queue_names": ["example_queue"],
        "params": {"interval": 1_000_000_000},
    }
    assert capx(conn, "add_h", "-body", json.dumps(handler))["error"] is None

    def as_limited(action: str, body: object = None, object_name: str = "") -> dict[str, Any]:
        return call(
            west.url, envelope(action, body, object_name=object_name, user="limited", password=PASSWORD)
        )

    definition = {
        "name": "evil",
        "type": "http_cluster",
        "params": {"connection": {"server": east.url, "query_wait": 5_000_000_000}},
    }
    attacks = [
        ("add_h", {**handler, "name": "mine"}, ""),
        ("add_h", {**handler, "name": "mine", "user_name": "admin"}, ""),
        ("drop_h", "limited_h", ""),
        ("h_stop", None, "limited_h"),
        ("h_start", None, "limited_h"),
        ("add_ec", definition, ""),
        ("drop_ec", "example_external_cluster", ""),
        ("gd_ec", "example_external_cluster", ""),
        ("SecurityATRZ_set_user_admin", {"name": "limited", "is_admin": True}, ""),
        ("SecurityATRZ_add_user", {"name": "limited", "is_admin": True}, ""),
        (
            "SecurityATRZ_user_role_set",
            {"name": "limited", "action": "ADD_QUEUE", "object_name": "*", "allowed": True},
            "",
        ),
        ("SecurityATRZ_drop_user", "admin", ""),
        ("q_add", {"msg": {"msg": "eA=="}, "sm": 1}, "example_queue"),
    ]
    for action, body, name in attacks:
        error = as_limited(action, body, name)["error"]
        assert error is not None and error["code"] == 10110000, (action, error)
    # What the rules do allow: user admin makes users (disabled, without rights); handler read.
    assert (
        as_limited("SecurityATCB_add_use_cluster", {"name": "made", "pwd": "made-by-limited"})["error"]
        is None
    )
    assert v1(west.url, "/v1/users/made")["enabled"] is False
    assert "limited_h" in as_limited("list_h")["body"]
    assert as_limited("h_is_started", None, "limited_h")["body"] is False
    assert as_limited("list_ec")["body"] == []
    # Nothing changed.
    assert v1(west.url, "/v1/users/limited")["admin"] is False
    assert v1(west.url, "/v1/handlers/limited_h")["started"] is False
    assert v1(west.url, "/v1/users/admin")["admin"] is True


# --- beside the original server ----------------------------------------------------------------


@pytest.fixture(scope="module")
def beside(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, ServerProcess, ServerProcess]]:
    """The original capserver (no auth), a Capella, and a second Capella as both's external cluster."""
    tmp = tmp_path_factory.mktemp("beside")
    port = free_port()
    script = KIT / "tools" / "original_server.sh"
    subprocess.run(
        [str(script), str(tmp / "orig"), f"127.0.0.1:{port}", "noauth"], check=True, capture_output=True
    )
    servers = [start(tmp, name) for name in ("here", "far")]
    try:
        for server in servers:
            server.wait_ready()
        until_blocking(
            lambda: (
                subprocess.run(
                    ["python3", "-c", f"import socket; socket.create_connection(('127.0.0.1', {port}), 1)"],
                    capture_output=True,
                ).returncode
                == 0
            )
        )
        yield f"http://127.0.0.1:{port}", servers[0], servers[1]
    finally:
        for server in servers:
            server.stop()
        pid = (tmp / "orig" / "server.pid").read_text().strip()
        os.kill(int(pid), signal.SIGTERM)


def test_handler_and_cluster_commands_answer_as_the_original_server_does(
    beside: tuple[str, ServerProcess, ServerProcess], tmp_path: Path
) -> None:
    original_url, here, far = beside
    far_conn = connection(tmp_path, far.url)
    assert cap(far_conn, "-cmd", "q_add", "-pf", str(EXAMPLES / "new_queue2.json")) == (0, "OK\n")
    definition = json.loads((EXAMPLES / "new_external_cluster.json").read_text())
    definition["params"]["connection"]["server"] = far.url
    (tmp_path / "ec.json").write_text(json.dumps(definition))

    def run(url: str) -> dict[str, Any]:
        conn = connection(tmp_path, url)
        seen: dict[str, Any] = {}
        seen["q_add"] = cap(conn, "-cmd", "q_add", "-pf", str(EXAMPLES / "new_queue.json"))
        seen["exc_add"] = cap(conn, "-cmd", "exc_add", "-pf", str(tmp_path / "ec.json"))
        seen["exc_list"] = json.loads(cap(conn, "-cmd", "exc_list")[1])
        seen["exc_descr"] = json.loads(cap(conn, "-cmd", "exc_descr", "-name", "example_external_cluster")[1])
        for example in ("copy", "regularly_save", "unload", "delete", "mark"):
            seen[f"h_add {example}"] = cap(
                conn, "-cmd", "h_add", "-pf", str(EXAMPLES / f"new_{example}_handler.json")
            )
        seen["h_list"] = set(json.loads(cap(conn, "-cmd", "h_list")[1]))
        for name in seen["h_list"]:
            seen[f"h_descr {name}"] = json.loads(cap(conn, "-cmd", "h_descr", "-name", name)[1])
        copy = "example_queue_to_queue_2_copy_unique"
        for command in (
            "h_is_started",
            "h_last_complete",
            "h_start",
            "h_is_started",
            "h_stop",
            "h_is_started",
        ):
            seen.setdefault(command, []).append(cap(conn, "-cmd", command, "-name", copy))
        code, out = cap(conn, "-cmd", "h_start", "-name", "nope")
        seen["h_start nope"] = (code, code_in(out))
        code, out = cap(conn, "-cmd", "exc_descr", "-name", "nope")
        seen["exc_descr nope"] = (code, code_in(out))
        seen["h_drop"] = cap(conn, "-cmd", "h_drop", "-name", copy)
        seen["h_list after"] = set(json.loads(cap(conn, "-cmd", "h_list")[1]))
        return seen

    original, capella = run(original_url), run(here.url)
    assert set(original) == set(capella)
    for key in original:
        want, got = original[key], capella[key]
        if key == "exc_descr":
            assert set(got) == set(want) and set(got["params"]) == set(want["params"])
            assert got["params"]["connection"]["server"] == want["params"]["connection"]["server"]
            assert got["params"]["user_name"] == want["params"]["user_name"]
        elif key.startswith("h_descr"):
            # Fields Capella keeps are equal; the ones it has no use for come back as 0.
            assert set(got) == set(want) and set(got["params"]) == set(want["params"]), key
            assert {k: v for k, v in got.items() if k != "params"} == {
                k: v for k, v in want.items() if k != "params"
            }, key
            kept = {k for k, v in got["params"].items() if v != 0}
            assert {k: got["params"][k] for k in kept} == {k: want["params"][k] for k in kept}, key
        elif key == "exc_descr nope":
            assert got[0] == want[0] == 1
        else:
            assert got == want, key
