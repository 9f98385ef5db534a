"""Users and tokens from the clients and the command line, against a real ``capella serve``.

One server per module runs with ``[auth] enabled = true``; its first admin is added with
``capella user add --admin --data-dir`` before it starts, as an operator bootstraps it. CLI
tests call ``main([...])`` in-process with the credentials in the environment; the prompts
are answered on a real pseudo-terminal.
"""

from __future__ import annotations

import io
import json
import os
import pty
import select
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import msgspec
import pytest
from support.cli import Run
from support.servers import ServerProcess, running

from capella.auth.password import verify_password
from capella.auth.store import AuthStore
from capella.cli import main
from capella.client import AsyncClient, Client
from capella.errors import Forbidden, TokenNotFound, Unauthorized, UserNotFound
from capella.wire.auth import Me, Rule

pytestmark = pytest.mark.slow  # a real server process per module

ADMIN = "admin"
ADMIN_PASSWORD = "admin-secret-1"
COMMAND_TIMEOUT = 30.0
ENV = ("CAPELLA_USER", "CAPELLA_PASSWORD", "CAPELLA_TOKEN", "CAPELLA_URL", "CAPELLA_CONTEXT")


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("auth")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "stdin", io.StringIO(ADMIN_PASSWORD + "\n"))
        added = main(["user", "add", ADMIN, "--admin", "--password-stdin", "--data-dir", str(root / "data")])
    assert added == 0
    config = root / "capella.toml"
    config.write_text("[auth]\nenabled = true\n")
    yield from running(ServerProcess(root / "data", config=config))


@pytest.fixture
async def admin(auth_server: ServerProcess) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(auth_server.url, timeout=10.0, username=ADMIN, password=ADMIN_PASSWORD) as c:
        yield c


@pytest.fixture(autouse=True)
def no_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing from the developer's shell, and no terminal, unless a test sets them."""
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))


@pytest.fixture
def run(
    auth_server: ServerProcess, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Run:
    """``run("user", "list", stdin="...")`` → (exit code, stdout, stderr), against the server."""

    def run_main(*argv: str, stdin: str = "") -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
        capsys.readouterr()
        code = main(["--url", auth_server.url, *argv])
        out, err = capsys.readouterr()
        return code, out, err

    return run_main


def sign_in(monkeypatch: pytest.MonkeyPatch, user: str = ADMIN, password: str = ADMIN_PASSWORD) -> None:
    monkeypatch.setenv("CAPELLA_USER", user)
    monkeypatch.setenv("CAPELLA_PASSWORD", password)


# --- client ------------------------------------------------------------------------------


async def test_client_users_are_created_listed_changed_and_dropped(admin: AsyncClient) -> None:
    created = await admin.put_user("c-alice", password="alice-pass-1", rules=["allow:queue:read:c-*"])
    assert (created.name, created.admin, created.enabled) == ("c-alice", False, True)
    # The answer itself (not only the struct the client decodes it into) never holds the hash.
    raw = await admin._transport.call("GET", "/v1/users/c-alice")
    assert b"c-alice" in raw and b"password_hash" not in raw and b"scrypt$" not in raw

    assert "c-alice" in [u.name for u in await admin.users()]
    rules = (await admin.user("c-alice")).rules
    assert rules == [Rule(effect="allow", type="queue", action="read", name="c-*")]
    assert (await admin.put_user("c-alice", enabled=False)).enabled is False

    await admin.drop_user("c-alice")
    with pytest.raises(UserNotFound):
        await admin.user("c-alice")


async def test_client_me_and_a_password_change_with_the_old_password(
    admin: AsyncClient, auth_server: ServerProcess
) -> None:
    await admin.put_user("c-bob", password="bob-pass-1")
    async with AsyncClient(auth_server.url, username="c-bob", password="bob-pass-1") as bob:
        me = await bob.me()
        assert me == Me(user="c-bob", admin=False, via="basic", rules=[], cluster=me.cluster)
        assert me.cluster == (await admin.me()).cluster and me.cluster
        with pytest.raises(Forbidden):
            await bob.change_password("c-bob", "bob-pass-2")  # no old password
        await bob.change_password("c-bob", "bob-pass-2", old_password="bob-pass-1")
        with pytest.raises(Unauthorized):
            await bob.me()  # the old password stops working at once
    async with AsyncClient(auth_server.url, username="c-bob", password="bob-pass-2") as bob:
        assert (await bob.me()).user == "c-bob"
        assert await bob.users() == []  # only the users bob may read
        with pytest.raises(Forbidden):
            await bob.put_user("c-bob", admin=True)


async def test_client_tokens_are_created_listed_used_and_revoked(
    admin: AsyncClient, auth_server: ServerProcess
) -> None:
    answer = await admin.create_token(ttl="1h", description="client test")
    assert answer.token.startswith("cap_")
    assert (answer.user, answer.description) == (ADMIN, "client test")
    assert answer.expires - answer.created == pytest.approx(3600)
    listed = {t.id: t for t in await admin.tokens()}
    assert listed[answer.id].token is msgspec.UNSET

    with Client(auth_server.url, timeout=10.0, token=answer.token) as by_token:
        assert by_token.me().via == "token"
        with pytest.raises(Forbidden):
            by_token.create_token()  # a token cannot make more tokens
        await admin.revoke_token(answer.id)
        with pytest.raises(Unauthorized):
            by_token.me()
    with pytest.raises(TokenNotFound):
        await admin.revoke_token(answer.id)


def test_the_blocking_client_manages_users_and_their_tokens(auth_server: ServerProcess) -> None:
    with Client(auth_server.url, timeout=10.0, username=ADMIN, password=ADMIN_PASSWORD) as client:
        client.put_user("c-carol", password="carol-pass-1", rules=[])
        token = client.create_token(ttl=60, user="c-carol")
        assert token.user == "c-carol"
        assert token.id in [t.id for t in client.tokens()]
        client.change_password("c-carol", "carol-pass-2")  # an admin needs no old password
        assert client.user("c-carol").name == "c-carol"
        client.drop_user("c-carol")
        assert token.id not in [t.id for t in client.tokens()]  # revoked with its user
        assert "c-carol" not in [u.name for u in client.users()]


# --- user, offline -----------------------------------------------------------------------


def test_offline_user_commands_change_a_stopped_server_s_users(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    data = ["--data-dir", str(tmp_path / "data")]

    def offline(*argv: str, stdin: str = "") -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
        capsys.readouterr()
        code = main([*argv, *data])
        out, err = capsys.readouterr()
        return code, out, err

    code, out, _ = offline("user", "add", "root", "--admin", "--password-stdin", stdin="root-pass-1\n")
    assert (code, out) == (0, "user root added (admin)\n")
    code, out, _ = offline(
        "user", "add", "ann", "--allow", "queue:read:orders-*", "--deny", "queue:*:orders-secret",
        "--password-stdin", stdin="ann-pass-1\n",
    )  # fmt: skip
    assert (code, out) == (0, "user ann added\n")

    code, out, _ = offline("user", "list")
    assert code == 0
    assert out.splitlines() == [
        "NAME  ADMIN  ENABLED  RULES",
        "ann   no     yes      allow:queue:read:orders-* deny:queue:*:orders-secret",
        "root  yes    yes      -",
    ]
    assert offline("user", "rules", "ann", "--allow", "handler:read:*")[:2] == (0, "user ann has 1 rule\n")
    assert offline("user", "disable", "ann")[:2] == (0, "user ann disabled\n")
    code, out, _ = offline("user", "passwd", "ann", "--password-stdin", stdin="ann-pass-2\n")
    assert (code, out) == (0, "password of user ann changed\n")
    code, out, _ = offline("user", "show", "ann", "--json")
    shown = json.loads(out)
    assert (code, shown["enabled"], shown["rules"]) == (
        0,
        False,
        [{"effect": "allow", "type": "handler", "action": "read", "name": "*"}],
    )
    stored = AuthStore(tmp_path / "data" / "auth").user("ann")
    assert verify_password("ann-pass-2", stored.password_hash)
    assert offline("user", "drop", "ann", "--yes")[:2] == (0, "user ann dropped\n")

    code, _, err = offline("user", "add", "root", "--password-stdin", stdin="other-pass-1\n")
    assert code == 1
    assert err.startswith("capella: already_exists: user 'root' already exists")
    code, _, err = offline("user", "drop", "root", "--yes")
    assert code == 1
    assert "last enabled admin" in err


def test_offline_user_commands_find_the_data_dir_in_a_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "capella.toml"
    config.write_text('[cluster]\ndata_dir = "somewhere"\n\n[auth]\nenabled = true\n')
    monkeypatch.setattr(sys, "stdin", io.StringIO("root-pass-1\n"))

    code = main(["user", "add", "root", "--admin", "--password-stdin", "--config", str(config)])

    assert code == 0
    assert AuthStore(tmp_path / "somewhere" / "auth").user("root").admin
    capsys.readouterr()
    assert main(["user", "list", "--json", "--config", str(config)]) == 0
    assert [u["name"] for u in json.loads(capsys.readouterr().out)] == ["root"]


def test_offline_user_commands_refuse_a_running_server_s_data_dir(
    auth_server: ServerProcess, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("intruder-pass-1\n"))

    code = main(["user", "add", "intruder", "--password-stdin", "--data-dir", str(auth_server.data_dir)])

    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("capella: conflict: ")
    assert "in use by a running server" in err
    assert AuthStore(auth_server.data_dir / "auth").find_user("intruder") is None


def test_a_new_password_needs_a_terminal_or_password_stdin(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["user", "add", "root", "--admin", "--data-dir", str(tmp_path)])

    assert code == 1
    assert "--password-stdin" in capsys.readouterr().err
    assert AuthStore(tmp_path / "auth").users() == []


def test_a_rule_that_is_not_type_action_pattern_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["user", "add", "ann", "--allow", "queue:read", "--data-dir", str(tmp_path)]) == 2
    assert "expected TYPE:ACTION:PATTERN" in capsys.readouterr().err
    assert main(["user", "add", "ann", "--deny", "queue:peek:*", "--data-dir", str(tmp_path)]) == 2
    assert "--deny.action" in capsys.readouterr().err


# --- user, through the API ---------------------------------------------------------------


def test_user_list_signs_in_from_the_environment(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    sign_in(monkeypatch)

    code, out, _ = run("user", "list")

    assert code == 0
    assert out.splitlines()[0].split() == ["NAME", "ADMIN", "ENABLED", "RULES"]
    assert ["admin", "yes", "yes", "-"] in [row.split() for row in out.splitlines()]


def test_without_credentials_the_cli_explains_how_to_sign_in(run: Run) -> None:
    code, _, err = run("queue", "list")

    assert code == 1
    first, hint = err.splitlines()
    assert first.startswith("capella: unauthorized: credentials are required")
    assert "CAPELLA_USER" in hint and "CAPELLA_PASSWORD" in hint and "CAPELLA_TOKEN" in hint


def test_a_user_without_a_password_and_no_terminal_is_told_to_set_one(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CAPELLA_USER", ADMIN)

    code, _, err = run("user", "list")

    assert code == 1
    assert err.startswith("capella: unauthorized: no password for user 'admin': set CAPELLA_PASSWORD")


def test_a_user_added_with_rules_may_do_what_they_allow(
    run: Run, monkeypatch: pytest.MonkeyPatch, auth_server: ServerProcess
) -> None:
    sign_in(monkeypatch)
    run("queue", "create", "cli-open")
    run("queue", "create", "cli-closed")

    code, out, _ = run(
        "user", "add", "cli-ann", "--allow", "queue:*:cli-*", "--deny", "queue:write:cli-closed",
        "--password-stdin", stdin="ann-pass-1\n",
    )  # fmt: skip
    assert (code, out) == (0, "user cli-ann added\n")
    code, out, _ = run("user", "show", "cli-ann", "--json")
    assert [r["effect"] for r in json.loads(out)["rules"]] == ["allow", "deny"]
    code, out, _ = run("user", "show", "cli-ann")  # for people: one field per line
    fields = dict(line.split(None, 1) for line in out.splitlines())
    assert (code, fields["admin"], fields["enabled"]) == (0, "no", "yes")
    assert fields["rules"] == "allow:queue:*:cli-* deny:queue:write:cli-closed"

    sign_in(monkeypatch, "cli-ann", "ann-pass-1")
    assert run("produce", "cli-open", "hello")[0] == 0
    code, _, err = run("produce", "cli-closed", "hello")
    assert code == 1
    assert err.startswith("capella: forbidden: user 'cli-ann' may not write queue 'cli-closed'")
    code, _, err = run("user", "add", "cli-ann2", "--password-stdin", stdin="ann2-pass-1\n")
    assert code == 1
    assert err.startswith("capella: forbidden: ")


def test_rules_are_replaced(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    sign_in(monkeypatch)
    run("user", "add", "cli-ben", "--allow", "queue:read:*", "--password-stdin", stdin="ben-pass-1\n")

    assert run("user", "rules", "cli-ben", "--deny", "queue:*:x")[:2] == (0, "user cli-ben has 1 rule\n")
    assert run("user", "rules", "cli-ben")[:2] == (0, "user cli-ben has 0 rules\n")
    code, _, err = run("user", "rules", "cli-nobody", "--allow", "queue:read:*")
    assert code == 1
    assert err.startswith("capella: user_not_found: ")


def test_a_disabled_user_cannot_sign_in_until_enabled(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    sign_in(monkeypatch)
    run("user", "add", "cli-cat", "--password-stdin", stdin="cat-pass-1\n")
    assert run("user", "disable", "cli-cat")[:2] == (0, "user cli-cat disabled\n")

    sign_in(monkeypatch, "cli-cat", "cat-pass-1")
    code, _, err = run("queue", "list")
    assert code == 1
    assert "CAPELLA_PASSWORD" in err.splitlines()[1]

    sign_in(monkeypatch)
    assert run("user", "enable", "cli-cat")[:2] == (0, "user cli-cat enabled\n")
    sign_in(monkeypatch, "cli-cat", "cat-pass-1")
    assert run("queue", "list")[0] == 0


def test_passwd_from_stdin_by_an_admin_and_by_the_user_itself(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    sign_in(monkeypatch)
    run("user", "add", "cli-dan", "--password-stdin", stdin="dan-pass-1\n")
    code, out, _ = run("user", "passwd", "cli-dan", "--password-stdin", stdin="dan-pass-2\n")
    assert (code, out) == (0, "password of user cli-dan changed\n")

    # Dan may not manage users: the CLI sends the password it signed in with as the old one.
    sign_in(monkeypatch, "cli-dan", "dan-pass-2")
    assert run("user", "passwd", "cli-dan", "--password-stdin", stdin="dan-pass-3\n")[0] == 0
    assert run("queue", "list")[0] == 1
    sign_in(monkeypatch, "cli-dan", "dan-pass-3")
    assert run("queue", "list")[0] == 0
    code, _, err = run("user", "passwd", "cli-dan", "--password-stdin", stdin="short\n")
    assert code == 1
    assert err.startswith("capella: invalid_request: password must be 8 to 1024 characters long")


def test_a_dropped_user_is_gone_with_its_tokens(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    sign_in(monkeypatch)
    run("user", "add", "cli-eve", "--password-stdin", stdin="eve-pass-1\n")
    code, out, _ = run("token", "create", "--user", "cli-eve", "--json")
    token = json.loads(out)
    assert (code, token["user"]) == (0, "cli-eve")

    assert run("user", "drop", "cli-eve", "--yes")[:2] == (0, "user cli-eve dropped\n")
    code, _, err = run("user", "show", "cli-eve")
    assert code == 1
    assert err.startswith("capella: user_not_found: ")
    monkeypatch.setenv("CAPELLA_TOKEN", token["token"])
    monkeypatch.delenv("CAPELLA_USER")
    assert run("queue", "list")[0] == 1


def test_user_add_refuses_an_existing_user_before_asking_for_a_password(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    sign_in(monkeypatch)

    code, _, err = run("user", "add", ADMIN)  # no --password-stdin and no terminal: not asked

    assert code == 1
    assert err.startswith("capella: already_exists: user 'admin' already exists")


# --- token -------------------------------------------------------------------------------


def test_a_token_from_the_cli_signs_in_until_it_is_revoked(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    sign_in(monkeypatch)
    code, out, _ = run("token", "create", "--ttl", "1h", "--description", "cli test")
    assert code == 0
    text = out.strip()
    assert text.startswith("cap_")
    token_id = text.split("_")[1]

    code, out, _ = run("token", "list")
    assert code == 0
    assert out.splitlines()[0].split() == ["ID", "USER", "CREATED", "EXPIRES", "DESCRIPTION"]
    row = next(line for line in out.splitlines() if line.startswith(token_id))
    assert row.split()[1] == ADMIN
    assert row.endswith("cli test")

    monkeypatch.setenv("CAPELLA_TOKEN", text)  # wins over CAPELLA_USER from the environment
    run("queue", "create", "cli-by-token")
    code, out, _ = run("queue", "list", "--json")
    assert (code, "cli-by-token" in [q["name"] for q in json.loads(out)]) == (0, True)
    code, _, err = run("token", "create")
    assert code == 1
    assert err.startswith("capella: forbidden: a token cannot create tokens")

    # --user on the command line wins over the token.
    assert run("--user", ADMIN, "token", "revoke", token_id)[:2] == (0, f"token {token_id} revoked\n")
    code, _, err = run("queue", "list")
    assert code == 1
    first, hint = err.splitlines()
    assert first == "capella: unauthorized: the token is not valid (unknown, revoked or expired)"
    assert "CAPELLA_TOKEN" in hint


def test_token_create_json_prints_the_whole_answer_and_revoke_knows_unknown_ids(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    sign_in(monkeypatch)

    code, out, _ = run("token", "create", "--ttl", "90s", "--json")

    answer = json.loads(out)
    assert code == 0
    assert set(answer) == {"id", "user", "created", "expires", "description", "token"}
    assert answer["expires"] - answer["created"] == pytest.approx(90)
    assert run("token", "revoke", answer["id"])[0] == 0
    code, _, err = run("token", "revoke", answer["id"])
    assert code == 1
    assert err.startswith("capella: token_not_found: ")
    code, _, err = run("token", "create", "--ttl", "forever")
    assert code == 1
    assert err.startswith("capella: invalid_request: ttl: ")


# --- prompts on a terminal ---------------------------------------------------------------


def test_passwords_are_asked_for_twice_on_a_terminal(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    add_root = [sys.executable, "-m", "capella", "user", "add", "root", "--admin", "--data-dir", data]
    with Terminal(add_root) as t:
        t.answer("new password for root: ", "root-pass-1")
        t.answer("the same again: ", "root-pass-2")
        assert t.wait() == 1
        assert "the two passwords differ" in t.output
    with Terminal(add_root) as t:
        t.answer("new password for root: ", "root-pass-1")
        t.answer("the same again: ", "root-pass-1")
        assert t.wait() == 0
        assert "root-pass-1" not in t.output  # not echoed
    assert verify_password("root-pass-1", AuthStore(tmp_path / "data" / "auth").user("root").password_hash)


def test_the_sign_in_password_is_asked_for_on_a_terminal(auth_server: ServerProcess) -> None:
    argv = [sys.executable, "-m", "capella", "--url", auth_server.url, "--user", ADMIN, "user", "list"]
    with Terminal(argv) as t:
        t.answer(f"password for admin at {auth_server.url}: ", ADMIN_PASSWORD)
        assert t.wait() == 0
        assert "NAME" in t.output and ADMIN_PASSWORD not in t.output


class Terminal:
    """A ``capella`` process on a pseudo-terminal of its own, answering its prompts."""

    def __init__(self, argv: list[str]) -> None:
        self._master, slave = pty.openpty()
        env = {k: v for k, v in os.environ.items() if k not in ENV}
        self.process = subprocess.Popen(
            argv, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True
        )
        os.close(slave)
        self.output = ""

    def __enter__(self) -> Terminal:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(COMMAND_TIMEOUT)
        os.close(self._master)

    def answer(self, prompt: str, text: str) -> None:
        """Wait for ``prompt``, then type ``text`` and Enter."""
        deadline = time.monotonic() + COMMAND_TIMEOUT
        while not self.output.endswith(prompt):
            if not self._read(deadline - time.monotonic()):
                pytest.fail(f"no prompt {prompt!r} (got {self.output!r})")
        os.write(self._master, text.encode() + b"\n")

    def wait(self) -> int:
        deadline = time.monotonic() + COMMAND_TIMEOUT
        while self._read(deadline - time.monotonic()):
            pass
        return self.process.wait(max(0.0, deadline - time.monotonic()))

    def _read(self, timeout: float) -> bool:
        if timeout <= 0 or not select.select([self._master], [], [], timeout)[0]:
            return False
        try:
            chunk = os.read(self._master, 4096)
        except OSError:  # EIO: the process closed the terminal
            return False
        self.output += chunk.decode(errors="replace").replace("\r\n", "\n")
        return bool(chunk)


# --- contexts ------------------------------------------------------------------------------


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``capella ...`` with no --url: the server comes from the environment or a context."""
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_context_names_the_server_and_signs_in_with_its_token_file(
    auth_server: ServerProcess,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config_home = tmp_path / "config"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config_home))
    with Client(auth_server.url, timeout=10.0, username=ADMIN, password=ADMIN_PASSWORD) as admin:
        token = admin.create_token(ttl="1h", description="context").token
    token_file = tmp_path / "dc1.token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)

    code, out, _ = cli(
        capsys, "context", "add", "dc1", "--url", auth_server.url, "--token-file", str(token_file)
    )
    assert code == 0 and out.startswith("context dc1 created (current) in ")
    code, out, _ = cli(capsys, "context", "add", "local", "--url", "http://127.0.0.1:1")
    assert (code, "(current)" in out) == (0, False)  # the first one added stays current

    # The file: no secret in it, 0600 in a 0700 directory.
    file = config_home / "capella" / "contexts.toml"
    assert (file.stat().st_mode & 0o777, file.parent.stat().st_mode & 0o777) == (0o600, 0o700)
    text = file.read_text()
    assert token not in text and ADMIN_PASSWORD not in text
    assert 'current = "dc1"' in text and f'token_file = "{token_file}"' in text

    code, out, _ = cli(capsys, "queue", "create", "ctx-orders")  # no --url, no credentials
    assert (code, out) == (0, "queue ctx-orders created\n")

    code, out, _ = cli(capsys, "context", "list")
    assert code == 0
    assert [line.split()[:2] for line in out.splitlines()[1:]] == [
        ["*", "dc1"],
        ["local", "http://127.0.0.1:1"],
    ]

    # --context for one command; `context use` for the following ones.
    code, _, err = cli(capsys, "--context", "local", "queue", "list")
    assert code == 1 and "http://127.0.0.1:1" in err
    assert cli(capsys, "context", "use", "local")[:2] == (0, "context local is current\n")
    code, out, _ = cli(capsys, "context", "show")
    fields = dict(line.split(None, 1) for line in out.splitlines())
    assert (fields["name"], fields["url"], fields["from"]) == (
        "local",
        "http://127.0.0.1:1",
        "the current context",
    )
    assert cli(capsys, "--context", "dc1", "queue", "show", "ctx-orders")[0] == 0

    # --url and CAPELLA_URL win, and take none of a context's credentials with them.
    code, _, err = cli(capsys, "--url", auth_server.url, "--context", "dc1", "queue", "list")
    assert code == 1 and "unauthorized" in err
    monkeypatch.setenv("CAPELLA_URL", auth_server.url)
    code, out, _ = cli(capsys, "context", "show")
    assert "CAPELLA_URL" in out
    monkeypatch.delenv("CAPELLA_URL")

    code, _, err = cli(capsys, "--context", "nowhere", "queue", "list")
    assert code == 1 and err.startswith("capella: context_not_found: no context named 'nowhere'")
    assert cli(capsys, "context", "remove", "local")[:2] == (0, "context local removed\n")
    code, out, _ = cli(capsys, "context", "show")
    assert "the default" in out  # the current context was removed: back to 127.0.0.1:8676


def test_a_context_user_signs_in_with_the_password_from_the_environment(
    auth_server: ServerProcess,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    assert cli(capsys, "context", "add", "dc", "--url", auth_server.url, "--user", ADMIN)[0] == 0

    code, _, err = cli(capsys, "queue", "list")
    assert code == 1 and "no password for user 'admin'" in err  # never saved, and no terminal here

    monkeypatch.setenv("CAPELLA_PASSWORD", ADMIN_PASSWORD)
    assert cli(capsys, "queue", "list")[0] == 0
    assert ADMIN_PASSWORD not in (tmp_path / "config" / "capella" / "contexts.toml").read_text()


def test_a_broken_contexts_file_is_named_in_the_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    (tmp_path / "capella").mkdir()
    (tmp_path / "capella" / "contexts.toml").write_text(
        'current = "a"\n[contexts.a]\nurl = "x"\npassword = "no"\n'
    )

    code, _, err = cli(capsys, "queue", "list")

    assert code == 1 and err.startswith("capella: invalid_config: ") and "contexts.toml" in err
    assert "password" in err
