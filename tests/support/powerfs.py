"""A FUSE filesystem that forgets, at a power cut, everything that was not fsync'd.

``python tests/support/powerfs.py MOUNTPOINT [CAPACITY_BYTES]`` serves an in-memory filesystem at
MOUNTPOINT until it is unmounted. It keeps two states of everything:

- a file's bytes now, and its bytes as of its last ``fsync``/``fdatasync``;
- a directory's entries now, and its entries as of its last ``fsync`` of the directory.

Writing anything to ``MOUNTPOINT/.power-cut`` is the power going out and coming back: every
directory gets back its durable entries and every file its durable bytes, walking from the
root, so a file created and fsync'd but never linked durably (its directory not fsync'd) is
gone, as are writes after the last fsync. This is the strictest behaviour POSIX allows (ext4
usually keeps more), which is what a durability test wants. Writing ``size N`` instead sets
the capacity in bytes (0: unlimited); a write past it fails with ENOSPC.

Tests only: everything is held in memory, in one thread, with no locking.
"""

from __future__ import annotations

import errno
import stat
import sys
import time
from dataclasses import dataclass, field

from mfusepy import FUSE, FuseOSError, Operations

CONTROL = "/.power-cut"


@dataclass(eq=False)
class Node:
    is_dir: bool
    mode: int
    data: bytearray = field(default_factory=bytearray)
    durable: bytes = b""
    entries: dict[str, Node] = field(default_factory=dict)
    durable_entries: dict[str, Node] = field(default_factory=dict)
    mtime: int = field(default_factory=time.time_ns)


class PowerFS(Operations):  # type: ignore[misc]
    use_ns = True

    def __init__(self, capacity: int = 0) -> None:
        self.root = Node(is_dir=True, mode=0o755)
        self.handles: dict[int, Node] = {}
        self.next_handle = 1
        self.capacity = capacity
        self.used = 0
        self.cuts = 0

    # --- the power ---

    def cut(self) -> None:
        def restore(node: Node) -> None:
            if node.is_dir:
                node.entries = dict(node.durable_entries)
                for child in node.entries.values():
                    restore(child)
            else:
                node.data = bytearray(node.durable)
                self.used += len(node.data)

        self.used = 0
        restore(self.root)
        self.handles.clear()
        self.cuts += 1

    def _control(self, data: bytes) -> None:
        words = data.decode().split()
        if words[:1] == ["size"]:
            self.capacity = int(words[1])
        else:
            self.cut()

    # --- paths ---

    def _lookup(self, path: str) -> Node:
        node = self.root
        for part in filter(None, path.split("/")):
            if not node.is_dir or part not in node.entries:
                raise FuseOSError(errno.ENOENT)
            node = node.entries[part]
        return node

    def _parent(self, path: str) -> tuple[Node, str]:
        head, _, name = path.rstrip("/").rpartition("/")
        parent = self._lookup(head or "/")
        if not parent.is_dir:
            raise FuseOSError(errno.ENOTDIR)
        return parent, name

    def _node(self, path: str | None, fh: int | None) -> Node:
        if fh is not None and fh in self.handles:
            return self.handles[fh]
        if path is None:
            raise FuseOSError(errno.EBADF)
        return self._lookup(path)

    def _handle(self, node: Node) -> int:
        fh, self.next_handle = self.next_handle, self.next_handle + 1
        self.handles[fh] = node
        return fh

    def _resize(self, node: Node, size: int) -> None:
        grow = size - len(node.data)
        if grow > 0 and self.capacity and self.used + grow > self.capacity:
            raise FuseOSError(errno.ENOSPC)
        if grow > 0:
            node.data.extend(bytes(grow))
        else:
            del node.data[size:]
        self.used += grow

    # --- operations ---

    def getattr(self, path: str, fh: int | None = None) -> dict[str, int]:
        if path == CONTROL:
            return {"st_mode": stat.S_IFREG | 0o600, "st_nlink": 1, "st_size": 0}
        node = self._node(path, fh)
        kind = stat.S_IFDIR if node.is_dir else stat.S_IFREG
        return {
            "st_mode": kind | node.mode,
            "st_nlink": 2 if node.is_dir else 1,
            "st_size": len(node.data),
            "st_mtime": node.mtime,
            "st_ctime": node.mtime,
            "st_atime": node.mtime,
        }

    def readdir(self, path: str, fh: int) -> list[str]:
        return [".", "..", *self._lookup(path).entries]

    def mkdir(self, path: str, mode: int) -> int:
        parent, name = self._parent(path)
        if name in parent.entries:
            raise FuseOSError(errno.EEXIST)
        parent.entries[name] = Node(is_dir=True, mode=mode & 0o7777)
        return 0

    def rmdir(self, path: str) -> int:
        parent, name = self._parent(path)
        node = self._lookup(path)
        if node.entries:
            raise FuseOSError(errno.ENOTEMPTY)
        del parent.entries[name]
        return 0

    def create(self, path: str, mode: int, flags: int = 0) -> int:
        if path == CONTROL:
            return 0
        parent, name = self._parent(path)
        node = Node(is_dir=False, mode=mode & 0o7777)
        parent.entries[name] = node
        return self._handle(node)

    def open(self, path: str, flags: int) -> int:
        if path == CONTROL:
            return 0
        return self._handle(self._lookup(path))

    def read(self, path: str | None, size: int, offset: int, fh: int) -> bytes:
        return bytes(self._node(path, fh).data[offset : offset + size])

    def write(self, path: str | None, data: bytes, offset: int, fh: int) -> int:
        if path == CONTROL:
            self._control(data)
            return len(data)
        node = self._node(path, fh)
        end = offset + len(data)
        if end > len(node.data):
            self._resize(node, end)
        node.data[offset:end] = data
        node.mtime = time.time_ns()
        return len(data)

    def truncate(self, path: str | None, length: int, fh: int | None = None) -> int:
        if path == CONTROL:
            return 0
        self._resize(self._node(path, fh), length)
        return 0

    def unlink(self, path: str) -> int:
        parent, name = self._parent(path)
        node = parent.entries.pop(name, None)
        if node is None:
            raise FuseOSError(errno.ENOENT)
        if node not in self.handles.values():
            self.used -= len(node.data)
        return 0

    def rename(self, old: str, new: str) -> int:
        old_parent, old_name = self._parent(old)
        new_parent, new_name = self._parent(new)
        node = old_parent.entries.get(old_name)
        if node is None:
            raise FuseOSError(errno.ENOENT)
        replaced = new_parent.entries.get(new_name)
        if replaced is not None and replaced.is_dir and replaced.entries:
            raise FuseOSError(errno.ENOTEMPTY)
        if replaced is not None and replaced is not node and replaced not in self.handles.values():
            self.used -= len(replaced.data)
        del old_parent.entries[old_name]
        new_parent.entries[new_name] = node
        return 0

    def fsync(self, path: str | None, datasync: int, fh: int) -> int:
        node = self._node(path, fh)
        node.durable = bytes(node.data)
        return 0

    def fsyncdir(self, path: str | None, datasync: int, fh: int) -> int:
        node = self._lookup(path or "/")
        node.durable_entries = dict(node.entries)
        return 0

    def release(self, path: str | None, fh: int) -> int:
        self.handles.pop(fh, None)
        return 0

    def flush(self, path: str | None, fh: int) -> int:
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        total = (self.capacity or 1 << 40) // 4096
        free = max(0, total - self.used // 4096)
        return {"f_bsize": 4096, "f_frsize": 4096, "f_blocks": total, "f_bfree": free, "f_bavail": free}

    def chmod(self, path: str, mode: int) -> int:
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        return 0


def main() -> None:
    mountpoint = sys.argv[1]
    capacity = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    # No kernel caching: after a cut, every lookup, size and byte comes from here again.
    FUSE(
        PowerFS(capacity),
        mountpoint,
        foreground=True,
        nothreads=True,
        direct_io=True,
        hard_remove=True,
        entry_timeout=0,
        attr_timeout=0,
        negative_timeout=0,
    )


if __name__ == "__main__":
    main()
