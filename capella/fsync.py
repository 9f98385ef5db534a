"""Durable steps on the local file system that every writer of files shares.

A new directory entry — a created file, a renamed one, a new directory — survives a power
failure only once its parent directory is fsync'd. ``create_directories`` is ``mkdir -p``
that does so for each directory it creates, and ``fsync_directory`` is the step itself.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def create_directories(path: Path, mode: int = 0o777) -> None:
    """Create ``path`` and any missing parents, fsyncing each parent that gained an entry."""
    missing: list[Path] = []
    while not path.is_dir():
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        # If another writer raced us here, fsync anyway so ours does not return before it is durable.
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, mode)
        fsync_directory(directory.parent)
