"""``capella scheduled ...`` and ``capella work ...`` against a real ``capella serve`` process."""

from __future__ import annotations

import json

import pytest
from support.cli import Run

from capella.client import Client

pytestmark = pytest.mark.slow  # a real server process per module


def rows(out: str) -> list[list[str]]:
    return [line.split(None, 4) for line in out.splitlines()]


def test_scheduled_messages_are_listed_rescheduled_and_cancelled(run: Run, blocking_client: Client) -> None:
    blocking_client.put_queue("cli-later")
    first, second = blocking_client.schedule("cli-later", ["send reminder", "close the month"], delay="1h")
    sid, other = first.scheduled_id, second.scheduled_id

    code, out, _ = run("scheduled", "list", "cli-later")
    assert code == 0
    header, *found, footer = rows(out)
    assert header == ["ID", "DUE", "SOURCE", "SEGMENT", "DATA"]
    assert [(r[0], r[4]) for r in found] == [(str(sid), "send reminder"), (str(other), "close the month")]
    assert found[0][1].endswith("Z")
    assert " ".join(footer) == "2 shown, 2 scheduled in all"

    code, out, _ = run("scheduled", "reschedule", "cli-later", str(sid), "--at", "2030-01-01T00:00:00Z")
    assert (code, out) == (0, f"scheduled message {sid} due 2030-01-01T00:00:00Z\n")
    code, out, _ = run("scheduled", "list", "cli-later", "--limit", "1", "--json")
    page = json.loads(out)
    assert [m["scheduled_id"] for m in page["scheduled"]] == [other]  # the other one is due first now
    assert page["next"] is not None
    code, out, _ = run("scheduled", "list", "cli-later", "--after", page["next"])
    assert [r[0] for r in rows(out)[1:-1]] == [str(sid)]

    code, out, _ = run("scheduled", "cancel", "cli-later", str(sid), "999999")
    assert code == 1  # one of them could not be cancelled
    assert out.splitlines() == [
        f"cancelled {sid}",
        "not cancelled 999999: already delivered, being delivered, or unknown",
    ]
    assert [m.scheduled_id for m in blocking_client.scheduled("cli-later").scheduled] == [other]

    code, _, err = run("scheduled", "reschedule", "cli-later", str(other), "--delay", "soon")
    assert code == 1 and "invalid_request" in err


def test_a_work_queue_from_the_command_line(run: Run, blocking_client: Client) -> None:
    blocking_client.put_queue("cli-jobs")
    blocking_client.put_work("cli-jobs", "workers", max_attempts=2, delay=60, max_delay=60)
    blocking_client.produce(
        "cli-jobs", ["resize photo 1", "resize photo 2", {"data": "test job", "headers": {"kind": "test"}}]
    )

    code, out, _ = run("work", "claim", "cli-jobs", "workers", "--limit", "2", "--lease", "1m")
    assert code == 0
    header, *claimed = rows(out)
    assert header == ["ID", "RECEIPT", "ATTEMPT", "LEASE_UNTIL", "DATA"]
    assert [(r[0], r[2], r[4]) for r in claimed] == [
        ("1", "1", "resize photo 1"),
        ("2", "1", "resize photo 2"),
    ]
    first, second = claimed[0][1], claimed[1][1]

    code, out, _ = run("work", "ack", "cli-jobs", "workers", first)
    assert (code, out) == (0, f"{first}: done\n")
    code, out, _ = run("work", "ack", "cli-jobs", "workers", first, "999.1")
    assert code == 1  # one of the two is not a receipt the server handed out
    done, unknown = out.splitlines()
    assert done == f"{first}: done" and unknown.startswith("999.1: unknown_receipt: ")

    code, out, _ = run("work", "nack", "cli-jobs", "workers", second, "--error", "disk full")
    assert code == 0 and out.startswith(f"{second}: retry at ")
    code, out, _ = run("work", "list", "cli-jobs", "workers", "--status", "failed", "--status", "pending")
    header, *listed = rows(out)
    assert header == ["ID", "STATUS", "ATTEMPTS", "LAST_ERROR", "DATA"]
    assert [(r[0], r[1], r[2]) for r in listed] == [("2", "failed", "1"), ("3", "pending", "0")]
    assert "disk full" in out.splitlines()[1] and out.splitlines()[1].endswith("resize photo 2")

    # The operator makes it claimable now; its second failure uses up its attempts: dead.
    code, out, _ = run("work", "retry", "cli-jobs", "workers", "--status", "failed")
    assert (code, out) == (0, "retried 1\n")
    (again,) = blocking_client.claim("cli-jobs", "workers", limit=1, wait=2)
    assert (again.id, again.attempt) == (2, 2)
    code, out, _ = run("work", "nack", "cli-jobs", "workers", again.receipt, "--json")
    assert code == 0 and json.loads(out)[0]["dead"] is True
    code, out, _ = run("work", "retry", "cli-jobs", "workers", "--status", "dead")
    assert (code, out) == (0, "retried 1\n")
    code, out, _ = run("work", "list", "cli-jobs", "workers", "--json", "--status", "pending")
    assert [m["id"] for m in json.loads(out)["messages"]] == [2, 3]

    # Delete needs a selection and a confirmation.
    code, _, err = run("work", "delete", "cli-jobs", "workers", "--yes")
    assert code == 2 and "--status or --id" in err
    code, _, err = run("work", "delete", "cli-jobs", "workers", "--header", "kind=test")
    assert code == 2
    code, out, _ = run(
        "work", "delete", "cli-jobs", "workers", "--status", "pending", "--header", "kind=test", "--yes"
    )
    assert (code, out) == (0, "deleted 1\n")
    assert [m.id for m in blocking_client.work("cli-jobs", "workers", status="pending").messages] == [2]


def test_a_bulk_delete_walks_every_page(run: Run, blocking_client: Client) -> None:
    # The server changes at most 1,000 messages per call; the command repeats until none is left.
    blocking_client.put_queue("cli-bulk")
    blocking_client.put_work("cli-bulk", "workers")
    for start in range(0, 2500, 500):
        blocking_client.produce("cli-bulk", [f"job {n}" for n in range(start, start + 500)], save="none")
    code, out, _ = run("work", "delete", "cli-bulk", "workers", "--status", "pending", "--yes", "--json")
    assert code == 0 and json.loads(out) == {"deleted": list(range(1, 2501)), "next_after": None}
    assert blocking_client.work("cli-bulk", "workers", status="pending").messages == []


def test_scheduled_show_prints_fields_with_iso_times(run: Run, blocking_client: Client) -> None:
    blocking_client.put_queue("cli-later-show")
    [item] = blocking_client.schedule(
        "cli-later-show",
        [{"data": "wake up", "headers": {"kind": "alarm"}}],
        deliver_at="2030-01-01T00:00:00Z",
    )

    code, out, _ = run("scheduled", "show", "cli-later-show", str(item.scheduled_id))

    fields = dict(line.split(None, 1) for line in out.replace("scheduled id", "scheduled_id").splitlines())
    assert code == 0
    assert fields["due"] == "2030-01-01T00:00:00Z"
    assert fields["headers"] == "kind=alarm"
    assert fields["data"] == "wake up"
    code, out, _ = run("scheduled", "show", "cli-later-show", str(item.scheduled_id), "--json")
    assert json.loads(out)["deliver_at"] == 1893456000.0  # --json keeps UNIX seconds


# --- subscription ------------------------------------------------------------------------


def test_a_work_queue_is_created_changed_shown_listed_and_deleted(run: Run, blocking_client: Client) -> None:
    blocking_client.put_queue("cli-subs")
    blocking_client.put_queue("cli-subs.dead")

    code, out, _ = run(
        "subscription", "create", "cli-subs", "workers", "--max-attempts", "3", "--backoff", "fixed",
        "--delay", "2s", "--max-delay", "1m", "--jitter", "0.2", "--lease", "45s",
        "--dead-letter", "cli-subs.dead",
    )  # fmt: skip
    assert (code, out) == (0, "subscription cli-subs/workers created (work queue)\n")
    code, out, _ = run("subscription", "create", "cli-subs", "workers", "--max-attempts", "4")
    assert (code, out) == (0, "subscription cli-subs/workers updated (work queue)\n")

    policy = blocking_client.subscription("cli-subs", "workers").policy
    assert (policy.max_attempts, policy.backoff, policy.delay, policy.max_delay) == (4, "fixed", 2.0, 60.0)
    assert (policy.jitter, policy.lease, policy.dead_letter) == (0.2, 45.0, "cli-subs.dead")

    code, out, _ = run("subscription", "create", "cli-subs", "workers", "--no-dead-letter")
    assert code == 0 and blocking_client.subscription("cli-subs", "workers").policy.dead_letter is None

    code, out, _ = run("subscription", "show", "cli-subs", "workers")
    fields = dict(line.split("  ", 1) for line in out.splitlines())
    assert code == 0
    assert fields["mode"].strip() == "ack (a work queue)"
    assert fields["max attempts"].strip() == "4"
    assert fields["created"].strip().endswith("Z")  # ISO 8601, not UNIX seconds
    assert "UNSET" not in out

    code, out, _ = run("subscription", "create", "cli-subs", "reader", "--after", "0", "--replica")
    assert (code, out) == (0, "subscription cli-subs/reader created (cursor)\n")
    code, out, _ = run("subscription", "list", "cli-subs")
    _, *lines = rows(out)
    assert code == 0 and out.split()[:9] == [
        "NAME", "MODE", "LAST_ID", "LAG", "REPLICA", "IN_FLIGHT", "FAILED", "DEAD", "UPDATED",
    ]  # fmt: skip
    assert [line[:2] for line in lines] == [["reader", "cursor"], ["workers", "ack"]]

    code, _, err = run("subscription", "create", "cli-subs", "reader", "--ack")
    assert code == 1 and "wrong_subscription_mode" in err  # a mode never changes
    code, _, err = run("subscription", "create", "cli-subs", "x", "--after", "3", "--max-attempts", "2")
    assert code == 2 and "for a cursor" in err

    code, _, err = run("subscription", "delete", "cli-subs", "reader")
    assert code == 2 and "without --yes" in err
    code, out, _ = run("subscription", "delete", "cli-subs", "reader", "--yes")
    assert (code, out) == (0, "subscription cli-subs/reader deleted\n")
    assert [s.name for s in blocking_client.subscriptions("cli-subs")] == ["workers"]


def test_a_cursor_moves_forward_and_back_only_with_reset(run: Run, blocking_client: Client) -> None:
    blocking_client.put_queue("cli-cursor")
    blocking_client.produce("cli-cursor", ["a", "b", "c"])

    assert run("subscription", "create", "cli-cursor", "c", "--after", "2")[0] == 0
    assert run("subscription", "create", "cli-cursor", "c", "--after", "1")[1].endswith("updated (cursor)\n")
    assert blocking_client.subscription("cli-cursor", "c").last_id == 2  # never backwards...
    assert run("subscription", "create", "cli-cursor", "c", "--after", "1", "--reset")[0] == 0
    assert blocking_client.subscription("cli-cursor", "c").last_id == 1  # ...unless reset

    code, out, _ = run("subscription", "show", "cli-cursor", "c", "--json")
    assert code == 0 and json.loads(out)["lag"] == 2
