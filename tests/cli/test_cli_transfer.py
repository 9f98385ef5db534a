"""``capella export`` / ``capella import`` against a real server, and the progress line."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from support.cli import Run

from capella.cli.progress import Progress
from capella.client import Client

pytestmark = pytest.mark.slow  # a real server process per module


def identities(blocking_client: Client, queue: str) -> list[tuple[object, ...]]:
    page = blocking_client.read(queue, after=0, limit=10_000)
    return [
        (m.source, m.external_id, m.external_time, m.segment, m.headers, m.payload) for m in page.messages
    ]


def test_a_queue_goes_out_and_back_with_its_identity(
    run: Run, blocking_client: Client, tmp_path: Path
) -> None:
    blocking_client.put_queue("cli-out")
    blocking_client.put_queue("cli-in")
    messages = [
        "plain text",
        b"\xff\x00 not utf-8",
        {"data": "keyed", "source": "shop", "external_id": 17, "segment": 4, "headers": {"k": "v"}},
    ]
    blocking_client.produce("cli-out", messages * 1000)  # 3,000: three pages of the export
    file = tmp_path / "out.ndjson"

    code, out, _ = run("export", "cli-out", "--file", str(file))
    assert (code, out) == (0, f"exported 2001 messages to {file}\n")  # "keyed" is stored once
    lines = [json.loads(line) for line in file.read_text().splitlines()]
    assert len(lines) == 2001
    keyed = {"data": "keyed", "source": "shop", "external_id": 17, "segment": 4, "headers": {"k": "v"}}
    assert lines[2] == {**keyed, "external_time": lines[2]["external_time"]}
    assert "data_b64" in lines[1] and "id" not in lines[0]

    code, out, _ = run("import", "cli-in", "--file", str(file))
    assert (code, out) == (
        0,
        f"imported 2001 messages ({file.stat().st_size:,} bytes): 2001 stored, 0 already there\n",
    )
    assert identities(blocking_client, "cli-in") == identities(blocking_client, "cli-out")

    # Again, or back into the queue it came from: nothing is stored twice.
    code, out, _ = run("import", "cli-in", "--file", str(file))
    assert out.endswith(": 0 stored, 2001 already there\n")
    code, out, _ = run("import", "cli-out", "--file", str(file))
    assert out.endswith(": 0 stored, 2001 already there\n")
    assert blocking_client.queue("cli-out").stats.messages == 2001

    code, _, err = run("import", "cli-in", "--file", str(tmp_path / "missing.ndjson"))
    assert (code, err) == (
        1,
        f"capella: cannot read {tmp_path / 'missing.ndjson'}: No such file or directory\n",
    )
    code, _, err = run("export", "cli-in", "--file", str(tmp_path / "no-dir" / "x.ndjson"))
    assert code == 1 and err.startswith("capella: cannot write ")


def test_export_to_standard_output_and_after_an_id(run: Run, blocking_client: Client) -> None:
    blocking_client.put_queue("cli-tail")
    blocking_client.produce("cli-tail", ["a", "b", "c"])
    code, out, err = run("export", "cli-tail", "--after", "1")
    assert code == 0 and err == ""  # no progress line when stderr is not a terminal
    assert [json.loads(line)["data"] for line in out.splitlines()] == ["b", "c"]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_progress_line_is_drawn_on_a_terminal_only() -> None:
    terminal = Terminal()
    progress = Progress("exported", total=200, stream=terminal)
    progress.add(50)
    progress.finish()
    drawn = terminal.getvalue()
    assert drawn.startswith("\rexported 50 of 200 (25 %) messages, ") and drawn.endswith("/s\x1b[K\n")

    quiet = io.StringIO()
    progress = Progress("imported", stream=quiet)
    progress.add(10)
    progress.finish()
    assert quiet.getvalue() == ""


def test_the_progress_line_says_how_far_into_a_file_the_reader_is(tmp_path: Path) -> None:
    path = tmp_path / "lines.txt"
    path.write_bytes(b"a line\n" * 100)
    terminal = Terminal()
    with path.open("rb") as f:
        progress = Progress("produced", stream=terminal, reading=f)
        f.read(350)
        progress.add(50)
        progress.finish()
    assert terminal.getvalue().startswith("\rproduced 50 messages (50 % of the file), ")

    with open("/dev/null", "rb") as f:  # not a regular file: no share to show
        progress = Progress("produced", stream=(terminal := Terminal()), reading=f)
        progress.finish()
    assert terminal.getvalue().startswith("\rproduced 0 messages, ")
