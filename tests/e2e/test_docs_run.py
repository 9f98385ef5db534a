"""The documentation runs as written: README.md and every docs/*.md, block by block, in order.

Each file's shell and Python blocks run against a fresh real server listening where the docs
say (``localhost:8676``, as ``make run`` does), so every command is executed exactly as it is
printed, with ``.venv/bin`` first on ``PATH`` for ``capella``. A ``# {...}`` comment right
after a command is its expected answer and is compared when it is whole JSON; any other answer
must not be an error. A command that follows a stream (``curl -N``, ``--follow``) runs for a
few seconds and must print something. A here-document (``cat > dc2.toml <<'EOF'`` ... ``EOF``)
stays with its command. A Python block is saved as a file and run with ``python file.py``, as a
reader would run it, so it must be a whole program. A block right after ``<!-- illustrative -->``
is not run:
it needs what a test cannot have (other clusters, TLS files, a terminal for a password) or runs
forever (a worker).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from support.servers import ServerProcess, running

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
PORT = 8676
BLOCK = re.compile(r"(<!-- illustrative -->\s*\n)?```(sh|python)\n(.*?)```", re.DOTALL)
COMMAND_TIMEOUT = 40.0
FOLLOW_SECONDS = 3.0
HEREDOC = re.compile(r"<<-?\s*(['\"]?)(\w+)\1")

pytestmark = pytest.mark.slow


def blocks(document: Path) -> list[tuple[str, str]]:
    """(language, text) of every block that is not marked illustrative, in order."""
    return [(lang, text) for marker, lang, text in BLOCK.findall(document.read_text()) if not marker]


def commands(block: str) -> list[tuple[str, str | None]]:
    """Each shell command of a block (continuation lines joined) with its expected answer."""
    found: list[tuple[str, str | None]] = []
    pending = ""
    until = ""  # the closing word of a here-document still open
    for line in block.splitlines():
        if until:
            pending += "\n" + line
            if line.strip() != until:
                continue
            until = ""
        elif pending:
            pending += "\n" + line
        elif line.startswith("# {") and found:
            found[-1] = (found[-1][0], line[2:])
            continue
        elif not line.strip() or line.lstrip().startswith("#"):
            continue
        else:
            pending = line
        if not until and (heredoc := HEREDOC.search(line)):
            until = heredoc.group(2)
            continue
        if not pending.endswith("\\") and _complete(pending):
            found.append((pending, None))
            pending = ""
    return found


def _complete(command: str) -> bool:
    """False while a quoted string (a JSON body over several lines) is still open."""
    try:
        shlex.split(command)
    except ValueError:
        return False
    return True


@contextmanager
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    # Test runs of several checkouts on one machine take turns on the one port the docs name.
    with open(Path("/tmp") / f"capella-docs-{PORT}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield from _listening(tmp_path)


def _listening(tmp_path: Path) -> Iterator[ServerProcess]:
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", PORT)) == 0:
            pytest.skip(f"something listens on {PORT} already (a `make run`?); the docs' commands name it")
    yield from running(ServerProcess(tmp_path / "capella-data", port=PORT))


def environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    for name in ("CAPELLA_URL", "CAPELLA_USER", "CAPELLA_PASSWORD", "CAPELLA_TOKEN", "CAPELLA_CONTEXT"):
        env.pop(name, None)
    return env


def run_shell(command: str, cwd: Path, groups: list[int]) -> str:
    follows = " -N " in f" {command} " or "--follow" in command
    process = subprocess.Popen(
        ["bash", "-c", command],
        cwd=cwd,
        env=environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    groups.append(process.pid)
    try:
        out, err = process.communicate(timeout=FOLLOW_SECONDS if follows else COMMAND_TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        assert follows, f"{command!r} did not finish within {COMMAND_TIMEOUT} s"
        assert out.strip(), f"{command!r} followed for {FOLLOW_SECONDS} s and printed nothing"
        return out.decode()
    assert process.returncode == 0, f"{command!r} exited {process.returncode}: {err.decode()}"
    return out.decode()


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: path.name)
def test_the_documentation_runs_as_written(
    document: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Contexts a document saves (`capella context add`) stay in its own config directory.
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    runnable = blocks(document)
    if not runnable:
        pytest.skip(f"{document.name} has no shell or Python block to run")
    groups: list[int] = []  # a tutorial starts a second cluster in the background (`&`)
    # The docs are read in a checkout's root: the scripts they run are where they say.
    (tmp_path / "deploy").symlink_to(ROOT / "deploy")
    try:
        with server(tmp_path):
            for lang, text in runnable:
                if lang == "python":
                    run_python(text, tmp_path)
                    continue
                for command, expected in commands(text):
                    out = run_shell(command, tmp_path, groups)
                    if expected is not None and (want := _json(expected)) is not None:
                        assert _json(out) == want, f"{command!r} answered {out[:500]}"
                    assert not out.startswith('{"error":'), f"{command!r} answered an error: {out[:500]}"
    finally:
        for group in groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)


def run_python(text: str, cwd: Path) -> None:
    """Save the block as a file and run it as a program, the way a reader runs a copied snippet."""
    script = cwd / "snippet.py"
    script.write_text(text)
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        env=environment(),
        capture_output=True,
        timeout=COMMAND_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, f"a Python block failed:\n{text}\n{done.stderr.decode()}"


def _json(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return None


def test_the_command_splitter_keeps_continuations_and_expected_answers() -> None:
    block = "# a comment\ncurl a \\\n  -d '{}'\n# {\"x\": 1}\n\ncurl b -d '{\n  \"y\": 2}'\n"
    assert commands(block) == [
        ("curl a \\\n  -d '{}'", '{"x": 1}'),
        ("curl b -d '{\n  \"y\": 2}'", None),
    ]


def test_a_here_document_stays_with_its_command() -> None:
    block = "cat > a.toml <<'EOF'\n[cluster]\nname = \"dc2\"\nEOF\nls\n"
    assert commands(block) == [("cat > a.toml <<'EOF'\n[cluster]\nname = \"dc2\"\nEOF", None), ("ls", None)]


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: path.name)
def test_every_python_block_is_a_whole_program(document: Path) -> None:
    """Illustrative blocks too: a reader saves one as a file, where top-level ``await`` fails."""
    for _, lang, text in BLOCK.findall(document.read_text()):
        if lang == "python":
            try:
                compile(text, f"{document.name} (a Python block)", "exec")
            except SyntaxError as exc:
                pytest.fail(f"{document.name}: a Python block does not run as a file: {exc}\n{text}")
