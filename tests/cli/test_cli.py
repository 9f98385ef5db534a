"""The ``capella`` command against a real ``capella serve`` process on loopback.

Most tests call ``main([...])`` in-process and read what it printed; the ones about pipes,
raw bytes and Ctrl-C run ``python -m capella`` as a subprocess.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.cli import Run
from support.servers import ServerProcess, free_port, running
from support.wait import until_blocking

from capella.cli import main
from capella.cli.output import size, utc
from capella.client import Client
from capella.config import load_config
from capella.core.cluster import Cluster


@pytest.fixture(scope="module")
def server_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The module's server, with the secrets clusters name declared as an operator would."""
    directory = tmp_path_factory.mktemp("server")
    config = directory / "capella.toml"
    config.write_text(
        '[secrets.dc2-password]\nenv = "CAPELLA_CLI_DC2_PASSWORD"\n\n'
        '[secrets.cli-unset]\nenv = "CAPELLA_CLI_UNSET"\n'
    )
    env = {"CAPELLA_CLI_DC2_PASSWORD": "dc2-password-value"}
    yield from running(ServerProcess(directory / "data", config=config, env=env))


pytestmark = pytest.mark.slow  # a real server process per module

COMMAND_TIMEOUT = 30.0


def capella(
    server: ServerProcess, *argv: str, stdin: bytes = b"", timeout: float = COMMAND_TIMEOUT
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "capella", "--url", server.url, *argv],
        input=stdin,
        capture_output=True,
        timeout=timeout,
        check=False,
    )


# --- queue -------------------------------------------------------------------------------


def test_sizes_are_printed_in_binary_units() -> None:
    assert [size(n) for n in (0, 1023, 1024, 1258291, 5 * 1024**3)] == [
        "0 B", "1023 B", "1.0 KiB", "1.2 MiB", "5.0 GiB",
    ]  # fmt: skip


def test_a_queue_is_created_listed_shown_and_dropped(run: Run) -> None:
    code, out, _ = run(
        "queue", "create", "cli-orders", "--block-max-messages", "50", "--block-max-bytes", "64KiB"
    )
    assert (code, out) == (0, "queue cli-orders created\n")
    code, out, _ = run("queue", "create", "cli-orders", "--save", "wait")
    assert (code, out) == (0, "queue cli-orders updated\n")

    code, out, _ = run("queue", "list")
    assert code == 0
    header, *rows = out.splitlines()
    assert header.split() == ["NAME", "MESSAGES", "FIRST_ID", "LAST_ID", "SIZE", "SUBSCRIPTIONS"]
    assert any(row.split()[0] == "cli-orders" for row in rows)

    code, out, _ = run("queue", "show", "cli-orders", "--json")
    limits = json.loads(out)["definition"]["block"]
    code, out, _ = run("queue", "show", "cli-orders")
    assert "64.0 KiB" in out  # sizes for people; --json keeps the bytes
    assert (code, limits["max_messages"], limits["max_bytes"]) == (0, 50, 64 * 1024)

    # For people: one field per line, then the subscriptions with their lag.
    code, out, _ = run("produce", "cli-orders", "a", "b", "c")
    code, out, _ = run("consume", "cli-orders", "--subscription", "billing", "--limit", "1")
    code, out, _ = run("queue", "show", "cli-orders")
    lines = out.splitlines()
    fields = {
        line.split("  ", 1)[0]: line.split("  ", 1)[1].strip()
        for line in lines
        if "  " in line and not line.startswith("SUB")
    }
    assert code == 0 and fields["name"] == "cli-orders"
    assert fields["messages"].startswith("3 (ids 1-3)")
    assert fields["block sealed at"].startswith("50 messages, 64.0 KiB")
    assert fields["writable"] == "yes"
    assert lines[-2].split() == ["SUBSCRIPTION", "MODE", "LAST_ID", "LAG", "REPLICA"]
    assert lines[-1].split() == ["billing", "cursor", "1", "2", "no"]

    code, out, _ = run("queue", "drop", "cli-orders", "--yes")
    assert (code, out) == (0, "queue cli-orders dropped\n")
    code, _, err = run("queue", "show", "cli-orders")
    assert code == 1
    assert err.startswith("capella: queue_not_found: ")


def test_queue_create_takes_save_modes_and_a_segment_range(run: Run) -> None:
    code, out, _ = run(
        "--json", "queue", "create", "cli-def", "--save", "mark", "--subscription-save", "none",
        "--segments", "0-9", "--block-max-age", "10m",
    )  # fmt: skip

    definition = json.loads(out)["definition"]
    assert code == 0
    assert (definition["save"], definition["subscription_save"]) == ("mark", "none")
    assert definition["segments"] == {"min": 0, "max": 9}
    assert definition["block"]["max_age"] == 600


def test_queue_create_still_takes_the_old_limit_flags_without_showing_them(
    run: Run, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(
        "--json", "queue", "create", "cli-old", "--max-count", "7", "--max-bytes", "4KiB", "--max-age", "1m"
    )

    assert code == 0
    assert json.loads(out)["definition"]["block"] == {"max_messages": 7, "max_bytes": 4096, "max_age": 60.0}
    assert main(["queue", "create", "--help"]) == 0
    shown = capsys.readouterr().out
    assert "--block-max-messages" in shown and "--max-count" not in shown


def test_queue_list_prints_json_with_the_option_after_the_command(run: Run) -> None:
    run("queue", "create", "cli-json-list")

    code, out, _ = run("queue", "list", "--json")

    assert code == 0
    assert "cli-json-list" in [q["name"] for q in json.loads(out)]


# --- topic -------------------------------------------------------------------------------


def test_a_topic_is_created_grown_listed_shown_and_dropped(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, _ = run(
        "topic", "create", "cli-events", "--partitions", "2", "--queue-json", '{"save": "mark"}'
    )
    assert (code, out) == (0, "topic cli-events created: 2 partitions\n")
    assert run("topic", "create", "cli-events", "--partitions", "3") == (
        0,
        "topic cli-events updated: 3 partitions\n",
        "",
    )
    code, out, _ = run("topic", "list")
    header, *rows = out.splitlines()
    assert header.split() == ["NAME", "PARTITIONS", "SAVE"]
    assert ["cli-events", "3", "mark"] in [row.split() for row in rows]
    code, out, _ = run("topic", "show", "cli-events")
    assert "cli-events~0, cli-events~1, cli-events~2" in out
    code, out, _ = run("--json", "topic", "show", "cli-events")
    assert json.loads(out)["queues"] == ["cli-events~0", "cli-events~1", "cli-events~2"]

    # Each partition is a queue of the data commands.
    assert run("produce", "cli-events~1", "hello")[0] == 0
    assert run("queue", "show", "cli-events~1")[0] == 0

    code, _, err = run("topic", "create", "cli-events", "--partitions", "2")
    assert code == 1 and err.startswith("capella: invalid_request: ") and "never removed" in err
    code, _, err = run("topic", "create", "cli-events", "--partitions", "2", "--queue-json", "[1]")
    assert code == 2 and "JSON object" in err

    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    code, _, err = run("topic", "drop", "cli-events")
    assert code == 2 and "--yes" in err
    assert run("topic", "show", "cli-events")[0] == 0
    assert run("topic", "drop", "cli-events", "--yes") == (0, "topic cli-events dropped\n", "")
    code, _, err = run("queue", "show", "cli-events~1")
    assert code == 1 and err.startswith("capella: queue_not_found: ")
    code, _, err = run("topic", "show", "cli-events")
    assert code == 1 and err.startswith("capella: topic_not_found: ")


def test_drop_without_yes_and_no_terminal_refuses(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    run("queue", "create", "cli-keep")
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))

    code, _, err = run("queue", "drop", "cli-keep")

    assert code == 2
    assert "--yes" in err
    assert run("queue", "show", "cli-keep")[0] == 0


def test_a_bad_definition_is_a_clean_error(run: Run) -> None:
    code, out, err = run("queue", "create", "cli-bad", "--save", "sometimes")

    assert (code, out) == (1, "")
    assert err.startswith("capella: invalid_save_mode: ")


# --- handler -----------------------------------------------------------------------------


def test_a_handler_is_created_listed_shown_stopped_run_and_dropped(run: Run, blocking_client: Client) -> None:
    blocking_client.put_queue("cli-h-orders", block={"max_messages": 2})
    blocking_client.produce("cli-h-orders", [f"m{i}" for i in range(5)], save="wait")
    # Full blocks are sealed by a background task: give it a bounded time to catch up.
    until_blocking(
        lambda: blocking_client.queue("cli-h-orders").stats.blocks.by_state["sealed"] >= 2,
        what="two sealed blocks",
        every=0.01,
    )

    code, out, _ = run(
        "handler", "create", "cli-trim", "--type", "expire", "--queue", "cli-h-orders",
        "--param", "max_messages=1", "--param", "interval=1h", "--stopped",
    )  # fmt: skip
    assert (code, out) == (0, "handler cli-trim created (stopped)\n")

    code, out, _ = run("handler", "list")
    assert code == 0
    header, *rows = out.splitlines()
    assert header.split() == ["NAME", "TYPE", "QUEUES", "STARTED", "RUNS", "LAG", "LAST_ERROR"]
    assert ["cli-trim", "expire", "cli-h-orders", "no", "0", "-", "-"] in [row.split() for row in rows]

    code, out, _ = run("handler", "show", "cli-trim", "--json")
    info = json.loads(out)
    assert (code, info["params"]["max_messages"], info["params"]["interval"]) == (0, 1, 3600)

    code, out, err = run("handler", "run", "cli-trim")
    # The pass it ran, and nothing else: its own items and bytes, not the handler's totals.
    assert (code, err) == (0, "")
    assert re.fullmatch(r"handler cli-trim pass ok: 2 items, \d+ bytes\n", out), out
    code, out, _ = run("handler", "run", "cli-trim")
    assert (code, out) == (0, "handler cli-trim pass ok: 0 items, 0 bytes\n")
    code, out, _ = run("handler", "run", "cli-trim", "--json")
    done = json.loads(out)
    assert (code, done["ok"], done["items"], done["error"]) == (0, True, 0, None)
    assert done["started"] <= done["finished"]
    code, out, _ = run("handler", "show", "cli-trim")  # for people: one field per line
    fields = {line.split("  ", 1)[0]: line.split("  ", 1)[1].strip() for line in out.splitlines()}
    assert (code, fields["type"], fields["queues"], fields["started"]) == (0, "expire", "cli-h-orders", "no")
    assert fields["runs"].startswith("3 (2 items") and fields["last error"] == "-"
    assert fields["failing since"] == "-" and fields["last run"] == fields["last success"] != "-"
    assert "max_messages=1" in fields["params"]
    assert blocking_client.queue("cli-h-orders").stats.first_id == 5
    assert blocking_client.handler("cli-trim").started is False

    assert run("handler", "start", "cli-trim") == (0, "handler cli-trim started\n", "")
    assert blocking_client.handler("cli-trim").started is True
    assert run("handler", "stop", "cli-trim") == (0, "handler cli-trim stopped\n", "")
    assert blocking_client.handler("cli-trim").started is False

    assert run("handler", "drop", "cli-trim", "--yes") == (0, "handler cli-trim dropped\n", "")
    code, _, err = run("handler", "show", "cli-trim")
    assert code == 1
    assert err.startswith("capella: handler_not_found: ")


def test_a_failed_pass_shows_its_error_with_its_code(run: Run, blocking_client: Client) -> None:
    blocking_client.put_queue("cli-f-from")
    blocking_client.put_queue("cli-f-to")
    blocking_client.produce("cli-f-from", ["m"], save="wait")
    code, _, _ = run(
        "handler", "create", "cli-f-copy", "--type", "copy", "--queue", "cli-f-from",
        "--param", "to=cli-f-to", "--stopped",
    )  # fmt: skip
    assert code == 0
    blocking_client.drop_queue("cli-f-to")

    code, _, err = run("handler", "run", "cli-f-copy")
    assert (code, err) == (
        1,
        "capella: handler cli-f-copy pass failed: CopyHandler: cli-f-from: no queue 'cli-f-to'\n",
    )
    code, out, _ = run("handler", "show", "cli-f-copy")
    fields = {line.split("  ", 1)[0]: line.split("  ", 1)[1].strip() for line in out.splitlines()}
    assert code == 0
    assert re.fullmatch(r".*cli-f-to.* \(queue_not_found\) at .+", fields["last error"]), fields


def test_handler_create_takes_params_as_json_and_patterns(run: Run, blocking_client: Client) -> None:
    params = '{"conditions": [{"mark": 0, "from_age": "1d"}], "limit": 5}'

    code, out, _ = run(
        "--json", "handler", "create", "cli-arch", "--type", "archive", "--queue", "cli-later-*",
        "--queue", "cli-later2-*", "--params-json", params, "--param", "limit=7",
    )  # fmt: skip

    info = json.loads(out)
    assert code == 0
    assert info["queues"] == ["cli-later-*", "cli-later2-*"]
    assert info["params"]["limit"] == 7
    assert info["params"]["conditions"] == [{"mark": 0, "from_age": 86400.0, "to_age": None}]
    assert info["started"] is True
    assert "cli-arch" in [h["name"] for h in json.loads(run("handler", "list", "--json")[1])]
    blocking_client.drop_handler("cli-arch")


def test_handler_errors_are_clean(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, err = run("handler", "create", "cli-bad", "--type", "flush", "--queue", "cli-no-such-queue")
    assert (code, out) == (1, "")
    assert err.startswith("capella: invalid_request: ") and "unknown queue" in err

    code, _, err = run(
        "handler", "create", "cli-bad", "--type", "expire", "--queue", "x-*", "--param", "max_age=soon"
    )
    assert code == 1 and "params.max_age" in err

    assert run("handler", "create", "cli-bad", "--type", "compact", "--queue", "x-*")[0] == 2
    assert run("handler", "create", "cli-bad", "--type", "flush", "--queue", "x-*", "--param", "oops")[0] == 2
    assert (
        run("handler", "create", "cli-bad", "--type", "flush", "--queue", "x-*", "--params-json", "[1]")[0]
        == 2
    )
    assert run("handler", "run", "cli-nothing")[0] == 1

    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    run("handler", "create", "cli-keep", "--type", "flush", "--queue", "x-*", "--stopped")
    code, _, err = run("handler", "drop", "cli-keep")
    assert code == 2 and "--yes" in err
    assert run("handler", "show", "cli-keep")[0] == 0


def test_a_failed_run_exits_1_with_the_error(run: Run, blocking_client: Client) -> None:
    # The pattern matches a queue that maps no mount to mark 1: the archive pass fails.
    blocking_client.put_handler(
        "cli-fail", "archive", queues="cli-fail-*", params={"conditions": [{"mark": 1}]}, started=False
    )
    blocking_client.put_queue("cli-fail-1")

    code, out, err = run("handler", "run", "cli-fail")

    # The error once, on stderr; nothing on stdout.
    assert (code, out) == (1, "")
    assert err.startswith("capella: handler cli-fail pass failed: ") and "cli-fail-1" in err
    assert err.count("\n") == 1
    code, out, _ = run("handler", "run", "cli-fail", "--json")
    done = json.loads(out)
    assert (code, done["ok"], done["items"]) == (1, False, 0) and "cli-fail-1" in done["error"]
    code, out, _ = run("handler", "show", "cli-fail")
    fields = {line.split("  ", 1)[0]: line.split("  ", 1)[1].strip() for line in out.splitlines()}
    assert fields["last success"] == "-" and fields["failing since"] != "-"
    code, out, _ = run("handler", "list")
    row = next(r for r in out.splitlines() if r.startswith("cli-fail "))
    assert "cli-fail-1" in row
    blocking_client.drop_handler("cli-fail")


# --- cluster -----------------------------------------------------------------------------


def test_a_cluster_is_added_listed_shown_pinged_and_dropped(
    run: Run, server_process: ServerProcess, tmp_path: Path
) -> None:
    secret = "cli-t0ken-never-shown"
    # The server itself as an external cluster is refused: the far side has its own name.
    code, out, err = run("cluster", "add", "cli-loop", "--url", server_process.url)
    assert (code, out) == (1, "")
    assert err.startswith("capella: same_cluster_name: cluster cli-loop (") and "like this cluster" in err
    assert run("cluster", "show", "cli-loop")[0] == 1
    # A second real server on this host: its generated name differs.
    (tmp_path / "far").mkdir()
    far_server = running(ServerProcess(tmp_path / "far" / "data"))
    far = next(far_server)
    try:
        _with_a_real_external_cluster(run, server_process, far, secret)
    finally:
        far_server.close()


def _with_a_real_external_cluster(
    run: Run, server_process: ServerProcess, far: ServerProcess, secret: str
) -> None:
    code, out, _ = run("cluster", "add", "cli-self", "--url", far.url, "--token", secret)
    assert (code, out) == (0, "cluster cli-self created\n")

    code, out, _ = run("cluster", "list")
    assert code == 0
    header, *rows = out.splitlines()
    assert header.split() == ["NAME", "URL", "CREDENTIALS", "SOURCE", "COMPRESSION"]
    row = next(r for r in rows if r.startswith("cli-self "))
    assert row.split() == ["cli-self", far.url, "token", "stored", "encrypted", "none"]

    code, out, _ = run("cluster", "show", "cli-self", "--json")
    info = json.loads(out)
    assert (code, info["url"]) == (0, far.url)
    assert info["credentials"] == {"kind": "token", "username": None, "source": "stored encrypted"}

    code, out, err = run("cluster", "ping", "cli-self")
    assert (code, err) == (0, "")
    assert out.startswith("cluster cli-self ok: ") and out.endswith(" ms\n")

    code, out, _ = run("cluster", "show", "cli-self")  # for people: one field per line
    fields = {line.split("  ", 1)[0]: line.split("  ", 1)[1].strip() for line in out.splitlines()}
    assert (code, fields["url"], fields["credentials"]) == (0, far.url, "token, stored encrypted")
    assert fields["compression"] == "none" and fields["verify tls"] == "yes"

    outputs = [run("cluster", "list", "--json")[1], run("cluster", "show", "cli-self")[1]]
    registry = server_process.data_dir / "queues" / ".capella" / "clusters.json"
    for text in [*outputs, server_process.log(), registry.read_text()]:
        assert "cli-self" in text
        assert secret not in text

    assert run("cluster", "drop", "cli-self", "--yes") == (0, "cluster cli-self dropped\n", "")
    code, _, err = run("cluster", "show", "cli-self")
    assert code == 1
    assert err.startswith("capella: cluster_not_found: ")


def test_cluster_add_passes_every_option(run: Run, tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("kept as a path\n")

    code, out, _ = run(
        "--json", "cluster", "add", "cli-opts", "--url", "https://dc2.example.com:8676",
        "--username", "copier", "--password-secret", "dc2-password", "--no-verify-tls",
        "--ca-file", str(ca), "--timeout", "45s", "--connect-timeout", "2", "--compression", "zstd",
    )  # fmt: skip

    assert code == 0
    shown = json.loads(out)
    # dc2.example.com cannot be reached: kept, its name not checked.
    assert shown.pop("name_check")["checked"] is False
    assert shown == {
        "name": "cli-opts",
        "url": "https://dc2.example.com:8676",
        "credentials": {"kind": "password", "username": "copier", "source": "secret:dc2-password"},
        "tls": {"verify": False, "ca_file": str(ca)},
        "timeouts": {"connect": 2.0, "request": 45.0},
        "compression": "zstd",
        "error": None,
    }
    code, out, _ = run("cluster", "list")
    row = next(r for r in out.splitlines() if r.startswith("cli-opts "))
    assert row.split()[2:] == ["password", "(copier)", "secret:dc2-password", "zstd"]
    assert run("cluster", "drop", "cli-opts", "--yes")[0] == 0


def test_a_failed_cluster_ping_exits_1_with_the_error(run: Run) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    run("cluster", "add", "cli-gone", "--url", url, "--connect-timeout", "1s")

    code, out, err = run("cluster", "ping", "cli-gone")

    assert (code, out) == (1, "")
    assert err.startswith("capella: cluster cli-gone: unreachable: ") and url in err

    code, out, _ = run("cluster", "ping", "cli-gone", "--json")
    assert code == 1
    assert json.loads(out)["error"]["code"] == "unreachable"

    # A declared secret without a value is refused when the cluster is defined, not at its first use.
    code, _, err = run(
        "cluster", "add", "cli-noenv", "--url", url, "--username", "u", "--password-secret", "cli-unset"
    )  # fmt: skip
    assert code == 1
    assert "secret_unavailable" in err and "CAPELLA_CLI_UNSET" not in err
    run("cluster", "drop", "cli-gone", "--yes")


def test_cluster_errors_are_clean(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, err = run("cluster", "add", "cli-bad", "--url", "http://a", "--ca-file", "/no/such.pem")
    assert (code, out) == (1, "")
    assert err.startswith("capella: file_unavailable: ca_file: the file '/no/such.pem' cannot be used")

    code, _, err = run("cluster", "add", "cli-bad", "--url", "http://a", "--password", "p")
    assert code == 1 and "a password needs a username" in err

    assert (
        run("cluster", "add", "cli-bad", "--url", "http://a", "--token", "t", "--token-secret", "T")[0] == 2
    )
    assert run("cluster", "add", "cli-bad", "--url", "http://a", "--compression", "lz4")[0] == 2
    assert run("cluster", "add", "cli-bad")[0] == 2
    assert run("cluster", "ping", "cli-nothing")[0] == 1

    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    run("cluster", "add", "cli-keep", "--url", "http://a")
    code, _, err = run("cluster", "drop", "cli-keep")
    assert code == 2 and "--yes" in err
    assert run("cluster", "show", "cli-keep")[0] == 0
    run("cluster", "drop", "cli-keep", "--yes")


# --- produce -----------------------------------------------------------------------------


def test_produce_from_arguments_prints_the_ids(run: Run, blocking_client: Client) -> None:
    blocking_client.put_queue("cli-args")

    code, out, _ = run("produce", "cli-args", "one", "--save", "immediate", "two")

    assert (code, out) == (0, "1\n2\n")
    assert [m.data for m in blocking_client.read("cli-args").messages] == ["one", "two"]
    assert run("produce", "cli-args", "three", "--nope")[0] == 2


def test_produce_reads_stdin_one_message_per_line(
    run: Run, blocking_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocking_client.put_queue("cli-stdin")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"a\r\nb\n\nc")))

    code, out, _ = run("--json", "produce", "cli-stdin")

    assert code == 0
    assert [json.loads(line) for line in out.splitlines()] == [
        {"id": i, "duplicate": False} for i in (1, 2, 3, 4)
    ]
    assert [m.data for m in blocking_client.read("cli-stdin").messages] == ["a", "b", "", "c"]


def test_produce_from_a_file_applies_source_and_segment(
    run: Run, blocking_client: Client, tmp_path: Path
) -> None:
    blocking_client.put_queue("cli-file")
    path = tmp_path / "lines.txt"
    path.write_bytes(b"x\n\xff\xfe\n")

    code, out, _ = run("produce", "cli-file", "--file", str(path), "--source", "sensor", "--segment", "4")

    assert (code, out) == (0, "1\n2\n")
    messages = blocking_client.read("cli-file").messages
    assert [m.payload for m in messages] == [b"x", b"\xff\xfe"]
    assert {(m.source, m.segment) for m in messages} == {("sensor", 4)}


def test_produce_sends_batches_of_a_thousand(run: Run, blocking_client: Client, tmp_path: Path) -> None:
    blocking_client.put_queue("cli-batches")
    path = tmp_path / "many.txt"
    path.write_text("".join(f"m{i}\n" for i in range(2500)))

    code, out, _ = run("produce", "cli-batches", "--file", str(path))

    assert code == 0
    assert out.split() == [str(i) for i in range(1, 2501)]
    assert blocking_client.queue("cli-batches").stats.last_id == 2500


def test_produce_ndjson_marks_duplicates(run: Run, blocking_client: Client, tmp_path: Path) -> None:
    blocking_client.put_queue("cli-ndjson")
    path = tmp_path / "messages.ndjson"
    lines = [
        {"data": "a", "external_id": 10},
        {"data_b64": "AAE=", "external_id": 11, "headers": {"k": "v"}},
        {"data": "a again", "external_id": 10},
    ]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")

    code, out, _ = run("produce", "cli-ndjson", "--ndjson", "--file", str(path), "--source", "src")

    assert (code, out) == (0, "1\n2\n1 duplicate\n")
    messages = blocking_client.read("cli-ndjson").messages
    assert [(m.source, m.external_id, m.payload) for m in messages] == [
        ("src", 10, b"a"),
        ("src", 11, b"\x00\x01"),
    ]
    assert messages[1].headers == {"k": "v"}


def test_produce_sets_headers_source_external_ids_and_delays(run: Run, blocking_client: Client) -> None:
    blocking_client.put_queue("cli-produce-opts")

    code, out, _ = run(
        "produce", "cli-produce-opts", "a", "b", "--header", "kind=test", "--header", "team=ops",
        "--source", "shop", "--external-id", "100",
    )  # fmt: skip
    assert (code, out) == (0, "1\n2\n")
    code, out, _ = run("produce", "cli-produce-opts", "b again", "--source", "shop", "--external-id", "101")
    assert (code, out) == (0, "2 duplicate\n")
    messages = blocking_client.read("cli-produce-opts").messages
    assert [(m.source, m.external_id, m.headers) for m in messages] == [
        ("shop", 100, {"kind": "test", "team": "ops"}),
        ("shop", 101, {"kind": "test", "team": "ops"}),
    ]

    code, out, _ = run("produce", "cli-produce-opts", "later", "--delay", "1h")
    [item] = blocking_client.scheduled("cli-produce-opts").scheduled
    assert (code, out) == (0, f"scheduled {item.scheduled_id} due {utc(item.deliver_at)}\n")
    code, out, _ = run("produce", "cli-produce-opts", "much later", "--deliver-at", "2030-01-01T00:00:00Z")
    assert code == 0 and out.endswith(" due 2030-01-01T00:00:00Z\n")
    code, out, _ = run(
        "produce", "cli-produce-opts", "x", "--delay", "1h", "--deliver-at", "2030-01-01T00:00:00Z"
    )
    assert code == 2  # one due time or the other


def test_produce_ndjson_prints_what_happened_to_each_line(run: Run, blocking_client: Client) -> None:
    blocking_client.put_queue("cli-ndjson-due")
    lines = [
        '{"data": "now", "external_id": 5}',
        '{"data": "later", "delay": "1h"}',
        '{"data": "now", "external_id": 5}',
    ]

    code, out, _ = run("produce", "cli-ndjson-due", "--ndjson", *lines)

    [item] = blocking_client.scheduled("cli-ndjson-due").scheduled
    assert (code, out) == (0, f"1\nscheduled {item.scheduled_id} due {utc(item.deliver_at)}\n1 duplicate\n")
    assert "UNSET" not in out
    code, out, _ = run("produce", "cli-ndjson-due", "--ndjson", '{"data": "later", "delay": "1h"}', "--json")
    assert code == 0 and set(json.loads(out)) == {"scheduled_id", "deliver_at", "duplicate"}


def test_produce_ndjson_reports_the_bad_line(run: Run, blocking_client: Client) -> None:
    blocking_client.put_queue("cli-ndjson-bad")

    code, _, err = run("produce", "cli-ndjson-bad", "--ndjson", '{"data": "ok"}', "[1]")

    assert code == 1
    assert err.startswith("capella: invalid_message: line 2 ")


def test_produce_from_a_pipe(server_process: ServerProcess, blocking_client: Client) -> None:
    blocking_client.put_queue("cli-pipe")

    done = capella(server_process, "produce", "cli-pipe", stdin=b"first\nsecond\n")

    assert (done.returncode, done.stdout, done.stderr) == (0, b"1\n2\n", b"")


# --- consume -----------------------------------------------------------------------------


def test_consume_prints_payloads_after_an_id(run: Run, blocking_client: Client) -> None:
    blocking_client.put_queue("cli-consume")
    blocking_client.produce("cli-consume", [f"m{i}" for i in range(1, 6)])

    assert run("consume", "cli-consume") == (0, "m1\nm2\nm3\nm4\nm5\n", "")
    assert run("consume", "cli-consume", "--after", "3") == (0, "m4\nm5\n", "")
    assert run("consume", "cli-consume", "--after", "1", "--limit", "2") == (0, "m2\nm3\n", "")


def test_consume_json_prints_whole_messages(run: Run, blocking_client: Client) -> None:
    blocking_client.put_queue("cli-consume-json")
    blocking_client.produce("cli-consume-json", [{"data": "a", "segment": 2}, b"\xff"])

    code, out, _ = run("consume", "cli-consume-json", "--json")

    messages = [json.loads(line) for line in out.splitlines()]
    assert code == 0
    assert [(m["id"], m["segment"]) for m in messages] == [(1, 2), (2, 0)]
    assert (messages[0]["data"], messages[1]["data_b64"]) == ("a", "/w==")
    assert "payload" not in messages[0]


def test_consume_filters_segments(run: Run, blocking_client: Client) -> None:
    blocking_client.put_queue("cli-consume-seg")
    blocking_client.produce("cli-consume-seg", [{"data": str(s), "segment": s} for s in range(5)])

    assert run("consume", "cli-consume-seg", "--segments", "1-2,4") == (0, "1\n2\n4\n", "")


def test_consume_filters_by_source_header_and_json_field(run: Run, blocking_client: Client) -> None:
    blocking_client.put_queue("cli-consume-where")
    blocking_client.produce(
        "cli-consume-where",
        [
            {"data": '{"customer": {"id": 42}}', "source": "shop", "headers": {"kind": "order"}},
            {"data": '{"customer": {"id": 42}}', "source": "till", "headers": {"kind": "order"}},
            {"data": '{"customer": {"id": "42"}}', "source": "shop", "headers": {"kind": "order"}},
            {"data": "plain", "source": "shop", "headers": {"kind": "refund"}},
        ],
    )
    code, out, _ = run("consume", "cli-consume-where", "--source", "shop", "--json")
    assert (code, [json.loads(line)["id"] for line in out.splitlines()]) == (0, [1, 3, 4])
    assert run("consume", "cli-consume-where", "--header", "kind=refund") == (0, "plain\n", "")
    code, out, _ = run("consume", "cli-consume-where", "--field", "customer.id=42", "--json")
    assert [json.loads(line)["id"] for line in out.splitlines()] == [1, 2]
    code, out, _ = run("consume", "cli-consume-where", "--field", 'customer.id="42"', "--json")
    assert [json.loads(line)["id"] for line in out.splitlines()] == [3]
    code, _, err = run("consume", "cli-consume-where", "--subscription", "s", "--source", "shop")
    assert code == 2 and "--after" in err


def test_consume_with_a_subscription_moves_its_cursor(run: Run, blocking_client: Client) -> None:
    blocking_client.put_queue("cli-sub")
    blocking_client.produce("cli-sub", ["a", "b"])

    assert run("consume", "cli-sub", "--subscription", "worker") == (0, "a\nb\n", "")
    blocking_client.produce("cli-sub", ["c"])
    assert run("consume", "cli-sub", "--subscription", "worker", "--limit", "5") == (0, "c\n", "")
    assert run("consume", "cli-sub", "--subscription", "worker") == (0, "", "")
    assert blocking_client.subscription("cli-sub", "worker").last_id == 3


def test_consume_writes_binary_payloads_raw(server_process: ServerProcess, blocking_client: Client) -> None:
    blocking_client.put_queue("cli-binary")
    blocking_client.produce("cli-binary", ["text", b"\xff\x00"])

    done = capella(server_process, "consume", "cli-binary")

    assert (done.returncode, done.stdout) == (0, b"text\n\xff\x00\n")


def test_consume_follow_waits_for_new_messages_until_ctrl_c(
    server_process: ServerProcess, blocking_client: Client
) -> None:
    blocking_client.put_queue("cli-follow")
    blocking_client.produce("cli-follow", ["before"])
    follower = subprocess.Popen(
        [sys.executable, "-m", "capella", "--url", server_process.url, "consume", "cli-follow", "-f"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert follower.stdout is not None
        assert _readline(follower, timeout=COMMAND_TIMEOUT) == b"before\n"
        blocking_client.produce("cli-follow", ["after"])
        assert _readline(follower, timeout=COMMAND_TIMEOUT) == b"after\n"
        follower.send_signal(signal.SIGINT)
        _, err = follower.communicate(timeout=COMMAND_TIMEOUT)
        assert follower.returncode == 130
        assert b"Traceback" not in err
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.communicate(timeout=COMMAND_TIMEOUT)


def _readline(process: subprocess.Popen[bytes], timeout: float) -> bytes:
    """One line of the process's stdout, or fail after ``timeout`` seconds."""
    assert process.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        line = b""
        while not line.endswith(b"\n"):
            if not selector.select(max(0.0, deadline - time.monotonic())):
                pytest.fail(f"no output line within {timeout}s (got {line!r})")
            chunk = os.read(process.stdout.fileno(), 1024)
            if not chunk:
                pytest.fail(f"output ended early (got {line!r})")
            line += chunk
        return line


# --- errors ------------------------------------------------------------------------------


def test_an_unreachable_server_is_explained_with_its_url(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"

    code = main(["--url", url, "--timeout", "2", "queue", "list"])

    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("capella: unreachable: cannot reach ")
    assert url in err
    assert "capella serve" in err


def test_serve_with_a_bad_config_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[server]\nlisten = 'nowhere'\n")

    code = main(["serve", "--config", str(path)])

    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(f"capella: {path}: server.listen: expected HOST:PORT, got 'nowhere'")


def test_serve_with_a_missing_config_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["serve", "--config", str(tmp_path / "missing.toml")])

    assert code == 2
    assert "cannot read config file" in capsys.readouterr().err


def test_serve_runs_until_sigterm(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data")
    try:
        server.wait_ready()
        with Client(server.url, timeout=5.0) as c:
            c.put_queue("kept", save="immediate")
            c.produce("kept", ["x"])
    finally:
        code = server.stop()
    assert code == 0

    again = ServerProcess(tmp_path / "data")
    try:
        again.wait_ready()
        with Client(again.url, timeout=5.0) as c:
            assert [m.data for m in c.read("kept").messages] == ["x"]
    finally:
        again.stop()


def test_subscription_show_prints_a_groups_id_and_metadata(run: Run, tmp_path: Path) -> None:
    data = tmp_path / "data"
    name = "kafka.0123456789abcdef"

    async def seed() -> None:
        # A cursor as a consumer group's commits leave it, saved before the server starts.
        cluster = await Cluster.open(load_config(None, {"data_dir": data}))
        try:
            q, _ = await cluster.put_queue("cli-group", {})
            await q.commit(name, 0, group="orders: eu/west", metadata="line 1\nline 2")
            await q.commit("plain", 0)
        finally:
            await cluster.close()

    asyncio.run(seed())
    for server in running(ServerProcess(data)):
        code, out, _ = run("subscription", "show", "cli-group", name, url=server.url)
        assert code == 0
        fields = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in out.splitlines())
        # Printed as it is, or as JSON when a terminal would not show it on one line.
        assert (fields["group"], fields["metadata"]) == ("orders: eu/west", '"line 1\\nline 2"')
        code, out, _ = run("subscription", "show", "cli-group", "plain", url=server.url)
        shown_fields = [re.split(r"\s{2,}", line, maxsplit=1)[0] for line in out.splitlines()]
        assert code == 0 and "last id" in shown_fields
        assert "group" not in shown_fields and "metadata" not in shown_fields
        code, out, _ = run(
            "--json", "subscription", "show", "cli-group", "kafka.0123456789abcdef", url=server.url
        )
        assert (json.loads(out)["group"], json.loads(out)["metadata"]) == (
            "orders: eu/west",
            "line 1\nline 2",
        )
