"""The original tools beside the original server with authentication: users, rights and codes.

The original ``capserver`` with authentication on (its fresh cluster's user ``""`` makes an
``admin`` through ``capsec``) and a Capella with ``[auth]`` and ``[compat] original = true``
run the same steps with ``cap`` and ``capsec``, and their outputs are compared: ``ping`` by a
signed-in user with no rules, ``h_drop`` / ``exc_drop`` of what does not exist, a queue path
through an unknown external cluster, and the original's own example flow, where a handler is
defined before the user it runs as (it fails each pass with the original's error until the user
exists and has rights, then runs).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.servers import ServerProcess, free_port
from support.wait import until_blocking

from e2e.test_original import BIN, EXAMPLES, KIT, PASSWORD, cap, code_in, connection, start, tool

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (BIN / "capserver").exists(), reason="the original's tools are not here"),
]

AUTH = '[auth]\nenabled = true\nbootstrap_user = "admin"\nbootstrap_password_env = "TEST_ORIGINAL_PWD"\n'
TECH = "example_tech_user"
HANDLER = "example_queue_regularly_save"  # new_regularly_save_handler.json, run as TECH
NEVER = "0001-01-01 00:00:00 +0000 UTC"


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """The original server (auth on, user ``admin`` made through ``""``) and a Capella, as URLs."""
    tmp = tmp_path_factory.mktemp("users")
    port = free_port()
    script = KIT / "tools" / "original_server.sh"
    subprocess.run(
        [str(script), str(tmp / "orig"), f"127.0.0.1:{port}"], check=True, capture_output=True, timeout=60
    )
    capella: ServerProcess = start(tmp, "capella", AUTH, env={"TEST_ORIGINAL_PWD": PASSWORD})
    try:
        original = f"http://127.0.0.1:{port}"
        conn = connection(tmp, original)
        for args in (
            ("-cmd", "create_user", "-un", "admin", "-pwd_flag", "-pwd", PASSWORD),
            ("-cmd", "enable_user", "-un", "admin"),
            ("-cmd", "add_sec_user", "-un", "admin", "-is_admin"),
        ):
            assert tool("capsec", conn, *args, who="empty")[0] == 0, args
        capella.wait_ready()
        yield original, capella.url
    finally:
        capella.stop()
        pid = (tmp / "orig" / "server.pid").read_text().strip()
        os.kill(int(pid), signal.SIGTERM)


def as_user(tmp: Path, url: str, user: str) -> Path:
    """A connection file whose ``admin`` connection signs in as ``user`` (password PASSWORD)."""
    path = tmp / f"conn-{user}-{abs(hash(url))}.json"
    mkconn = KIT / "tools" / "mkconn.py"
    subprocess.run(
        ["python3", str(mkconn), url, "--out", str(path), "--user", user, "--pwd", PASSWORD],
        check=True,
        capture_output=True,
    )
    return path


def codes_in(out: str) -> list[int]:
    """Every ``[code]`` cap printed: the error, then its inner errors."""
    return [int(c) for c in re.findall(r"\[(\d{8})\]", out)]


def capsec(conn: Path, *args: str) -> int:
    return tool("capsec", conn, "-cmd", *args)[0]


def make_user(conn: Path, name: str, *rules: str) -> None:
    assert capsec(conn, "create_user", "-un", name, "-pwd_flag", "-pwd", PASSWORD) == 0
    assert capsec(conn, "enable_user", "-un", name) == 0
    assert capsec(conn, "add_sec_user", "-un", name) == 0
    for action in rules:
        assert (
            capsec(conn, "set_rule", "-un", name, "-a", "-ot", "CLUSTER_SELF", "-act", action, "-on", "*")
            == 0
        )


def steps(tmp: Path, url: str) -> dict[str, Any]:
    """The same commands on one server; what each printed (codes where it failed)."""
    conn = connection(tmp, url)
    seen: dict[str, Any] = {}

    def failed(*args: str) -> tuple[int, int]:
        code, out = cap(conn, *args)
        return code, code_in(out) if code else 0

    # Signed in, no rules: the original's PING right is missing.
    make_user(conn, "norules")
    code, out = cap(as_user(tmp, url, "norules"), "-cmd", "ping")
    seen["ping without rights"] = (code, codes_in(out), '[user:"norules"]' in out)
    seen["ping as admin"] = cap(conn, "-cmd", "ping")
    seen["h_drop nope"] = failed("-cmd", "h_drop", "-name", "nope")
    seen["exc_drop nope"] = failed("-cmd", "exc_drop", "-name", "nope")
    seen["q_get no_such_ec/q"] = failed("-cmd", "q_get", "-name", "no_such_ec/q", "-qty", "1", "-id", "0")

    # The original's example flow: the handler first, its user after.
    seen["q_add"] = cap(conn, "-cmd", "q_add", "-pf", str(EXAMPLES / "new_queue.json"))
    seen["h_add"] = cap(conn, "-cmd", "h_add", "-pf", str(EXAMPLES / "new_regularly_save_handler.json"))
    seen["h_start"] = cap(conn, "-cmd", "h_start", "-name", HANDLER)
    until_blocking(lambda: cap(conn, "-cmd", "h_last_error", "-name", HANDLER)[0] == 1, 30, "a failed pass")
    code, out = cap(conn, "-cmd", "h_last_error", "-name", HANDLER)
    seen["h_last_error before the user"] = (code, codes_in(out), f'[user:"{TECH}"]' in out)
    # GET_QUEUE is what the original's flush needs; ADD_MESSAGE what Capella's (queue write) does.
    make_user(conn, TECH, "GET_QUEUE", "ADD_MESSAGE")
    until_blocking(
        lambda: cap(conn, "-cmd", "h_last_complete", "-name", HANDLER)[1].strip() != NEVER,
        30,
        "a pass once the user exists",
    )
    seen["h_stop"] = cap(conn, "-cmd", "h_stop", "-name", HANDLER)
    return seen


def test_rights_codes_and_a_handler_defined_before_its_user_answer_as_the_original(
    servers: tuple[str, str], tmp_path: Path
) -> None:
    original_url, capella_url = servers
    for side in ("original", "capella"):
        (tmp_path / side).mkdir()
    original = steps(tmp_path / "original", original_url)
    capella = steps(tmp_path / "capella", capella_url)
    assert original["ping without rights"] == (1, [10101010], True)
    assert original["h_last_error before the user"] == (1, [10117400, 10111000], True)
    assert set(capella) == set(original)
    for key, want in original.items():
        assert capella[key] == want, key
