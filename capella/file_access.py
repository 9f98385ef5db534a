"""Files a definition names (a CA bundle, a client certificate): which ones, and how they are read.

A PostgreSQL handler's ``sslrootcert`` (and, for admins, ``sslcert`` and ``sslkey``) and an
external cluster's ``ca_file`` name files on the server. A user who is not an admin may name
only regular files under the directories of ``[files] allow``; an admin may name any path.
Whoever names it, a file is read here and only here, off the event loop (a daemon thread, so
nothing it does can hold the loop or the exit), opened without blocking and without following
a last symbolic link (``O_NONBLOCK | O_NOFOLLOW``: a FIFO, ``/dev/stdin`` or a device never
makes it wait), refused unless ``fstat`` says it is a regular file, and read up to
``MAX_FILE_SIZE`` within ``READ_TIMEOUT``. Callers give the bytes to ``ssl`` (``cadata``), never
the path, so what was checked is what is used.

For a user who is not an admin every failure gets one answer, whether the path does not
exist, is outside the listed directories, is no regular file, cannot be read or is too large:
a definition cannot find out which paths exist on the server. An admin is told why.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from capella.errors import FileUnavailable

# A CA bundle is well under this (Mozilla's whole bundle is ~220 KB).
MAX_FILE_SIZE = 1024 * 1024
# A regular local file is read in microseconds; a hung network file system is not waited for.
READ_TIMEOUT = 5.0
_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)


class _Unusable(Exception):
    """Why a file cannot be used, in words for an admin."""


@dataclass(frozen=True, slots=True)
class FileAccess:
    """The directories whose regular files any definition may name (resolved, absolute)."""

    allow: tuple[str, ...] = ()

    @classmethod
    def of(cls, directories: Iterable[Path | str]) -> FileAccess:
        return cls(tuple(os.path.realpath(d) for d in directories))

    def permitted(self, path: str) -> bool:
        """Whether ``path`` (resolved) is under one of the listed directories."""
        return any(path == d or path.startswith(d.rstrip("/") + "/") for d in self.allow)

    async def read(self, path: object, *, admin: bool, field: str) -> bytes:
        """The bytes of the file ``path``, for a definition made by an admin or not.

        ``FileUnavailable`` naming ``field`` when it cannot be used; for a user who is not an
        admin, the same answer whatever the reason.
        """
        try:
            async with asyncio.timeout(READ_TIMEOUT):
                return await _in_thread(self._read, path, admin)
        except _Unusable as exc:
            reason = str(exc)
        except TimeoutError:
            reason = f"not read within {READ_TIMEOUT:g} s"
        shown = path if isinstance(path, str) else repr(path)
        if admin:
            raise FileUnavailable(f"{field}: the file {shown!r} cannot be used: {reason}", field=field)
        raise FileUnavailable(
            f"{field}: the file {shown!r} cannot be used: a definition may name only a readable regular "
            f"file of at most {MAX_FILE_SIZE // 1024} KiB under a directory of [files] allow "
            f"({', '.join(self.allow) or 'none listed'}); an admin's definition may name any file",
            field=field,
        )

    def _read(self, path: object, admin: bool) -> bytes:
        if not isinstance(path, str) or not path or "\x00" in path:
            raise _Unusable("expected a file path")
        if not os.path.isabs(path):
            raise _Unusable("expected an absolute path")
        # Resolved first, so a symbolic link inside a listed directory cannot lead out of it;
        # the resolved path is opened with O_NOFOLLOW, so it cannot become a link meanwhile.
        real = os.path.realpath(path)
        if not admin and not self.permitted(real):
            raise _Unusable("outside the directories of [files] allow")
        try:
            fd = os.open(real, _FLAGS)
        except OSError as exc:
            raise _Unusable(exc.strerror or type(exc).__name__) from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise _Unusable("not a regular file")
            if info.st_size > MAX_FILE_SIZE:
                raise _Unusable(f"larger than {MAX_FILE_SIZE // 1024} KiB")
            chunks, size = [], 0
            while chunk := os.read(fd, 65536):
                chunks.append(chunk)
                size += len(chunk)
                if size > MAX_FILE_SIZE:  # it grew since fstat
                    raise _Unusable(f"larger than {MAX_FILE_SIZE // 1024} KiB")
            return b"".join(chunks)
        except OSError as exc:
            raise _Unusable(exc.strerror or type(exc).__name__) from None
        finally:
            os.close(fd)


async def _in_thread(read: Callable[[object, bool], bytes], path: object, admin: bool) -> bytes:
    """``read(path, admin)`` in a daemon thread of its own.

    Not the default executor: a read stuck in the kernel (a hung network mount) would keep
    ``asyncio.run`` from returning at exit while it waits for the executor's threads.
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[bytes] = loop.create_future()

    def settle(result: bytes | None, error: BaseException | None) -> None:
        if done.done():
            return
        if error is not None:
            done.set_exception(error)
        else:
            assert result is not None
            done.set_result(result)

    def work() -> None:
        try:
            result, error = read(path, admin), None
        except BaseException as exc:  # handed to the waiting task, which raises it
            result, error = None, exc
        # The loop may have closed meanwhile (a read that outlived its deadline and the server).
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=work, name="capella-file-read", daemon=True).start()
    return await done


def ca_data(data: bytes) -> str | bytes:
    """A CA bundle's bytes as ``SSLContext.load_verify_locations(cadata=...)`` takes them.

    PEM text as a string, DER as bytes.
    """
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        return data
    return text if "-----BEGIN" in text else data
