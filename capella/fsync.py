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

``write_atomic`` is the one way a whole file is written: every file Capella replaces (a
value on a ``file`` mount, the users and tokens, the CLI's contexts) or creates once and
never replaces (the cluster name, the key of stored secrets) goes through it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

FILE_MODE = 0o600
DIRECTORY_MODE = 0o700
# Permission bits for anyone but the owner.
_SHARED = 0o077
# In the name of a temporary file: ``<name>.tmp-<random>`` (a file mount's ``list`` skips them).
TMP_MARK = ".tmp-"
# A hard link fails with these where the file system has none (some FUSE and network ones).
_NO_HARD_LINKS = (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK)


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


def write_atomic(path: Path, data: bytes, *, temporary: Path | None = None, replace: bool = True) -> bool:
    """Make ``path`` hold ``data``, durably and privately, or leave it as it was.

    The steps, in this order: write a temporary file in the same directory (0600, creating
    missing directories 0700), fsync it, rename (or link) it to ``path``, fsync the
    directory. A crash at any step leaves the old file, or none, and at worst the temporary.

    ``temporary`` is a fixed name for callers that rewrite it each time (a leftover of a crash
    is then truncated and made private again); by default it is ``<name>.tmp-<random>``,
    created exclusively. With ``replace=False`` an existing ``path`` is never replaced: the
    file is hard-linked into place, and ``False`` answered when another writer was first.
    Raises ``OSError``; the temporary file is gone either way.
    """
    if temporary is None:
        temporary = path.with_name(f"{path.name}{TMP_MARK}{secrets.token_hex(6)}")
        # A fresh random name must not exist yet: never write through someone else's file.
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    else:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    try:
        try:
            fd = open_private(temporary, flags)
        except FileNotFoundError:
            # Only the first write under a new directory pays for creating it.
            create_directories(path.parent)
            fd = open_private(temporary, flags)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        if replace:
            os.replace(temporary, path)
            placed = True
        else:
            placed = _place(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    # fsync the directory as well: without it the rename can be lost on power failure.
    fsync_directory(path.parent)
    return placed


def _place(temporary: Path, path: Path) -> bool:
    """Link ``temporary`` to ``path`` unless ``path`` exists; whether it was ours."""
    try:
        try:
            # A hard link, not a rename: it never replaces a file another process kept first.
            os.link(temporary, path)
        except FileExistsError:
            return False
        except OSError as exc:
            if exc.errno not in _NO_HARD_LINKS:
                raise
            # No hard links here: a rename, which could only replace a file that another
            # process wrote in these same microseconds.
            if path.exists():
                return False
            os.replace(temporary, path)
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)


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
