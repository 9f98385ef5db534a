"""The small rules under the shared node's bad days, without processes: faults by part
(``capella.shared.fault``) and the node's lease token kept in its data dir (``node_token``)."""

from __future__ import annotations

import os
from pathlib import Path

from capella.shared.fault import POSTGRES, S3, Faults
from capella.shared.node import TOKEN_FILE, node_token


def test_a_fault_keeps_the_time_of_its_first_failure_until_its_part_succeeds() -> None:
    now = [100.0]
    faults = Faults(lambda: now[0])
    assert faults.text is None and faults.parts == [] and faults.since == 0.0

    faults.failed(S3, "put failing")
    now[0] = 105.0
    faults.failed(S3, "put failing again")
    faults.failed(POSTGRES, "commit failing")

    assert faults.parts == ["postgres", "s3"]
    assert faults.text == "commit failing; put failing again"
    assert faults.since == 100.0
    faults.ok(S3)
    assert faults.parts == ["postgres"] and faults.since == 105.0
    assert S3 not in faults and POSTGRES in faults
    faults.ok(POSTGRES)
    faults.ok(POSTGRES)  # clearing twice is fine
    assert faults.text is None


def test_the_token_is_kept_across_lives_and_not_shared_with_a_live_holder(tmp_path: Path) -> None:
    token, lock = node_token(tmp_path / "data")
    assert lock is not None and len(token) == 32
    # Another holder while this one lives (another process on this data dir): a token of its
    # own, kept nowhere, so its lease cannot take this one's name.
    other, no_lock = node_token(tmp_path / "data")
    assert no_lock is None and other != token
    assert (tmp_path / "data" / TOKEN_FILE).read_text() == token
    os.close(lock)  # the process ends (kill -9 releases it too)

    again, lock = node_token(tmp_path / "data")
    assert again == token and lock is not None
    os.close(lock)


def test_an_unreadable_token_file_is_replaced(tmp_path: Path) -> None:
    (tmp_path / TOKEN_FILE).write_text("not a token\n")
    token, lock = node_token(tmp_path)
    assert lock is not None
    assert len(token) == 32 and (tmp_path / TOKEN_FILE).read_text() == token
    assert oct((tmp_path / TOKEN_FILE).stat().st_mode & 0o777) == "0o600"
    os.close(lock)
