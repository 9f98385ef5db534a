"""The catalog of saved definitions, and the one atomic write beneath every local file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from capella.errors import CorruptData
from capella.fsync import write_atomic
from capella.storage.catalog import HANDLERS, QUEUES, USERS
from capella.storage.memory import MemoryStorage
from capella.wire.records import QueueEntry, QueueRegistry


async def test_a_missing_document_is_the_empty_one_and_a_saved_one_reads_back() -> None:
    home = MemoryStorage()
    assert (await QUEUES.load(home)).queues == {}
    registry = QueueRegistry(queues={"orders": QueueEntry(definition={"save": "wait"})})
    await QUEUES.save(home, registry)
    assert await home.get(".capella/queues.json") == (
        b'{"version":1,"queues":{"orders":{"definition":{"save":"wait"},"state":"active"}}}'
    )
    assert await QUEUES.load(home) == registry


async def test_a_document_from_before_the_version_field_still_loads() -> None:
    home = MemoryStorage()
    await home.put(".capella/queues.json", b'{"queues": {"old": {"definition": {}}}}')
    assert (await QUEUES.load(home)).queues["old"].state == "active"


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"{not json", "malformed"),
        (b'{"version": 1}', "missing required field `handlers`"),
        (b'{"handlers": {"h": {"type": "flush", "queues": [], "params": {}, "started": "yes"}}}', "started"),
    ],
)
async def test_a_document_that_is_not_its_shape_is_corrupt_data_naming_it(data: bytes, reason: str) -> None:
    home = MemoryStorage()
    await home.put(".capella/handlers.json", data)
    with pytest.raises(CorruptData, match=reason) as caught:
        await HANDLERS.load(home)
    assert "handler registry .capella/handlers.json" in caught.value.message


def test_a_file_document_is_written_private_and_indented(tmp_path: Path) -> None:
    directory = tmp_path / "auth"
    empty = USERS.read(directory)
    USERS.write(directory, empty)
    assert (directory / "users.json").read_text() == '{\n  "version": 1,\n  "users": {}\n}'
    assert os.stat(directory / "users.json").st_mode & 0o777 == 0o600
    assert os.stat(directory).st_mode & 0o777 == 0o700
    assert USERS.read(directory) == empty


def test_an_atomic_write_that_must_not_replace_keeps_the_first_file(tmp_path: Path) -> None:
    path = tmp_path / "data" / "cluster-name"
    assert write_atomic(path, b"first\n", replace=False)
    assert not write_atomic(path, b"second\n", replace=False)
    assert path.read_bytes() == b"first\n"
    assert write_atomic(path, b"third\n")
    assert path.read_bytes() == b"third\n"
    assert sorted(p.name for p in path.parent.iterdir()) == ["cluster-name"]  # no temporary left
