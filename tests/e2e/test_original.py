"""The original Capella's tools (../shared/original/bin) against real Capella servers.

``cap``, ``capx`` and a raw envelope client talk to Capella processes started with
``[compat] original = true``: one without authentication (with two more behind it as its
external clusters, for nested calls), and one with authentication, for logins and a user with
narrow rules. Answers are compared with the original server's, from the captures in
``wire/curated.json``: the error codes, and the shapes of what succeeds (ids and times differ).
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.servers import ServerProcess, running

pytestmark = pytest.mark.slow

KIT = Path(
    os.environ.get("CAPELLA_ORIGINAL_KIT", Path(__file__).resolve().parents[3] / "shared" / "original")
)
if not (KIT / "bin" / "cap").exists():
    KIT = Path("/work/shared/original")
BIN = KIT / "bin"
EXAMPLES = KIT / "config" / "examples"
PASSWORD = "Pa$$w0rd"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (BIN / "cap").exists(), reason="the original's tools are not here"),
]


def captured() -> dict[str, dict[str, Any]]:
    entries = json.loads((KIT / "wire" / "curated.json").read_text())
    return {e["file"].split("_", 1)[0]: e for e in entries}


CAPTURES = captured()


def captured_code(number: str) -> int:
    return int(CAPTURES[number]["resp_json"]["responce"]["error"]["code"])


def start(tmp: Path, name: str, extra: str = "", env: dict[str, str] | None = None) -> ServerProcess:
    config = tmp / f"{name}.toml"
    config.write_text(f'[cluster]\nname = "{name}"\n[compat]\noriginal = true\n{extra}')
    return ServerProcess(tmp / name, config=config, env=env)


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ServerProcess]]:
    """alpha -> beta -> gamma (external clusters to_b, to_c), and gamma -> alpha (to_a) for a loop."""
    tmp = tmp_path_factory.mktemp("chain")
    servers = [start(tmp, name) for name in ("alpha", "beta", "gamma")]
    try:
        for server in servers:
            server.wait_ready()
        a, b, c = servers
        put(f"{a.url}/v1/clusters/to_b", {"url": b.url})
        put(f"{b.url}/v1/clusters/to_c", {"url": c.url})
        put(f"{c.url}/v1/clusters/to_a", {"url": a.url})
        yield servers
    finally:
        for server in servers:
            server.stop()


@pytest.fixture(scope="module")
def secured_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("secured")
    auth = '[auth]\nenabled = true\nbootstrap_user = "admin"\nbootstrap_password_env = "TEST_ORIGINAL_PWD"\n'
    yield from running(start(tmp, "secure", auth, env={"TEST_ORIGINAL_PWD": PASSWORD}))


def put(url: str, body: object, user: str | None = None) -> None:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="PUT")
    request.add_header("Content-Type", "application/json")
    if user is not None:
        request.add_header(
            "Authorization", "Basic " + base64.b64encode(f"{user}:{PASSWORD}".encode()).decode()
        )
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert resp.status in (200, 201)


def connection(tmp: Path, url: str, compress: str = "gzip") -> Path:
    path = tmp / f"conn-{abs(hash((url, compress)))}.json"
    subprocess.run(
        ["python3", str(KIT / "tools" / "mkconn.py"), url, "--out", str(path), "--compress", compress],
        check=True,
        capture_output=True,
    )
    return path


def tool(name: str, conn: Path, *args: str, who: str = "admin") -> tuple[int, str]:
    done = subprocess.run(
        [str(BIN / name), "-cf", str(conn), "-cn", who, *args], capture_output=True, text=True, timeout=30
    )
    return done.returncode, done.stdout + done.stderr


def add_from(conn: Path, examples_file: str, save_mode: str) -> tuple[int, str]:
    """``cap -cmd q_au``: the messages of one of the kit's example files into example_queue."""
    path = str(EXAMPLES / examples_file)
    return cap(conn, "-cmd", "q_au", "-name", "example_queue", "-pf", path, "-save_mode", save_mode)


def cap(conn: Path, *args: str, who: str = "admin") -> tuple[int, str]:
    return tool("cap", conn, *args, who=who)


def capx(conn: Path, action: str, *args: str, who: str = "admin") -> dict[str, Any]:
    _, out = tool("capx", conn, "-action", action, *args, who=who)
    answer: dict[str, Any] = json.loads(out[out.index("{") :])
    return answer


def code_in(out: str) -> int:
    return int(out.split("[", 1)[1].split("]", 1)[0])


def envelope(
    action: str,
    body: object = None,
    *,
    object_name: str = "",
    user: str = "",
    password: str | None = None,
    offset_ns: int = 0,
    wait_ns: int = 5_000_000_000,
    prefer: str = "",
) -> dict[str, Any]:
    request: dict[str, Any] = {"name": "", "user": "", "action": action}
    if body is not None:
        request["body"] = body
    if object_name:
        request["object_name"] = object_name
    return {
        "auth_type": "basic" if password is not None else "",
        "user_name": user,
        "auth_info": None if password is None else base64.b64encode(json.dumps(password).encode()).decode(),
        "wait": wait_ns,
        "current_time": time.time_ns() + offset_ns,
        "prefer_content_type": prefer,
        "replace_name_force": False,
        "request": request,
    }


def raw_call(url: str, data: bytes, compress_type: str = "") -> tuple[int, dict[str, str], dict[str, Any]]:
    request = urllib.request.Request(f"{url}/cluster", data=data, method="POST")
    request.add_header("Compress-Type", compress_type)
    with urllib.request.urlopen(request, timeout=10) as resp:
        status, headers, body = resp.status, dict(resp.headers), resp.read()
    if headers.get("Compress-Type") == "gzip":
        body = gzip.decompress(body)
    answer: dict[str, Any] = json.loads(body)
    return status, headers, answer


def call(url: str, env: dict[str, Any], compress_type: str = "") -> dict[str, Any]:
    data = json.dumps(env).encode()
    if compress_type:
        data = gzip.compress(data)
    status, _, answer = raw_call(url, data, compress_type)
    assert status == 200
    responce: dict[str, Any] = answer["responce"]
    return responce


# --- the kit's README commands ------------------------------------------------------------


def test_cap_commands_answer_as_the_original(chain: list[ServerProcess], tmp_path: Path) -> None:
    alpha = chain[0]
    conn = connection(tmp_path, alpha.url)
    assert cap(conn, "-cmd", "ping") == (0, "OK\n")
    assert cap(conn, "-cmd", "ping", who="empty") == (0, "OK\n")
    assert cap(conn, "-cmd", "cluster_name_get")[1].strip() == "alpha"
    code, out = cap(conn, "-cmd", "next_id")
    first = int(out)
    code, out = cap(conn, "-cmd", "next_ids", "-qty", "3")
    ids = json.loads(out)
    assert len(ids) == 3 and first < ids[0] < ids[1] < ids[2] < 2**63

    assert cap(conn, "-cmd", "q_add", "-pf", str(EXAMPLES / "new_queue.json")) == (0, "OK\n")
    code, out = cap(conn, "-cmd", "q_add", "-pf", str(EXAMPLES / "new_queue.json"))
    assert code == 1 and code_in(out) == captured_code("006")
    assert cap(conn, "-cmd", "q_add", "-pf", str(EXAMPLES / "new_queue2.json")) == (0, "OK\n")
    code, out = cap(conn, "-cmd", "q_list")
    assert set(json.loads(out)) == set(CAPTURES["011"]["resp_json"]["responce"]["body"])
    code, out = cap(conn, "-cmd", "q_descr", "-name", "example_queue")
    description = json.loads(out)
    original = CAPTURES["010"]["resp_json"]["responce"]["body"]
    assert set(description) == set(original)
    assert set(description["params"]) == set(original["params"])
    for key in ("cnt_limit", "time_limit", "len_limit", "segments", "default_save_mod"):
        assert description["params"][key] == original["params"][key], key

    code, out = add_from(conn, "new_messages.json", save_mode="2")
    assert code == 0 and len(json.loads(out)) == 2
    first_ids = json.loads(out)
    # The same identities again (src1/99, src1/100) answer the same ids: dedup by (src, eid).
    code, out = add_from(conn, "new_messages2.json", save_mode="1")
    again = json.loads(out)
    assert again[1] == first_ids[1] and len(set(again)) == 3
    code, out = cap(conn, "-cmd", "q_get", "-name", "example_queue", "-qty", "10", "-id", "0")
    messages = json.loads(out)
    assert [(m["src"], m["eid"]) for m in messages] == [
        ("src1", 99),
        ("src1", 100),
        ("src2", 99),
        ("src3", 100),
    ]
    shape = CAPTURES["021"]["resp_json"]["responce"]["body"][0]
    assert set(messages[0]) == set(shape)
    assert base64.b64decode(messages[0]["msg"]) == b"Hello world!"
    code, out = cap(conn, "-cmd", "q_get", "-name", "no_such_queue", "-qty", "1", "-id", "0")
    assert code == 1 and code_in(out) == captured_code("023")

    assert cap(conn, "-cmd", "q_drop", "-name", "example_queue2") == (0, "OK\n")
    code, out = cap(conn, "-cmd", "q_drop", "-name", "example_queue2")
    assert code == 1 and code_in(out) == captured_code("009")


def test_capx_actions_and_their_error_codes(chain: list[ServerProcess], tmp_path: Path) -> None:
    conn = connection(tmp_path, chain[0].url, compress="")
    put(f"{chain[0].url}/v1/queues/capx_q", {"segments": {"min": -1000, "max": 1000}})
    one = {"msg": {"eid": 1001, "s_dt": 1700000000, "msg": "c2luZ2xl", "src": "capx", "sg": 2}, "sm": 1}
    added = capx(conn, "q_add", "-object", "capx_q", "-body", json.dumps(one))
    assert added["error"] is None and isinstance(added["body"], int)
    dup = capx(conn, "q_add_unique", "-object", "capx_q", "-body", json.dumps(one))
    assert dup == {"body": added["body"], "error": None}  # as wire/015: the same id
    batch = {"msgs": [{"eid": 1002, "msg": "YjE=", "src": "capx", "sg": 3}], "sm": 2}
    assert capx(conn, "q_add_list", "-object", "capx_q", "-body", json.dumps(batch))["error"] is None

    cases = {
        "018": ("q_add_unique_list", {"msgs": [{"msg": "eA==", "src": "z", "sg": 1}], "sm": 2}),
        "019": (
            "q_add_unique_list",
            {"msgs": [{"eid": 77, "msg": "eA==", "src": "z", "sg": -200000000}], "sm": 2},
        ),
        "020": ("q_add", {"msg": {"msg": "eA==", "sg": 1}, "sm": 9}),
    }
    for number, (action, body) in cases.items():
        got = capx(conn, action, "-object", "capx_q", "-body", json.dumps(body))
        want = CAPTURES[number]["resp_json"]["responce"]
        assert got["error"]["code"] == want["error"]["code"], number
        assert got["body"] == want["body"], number  # 0 or [] beside the error, as the tools expect
    assert capx(conn, "no_such_op")["error"]["code"] == captured_code("095")

    # A segment above the filter's largest ``to`` crashed the original (wire/027): answered here.
    segs = {"id_start": 0, "cnt_limit": 10, "segments": {"s": [{"from": 2, "to": 2}]}}
    got = capx(conn, "q_get_segment", "-object", "capx_q", "-body", json.dumps(segs))
    assert got["error"] is None and [m["sg"] for m in got["body"]["msgs"]] == [2]
    empty = {"id_start": 0, "cnt_limit": 1, "segments": {"s": []}}
    got = capx(conn, "q_get_segment", "-object", "capx_q", "-body", json.dumps(empty))
    assert got["body"]["msgs"] is None and got["body"]["last_id"] > 0

    assert capx(conn, "q_subs_get_last", "-object", "capx_q", "-body", '"cur"')["body"] == 0
    set_last = {"sbscr": "cur", "id": added["body"], "sm": 1}
    assert capx(conn, "q_subs_set_last", "-object", "capx_q", "-body", json.dumps(set_last))["error"] is None
    assert capx(conn, "q_subs_get_last", "-object", "capx_q", "-body", '"cur"')["body"] == added["body"]
    assert capx(conn, "q_subs_add_r_m", "-object", "capx_q", "-body", '"cur"')["error"] is None
    count = capx(conn, "q_subs_get_r_m_cnt", "-object", "capx_q", "-body", str(added["body"]))
    assert count["body"] == 1
    assert capx(conn, "q_subs_rm_r_m", "-object", "capx_q", "-body", '"cur"')["error"] is None
    assert capx(conn, "q_save_all", "-object", "capx_q")["error"] is None


# --- nested calls -----------------------------------------------------------------------------


def test_a_three_hop_nested_call_and_a_refused_loop(chain: list[ServerProcess], tmp_path: Path) -> None:
    alpha, _, gamma = chain
    put(f"{gamma.url}/v1/queues/far", {})
    conn = connection(tmp_path, alpha.url)
    body = {"msgs": [{"eid": 900, "msg": "bmVzdGVk", "src": "nest", "sg": 1}], "sm": 1}
    added = capx(conn, "q_add_list", "-object", "to_b/to_c/far", "-body", json.dumps(body))
    assert added["error"] is None and len(added["body"]) == 1
    got = capx(conn, "q_get", "-object", "to_b/to_c/far", "-body", '{"id_start": 0, "cnt_limit": 5}')
    assert [m["eid"] for m in got["body"]] == [900]
    assert "far" in capx(conn, "list_q", "-nest", "to_b/to_c")["body"]
    loop = capx(conn, "list_q", "-nest", "to_b/to_c/to_a")
    assert loop["error"]["code"] == 10990002 and loop["body"] is None
    unknown = capx(conn, "list_q", "-nest", "no_such_ec")
    assert unknown["error"]["code"] == captured_code("079")


# --- the envelope -------------------------------------------------------------------------------


def test_gzip_both_ways_and_plain(chain: list[ServerProcess]) -> None:
    url = chain[0].url
    data = gzip.compress(json.dumps(envelope("get_name", prefer="gzip")).encode())
    status, headers, answer = raw_call(url, data, "gzip")
    assert status == 200 and headers["Compress-Type"] == "gzip"
    assert headers["Content-Type"] == "text/plain; charset=utf-8"
    assert answer["responce"] == {"body": "alpha", "error": None}
    assert set(answer) == {"start", "finish", "responce"}
    status, headers, answer = raw_call(url, json.dumps(envelope("get_name")).encode())
    assert headers["Compress-Type"] == "" and answer["responce"]["body"] == "alpha"
    status, headers, _ = raw_call(url, gzip.compress(json.dumps(envelope("ping")).encode()), "gzip9")
    assert status == 200


@pytest.mark.parametrize(
    ("data", "compress_type", "code"),
    [
        (gzip.compress(b'{"request": {"action": "ping"}}', mtime=0)[:-6], "gzip", 10120102),  # truncated gzip
        (b'{"request": {"action": "ping"}}', "gzip", 10120102),  # not gzip at all
        (b"{}", "br", 10120102),
        (b'{"request": ', "", 10120103),
        (b"", "", 10120103),
        (b'{"wait": "5s", "request": {"action": "ping"}}', "", 10120103),  # wrong type
        (b'{"request": {"action": 7}}', "", 10120103),
        (b"[" * 100 + b"]" * 100, "", 10120103),  # deeper than max_json_depth
    ],
)
def test_bad_envelopes_get_the_original_error_shape(
    chain: list[ServerProcess], data: bytes, compress_type: str, code: int
) -> None:
    status, _, answer = raw_call(chain[0].url, data, compress_type)
    assert status == 200
    assert answer["responce"]["error"]["code"] == code
    assert answer["responce"]["body"] is None


def test_a_gzip_bomb_stops_at_the_body_limit(chain: list[ServerProcess]) -> None:
    bomb = gzip.compress(b'{"request": {"action": "ping", "body": "' + b"a" * (40 * 1024 * 1024) + b'"}}')
    status, _, answer = raw_call(chain[0].url, bomb, "gzip")
    assert status == 200 and answer["responce"]["error"]["code"] == 10120102
    assert "max_body_size" in answer["responce"]["error"]["ie"]["msg"]


def test_the_clock_checks(chain: list[ServerProcess]) -> None:
    url = chain[0].url
    ahead = call(url, envelope("ping", offset_ns=10_000_000_000))
    assert ahead["error"]["code"] == captured_code("103")
    late = call(url, envelope("ping", offset_ns=-10_000_000_000))
    assert late["error"]["code"] == captured_code("104")
    null = call(url, {**envelope("ping"), "request": None})
    assert null["error"]["code"] == captured_code("105")


# --- security ------------------------------------------------------------------------------------


def test_wrong_credentials_get_one_answer(secured_server: ServerProcess, tmp_path: Path) -> None:
    url = secured_server.url
    assert call(url, envelope("ping", user="admin", password=PASSWORD))["error"] is None
    wrong = call(url, envelope("ping", user="admin", password="nope"))
    unknown = call(url, envelope("ping", user="nobody", password="nope"))
    empty = call(url, envelope("ping"))
    assert wrong["error"] == unknown["error"]
    assert wrong["error"]["code"] == 10300903
    assert empty["error"]["code"] == captured_code("101")  # no auth_info at all
    conn = connection(tmp_path, url)
    code, out = cap(conn, "-cmd", "ping", who="empty")
    assert code == 1 and code_in(out) in (10300902, 10300903)
    assert cap(conn, "-cmd", "ping") == (0, "OK\n")


def test_failed_logins_are_rate_limited_as_on_v1(tmp_path: Path) -> None:
    auth = (
        '[auth]\nenabled = true\nbootstrap_user = "admin"\nbootstrap_password_env = "TEST_ORIGINAL_PWD"\n'
        "max_failed_logins_per_user = 3\n"
    )
    for server in running(start(tmp_path, "limited", auth, env={"TEST_ORIGINAL_PWD": PASSWORD})):
        codes = [
            call(server.url, envelope("ping", user="victim", password=f"guess{i}"))["error"]["code"]
            for i in range(8)
        ]
        assert codes[0] == 10300903 and codes[-1] == 10990004


def test_a_narrow_user_may_not_do_through_cluster_what_v1_forbids(secured_server: ServerProcess) -> None:
    url = secured_server.url
    put(f"{url}/v1/queues/open_q", {}, user="admin")
    put(f"{url}/v1/queues/closed_q", {}, user="admin")
    put(f"{url}/v1/users/reader", {"password": PASSWORD, "rules": ["allow:queue:read:open_q"]}, user="admin")

    def as_reader(action: str, body: object = None, object_name: str = "") -> dict[str, Any]:
        return call(url, envelope(action, body, object_name=object_name, user="reader", password=PASSWORD))

    assert as_reader("list_q")["body"] == ["open_q"]
    assert as_reader("q_get", {"id_start": 0, "cnt_limit": 1}, "open_q")["error"] is None
    for action, body, name in [
        ("q_get", {"id_start": 0, "cnt_limit": 1}, "closed_q"),
        ("q_add", {"msg": {"msg": "eA=="}, "sm": 1}, "open_q"),
        ("add_q", {"name": "new_q", "type": "simple_queue", "params": {}}, ""),
        ("drop_q", "open_q", ""),
        ("gd_q", "closed_q", ""),
        ("q_subs_set_last", {"sbscr": "c", "id": 1, "sm": 1}, "open_q"),
        ("q_get", {"id_start": 0, "cnt_limit": 1}, "somewhere/open_q"),
    ]:
        error = as_reader(action, body, name)["error"]
        assert error is not None and error["code"] in (10110000, 10104000), (action, error)
    # Acting as another user is for admins only (wire/096's impersonation).
    env = envelope("list_q", user="reader", password=PASSWORD)
    env["request"]["user"] = "admin"
    assert call(url, env)["error"]["code"] == 10110000
    assert (
        as_reader("check_perms", {"object_type": "CLUSTER_SELF", "action": "ADD_QUEUE", "object_name": "x"})[
            "body"
        ]
        is False
    )


def test_the_endpoint_is_off_by_default(tmp_path: Path) -> None:
    for server in running(ServerProcess(tmp_path / "plain")):
        with pytest.raises(urllib.error.HTTPError) as info:
            raw_call(server.url, json.dumps(envelope("ping")).encode())
        info.value.close()
        assert info.value.code == 404
