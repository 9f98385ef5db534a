"""Steps on the local file system that every writer of files shares: durable and private.

A new directory entry — a created file, a renamed one, a new directory — survives a power
failure only once its parent directory is fsync'd. ``create_directories`` is ``mkdir -p``
that does so for each directory it creates, and ``fsync_directory`` is the step itself.

Everything Capella writes is private to the user it runs as, whatever the umask: files
0600 (``FILE_MODE``), directories 0700 (``DIRECTORY_MODE``), as PostgreSQL keeps its data
directory. Definitions hold stored credentials, block files hold the messages themselves,
and a mode that differed by kind of file would be one more thing to get wrong. The mode
given to ``open`` and ``mkdir`` is masked by the umask (which can only take bits away), so
a new file or directory is also chmod'ed: an existing file opened with ``O_CREAT`` keeps its
old mode, and an odd umask such as 0277 would leave the broker unable to write its own
files. ``private_tree`` is the start-up check of a tree written before that, or by hand.
"""

from __future__ import annotations

import contextlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

FILE_MODE = 0o600
DIRECTORY_MODE = 0o700
# Permission bits for anyone but the owner.
_SHARED = 0o077


def fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def create_directories(path: Path, mode: int = DIRECTORY_MODE) -> None:
    """Create ``path`` and any missing parents with ``mode`` (0700), fsyncing each parent
    that gained an entry."""
    missing: list[Path] = []
    while not path.is_dir():
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        # If another writer raced us here, fsync anyway so ours does not return before it is durable.
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, mode)
            os.chmod(directory, mode)
        fsync_directory(directory.parent)


def open_private(path: str | Path, flags: int) -> int:
    """``os.open`` with mode 0600 whatever the umask; with ``O_CREAT`` an existing file's mode
    is set to 0600 as well."""
    fd = os.open(path, flags, FILE_MODE)
    if flags & os.O_CREAT:
        try:
            os.fchmod(fd, FILE_MODE)
        except BaseException:
            os.close(fd)
            raise
    return fd


@dataclass(frozen=True, slots=True)
class ModeFix:
    """A path that had permission bits for others: its old mode, and why it could not be
    changed (``error``; None when it was)."""

    path: Path
    mode: int
    error: str | None = None

    @property
    def private_mode(self) -> int:
        """The mode without the bits for others: what it has now, unless ``error``."""
        return self.mode & ~_SHARED


def private_tree(root: Path) -> list[ModeFix]:
    """Take the group and other permission bits off ``root`` and everything under it.

    Returns each path that had some. Symbolic links are neither followed nor changed; a path
    that cannot be changed (not the broker's own) or a directory that cannot be read is
    reported and skipped. The cost is one ``lstat`` per entry (docs/security.md).
    """
    fixes: list[ModeFix] = []
    if not root.is_dir():
        return fixes
    stack = [(str(root), os.stat(root).st_mode)]
    _fix(*stack[0], fixes)
    while stack:
        directory, mode = stack.pop()
        try:
            with os.scandir(directory) as entries:
                found = [(e.path, e.stat(follow_symlinks=False).st_mode) for e in entries]
        except OSError as exc:
            fixes.append(ModeFix(Path(directory), stat.S_IMODE(mode), exc.strerror or str(exc)))
            continue
        for path, mode in found:
            if mode & _SHARED and not stat.S_ISLNK(mode):
                _fix(path, mode, fixes)
            if stat.S_ISDIR(mode):
                stack.append((path, mode))
    return fixes


def _fix(path: str, mode: int, fixes: list[ModeFix]) -> None:
    if not mode & _SHARED:
        return
    old = stat.S_IMODE(mode)
    try:
        os.chmod(path, old & ~_SHARED)
    except OSError as exc:
        fixes.append(ModeFix(Path(path), old, exc.strerror or str(exc)))
    else:
        fixes.append(ModeFix(Path(path), old))
