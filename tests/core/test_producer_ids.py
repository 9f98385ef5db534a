"""Producer ids (core/producer_ids.py): leased in blocks on the default mount, never handed out twice.

On real mounts: a restart resumes past the saved lease; concurrent takes share one save; a
failed save answers no id; a lease that does not read is an error, never a fresh start; a
process killed with -9 right after printing ids is reopened without repeating one; and under
strace, the lease's rename and the fsync of its directory come before the first id is printed.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import orjson
import pytest
from support.configs import file_config
from support.faults import FlakyStorage

from capella.core.cluster import Cluster
from capella.core.producer_ids import BLOCK, MAX_ID, LocalProducerIds
from capella.errors import CapellaError, CorruptData, StorageUnavailable
from capella.storage import Storage, keys, open_storage

LEASE = keys.PRODUCER_IDS


def file_mount(tmp_path: Path) -> Storage:
    return open_storage("file", {"root": tmp_path / "store"})


def saved(tmp_path: Path) -> dict[str, Any]:
    document: dict[str, Any] = orjson.loads((tmp_path / "store" / LEASE).read_bytes())
    return document


async def test_ids_start_at_zero_and_a_restart_resumes_past_the_saved_lease(tmp_path: Path) -> None:
    ids = LocalProducerIds(file_mount(tmp_path), block=10)
    assert ids.lease_until == 0 and not (tmp_path / "store" / LEASE).exists()  # nothing before a take
    assert [await ids.take() for _ in range(3)] == [0, 1, 2]
    # Saved before the first id of the block was answered: the block's end.
    assert saved(tmp_path) == {"version": 1, "lease_until": 10}
    again = LocalProducerIds(file_mount(tmp_path), block=10)
    # 3..9 may have been answered before a crash: skipped, never reused.
    assert [await again.take() for _ in range(12)] == list(range(10, 22))
    assert saved(tmp_path)["lease_until"] == 30
    third = LocalProducerIds(file_mount(tmp_path))
    assert await third.take() == 30
    assert saved(tmp_path)["lease_until"] == 30 + BLOCK


async def test_concurrent_takes_share_one_save_at_a_time(tmp_path: Path) -> None:
    class Watched(FlakyStorage):
        """Counts the saves of the lease, and the most in flight at once."""

        def __init__(self, inner: Storage) -> None:
            super().__init__(inner)
            self.saves = 0
            self.in_flight = 0
            self.most = 0

        async def put(self, key: str, value: bytes) -> None:
            self.saves += 1
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            try:
                await asyncio.sleep(0.01)  # a slow disk: the other takes arrive meanwhile
                await super().put(key, value)
            finally:
                self.in_flight -= 1

    mount = Watched(file_mount(tmp_path))
    ids = LocalProducerIds(mount, block=1000)
    taken = await asyncio.gather(*(ids.take() for _ in range(2500)))
    assert sorted(taken) == list(range(2500))
    assert (mount.saves, mount.most) == (3, 1)
    assert saved(tmp_path)["lease_until"] == 3000


async def test_a_failed_save_answers_no_id_and_the_next_take_goes_on_past_it(tmp_path: Path) -> None:
    mount = FlakyStorage(file_mount(tmp_path))
    ids = LocalProducerIds(mount, block=5)
    assert [await ids.take() for _ in range(5)] == [0, 1, 2, 3, 4]
    mount.fail(LEASE, StorageUnavailable("disk full"), times=2)
    for _ in range(2):
        with pytest.raises(StorageUnavailable):
            await ids.take()
    assert saved(tmp_path)["lease_until"] == 5
    assert await ids.take() == 5
    assert saved(tmp_path)["lease_until"] == 10
    # A restart after the failures hands out none of the ids answered before them.
    assert await LocalProducerIds(file_mount(tmp_path), block=5).take() == 10


@pytest.mark.parametrize(
    "document",
    [b"{not json", b'{"version": 1, "lease_until": -1}', b'{"version": 1, "lease_until": "7"}'],
)
async def test_a_lease_that_does_not_read_is_refused_not_started_again(
    tmp_path: Path, document: bytes
) -> None:
    path = tmp_path / "store" / LEASE
    path.parent.mkdir(parents=True)
    path.write_bytes(document)
    ids = LocalProducerIds(file_mount(tmp_path))
    for _ in range(2):
        with pytest.raises(CorruptData, match="producer id lease"):
            await ids.take()
    assert path.read_bytes() == document  # left for an operator, not overwritten with a new lease


async def test_the_last_ids_of_the_int64_range_and_then_none(tmp_path: Path) -> None:
    path = tmp_path / "store" / LEASE
    path.parent.mkdir(parents=True)
    path.write_bytes(orjson.dumps({"version": 1, "lease_until": MAX_ID - 2}))
    ids = LocalProducerIds(file_mount(tmp_path), block=10)
    assert [await ids.take(), await ids.take()] == [MAX_ID - 2, MAX_ID - 1]
    assert saved(tmp_path)["lease_until"] == MAX_ID
    with pytest.raises(CapellaError, match="were handed out"):
        await ids.take()


async def test_the_cluster_leases_producer_ids_on_its_default_mount(tmp_path: Path) -> None:
    config = file_config(tmp_path)
    cluster = await Cluster.open(config)
    try:
        first = [await cluster.producer_ids.take() for _ in range(3)]
    finally:
        await cluster.close()
    cluster = await Cluster.open(config)
    try:
        later = await cluster.producer_ids.take()
    finally:
        await cluster.close()
    assert first == [0, 1, 2] and later == BLOCK
    # The lease is a catalog document beside the queue registry.
    lease = tmp_path / "data" / "queues" / LEASE
    assert orjson.loads(lease.read_bytes()) == {"version": 1, "lease_until": 2 * BLOCK}
    assert lease.stat().st_mode & 0o777 == 0o600


# --- kill -9 --------------------------------------------------------------------------------

# Takes ids on a file mount and prints each one as soon as it is answered, until killed.
TAKER = textwrap.dedent(
    """
    import asyncio, sys
    from capella.core.producer_ids import LocalProducerIds
    from capella.storage import open_storage

    async def main() -> None:
        ids = LocalProducerIds(open_storage("file", {"root": sys.argv[1]}), block=int(sys.argv[2]))
        while True:
            sys.stdout.write(f"{await ids.take()}\\n")
            sys.stdout.flush()

    asyncio.run(main())
    """
)


def taker(root: Path, block: int, wrapper: list[str] | None = None) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen(
        [*(wrapper or []), sys.executable, "-c", TAKER, str(root), str(block)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def read_ids(process: subprocess.Popen[str], count: int) -> list[int]:
    assert process.stdout is not None
    found = []
    for _ in range(count):
        line = process.stdout.readline()
        if not line:
            assert process.stderr is not None
            raise AssertionError(f"the taker ended: {process.stderr.read()[-2000:]}")
        found.append(int(line))
    return found


@pytest.mark.slow
def test_ids_printed_before_a_kill_9_are_never_handed_out_again(tmp_path: Path) -> None:
    root = tmp_path / "store"
    seen: list[int] = []
    for run in range(4):
        with taker(root, block=7) as process:
            try:
                # Some runs die inside a block, one right at its end (7 * 3 ids).
                seen += read_ids(process, [5, 21, 1, 30][run])
            finally:
                process.kill()  # SIGKILL: no close, no flush of anything in memory
    assert len(set(seen)) == len(seen)
    assert seen == sorted(seen)


def completed(trace: str) -> list[str]:
    """strace -f lines in the order the calls returned, an interrupted call's two halves joined
    (``fsync(7 <unfinished ...>`` then ``<... fsync resumed>) = 0``) at its return."""
    pending: dict[str, str] = {}
    calls = []
    for line in trace.splitlines():
        # strace pads the pid column ("123  fsync(7)" beside "12345 fsync(7)").
        pid, _, text = line.partition(" ")
        text = text.lstrip()
        if text.endswith("<unfinished ...>"):
            pending[pid] = text.removesuffix("<unfinished ...>")
        elif text.startswith("<... "):
            calls.append(pending.pop(pid, "") + text.split(">", 1)[1])
        else:
            calls.append(text)
    return calls


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace (the Makefile installs it)")
def test_the_lease_is_renamed_into_place_and_its_directory_fsynced_before_an_id_is_printed(
    tmp_path: Path,
) -> None:
    root = tmp_path / "store"
    trace = tmp_path / "trace"
    calls = "openat,rename,renameat,renameat2,fsync,fdatasync,write"
    strace = ["strace", "-f", "-qq", "-o", str(trace), "-e", f"trace={calls}"]
    with taker(root, block=3, wrapper=strace) as process:
        try:
            ids = read_ids(process, 4)
        except AssertionError as exc:
            if "ptrace" in str(exc) or "not permitted" in str(exc):
                pytest.skip(f"strace cannot trace here: {exc}")
            raise
        finally:
            process.kill()
    assert ids == [0, 1, 2, 3]
    lines = completed(trace.read_text())
    lease = str(root / LEASE)
    directory = str((root / LEASE).parent)

    def index(predicate: Any, start: int = 0, end: int | None = None, *, last: bool = False) -> int:
        found = [i for i, line in enumerate(lines[:end]) if i >= start and predicate(line)]
        assert found, f"no such call in {lines[start:end]}"
        return found[-1] if last else found[0]

    def fd_of(opened: int) -> str:
        return lines[opened].rsplit("=", 1)[1].strip()

    def fsynced(fd: str) -> Any:
        return lambda line: line.startswith(f"fsync({fd})") and line.endswith("= 0")

    previous = 0
    for first_of_block in (0, 3):
        printed = index(lambda line, n=first_of_block: line.startswith(f'write(1, "{n}\\n"'), previous)
        # The lease of the block: a temporary file written and fsync'd, renamed over the lease,
        # and the directory fsync'd, all after the previous block's last id and before this
        # block's first id is printed.
        renamed = index(
            lambda line: "rename" in line and f', "{lease}"' in line and line.endswith("= 0"), previous
        )
        temporary = lines[renamed].split('"')[1]
        assert temporary.startswith(f"{lease}.tmp-")
        written = index(
            lambda line, t=temporary: f'"{t}", O_WRONLY' in line and "= -1" not in line,
            previous,
            renamed,
            last=True,
        )
        index(fsynced(fd_of(written)), written, renamed)
        opened = index(lambda line: f'"{directory}", O_RDONLY' in line and "O_DIRECTORY" in line, renamed)
        index(fsynced(fd_of(opened)), opened, printed)
        assert renamed < opened < printed
        previous = printed
