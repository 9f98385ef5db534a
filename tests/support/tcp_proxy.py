"""A TCP proxy on 127.0.0.1 that a test can cut and restore: for S3 (moto) and PostgreSQL outages.

moto keeps its objects in memory, so a test never kills it; it cuts the road to it instead. The
nodes are configured with the proxy's address (an s3 mount's ``endpoint_url``, a DSN's port),
and the test switches it:

- ``cut()``: every open connection is reset and every new one is accepted and reset at once
  (what a client sees when the server is down: "connection reset" / refused quickly);
- ``blackhole()``: connections are accepted and held, nothing is forwarded either way (a
  network that drops packets: only the client's timeouts end a request);
- ``restore()``: a plain proxy again.

The proxy runs its own event loop in a thread, so blocking test code can switch it while the
servers' clients talk through it. Every wait is bounded and ``stop`` ends the thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Iterator

START_TIMEOUT = 10.0
CHUNK = 65536


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST (SO_LINGER 0), not FIN: the peer's next read fails at once."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class TcpProxy:
    """Forwards ``127.0.0.1:port`` to ``upstream_port`` on 127.0.0.1 until told otherwise."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.mode = "open"  # open, cut, blackhole
        self.accepted = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tcp-proxy", daemon=True)
        self._server: asyncio.Server | None = None
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter | None]] = set()
        self._held: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> TcpProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(START_TIMEOUT)
        return self

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        try:
            asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(START_TIMEOUT)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(START_TIMEOUT)
            if not self._thread.is_alive():
                self._loop.close()

    # --- switches (call from any thread) ---

    def cut(self) -> None:
        self._switch("cut")

    def blackhole(self) -> None:
        self._switch("blackhole")

    def restore(self) -> None:
        self._switch("open")

    @contextlib.contextmanager
    def down(self, how: str = "cut") -> Iterator[TcpProxy]:
        """Cut (or blackhole) for the block; restored however the block ends."""
        self._switch(how)
        try:
            yield self
        finally:
            self.restore()

    def _switch(self, mode: str) -> None:
        asyncio.run_coroutine_threadsafe(self._set(mode), self._loop).result(START_TIMEOUT)

    # --- inside (on the proxy's loop) ---

    async def _set(self, mode: str) -> None:
        self.mode = mode
        if mode != "open":
            # What was open breaks: reset now, or (blackhole) stop forwarding and hold it.
            for client, upstream in list(self._pairs):
                if mode == "cut":
                    _reset(client)
                else:
                    self._held.add(client)
                if upstream is not None:
                    _reset(upstream)
            self._pairs.clear()
        else:
            for client in list(self._held):
                _reset(client)
            self._held.clear()

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for client, upstream in list(self._pairs):
            _reset(client)
            if upstream is not None:
                _reset(upstream)
        for client in list(self._held):
            _reset(client)
        self._pairs.clear()
        self._held.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self.mode == "cut":
            _reset(writer)
            return
        if self.mode == "blackhole":
            self._held.add(writer)
            return
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", self.upstream_port), START_TIMEOUT
            )
        except (OSError, TimeoutError):
            _reset(writer)
            return
        pair = (writer, up_writer)
        self._pairs.add(pair)
        try:
            await asyncio.gather(self._pipe(reader, up_writer, pair), self._pipe(up_reader, writer, pair))
        finally:
            self._pairs.discard(pair)
            for w in (writer, up_writer):
                if w not in self._held:
                    w.transport.abort()

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        pair: tuple[asyncio.StreamWriter, asyncio.StreamWriter | None],
    ) -> None:
        try:
            while pair in self._pairs:
                data = await reader.read(CHUNK)
                if not data or pair not in self._pairs:
                    break
                writer.write(data)
                await writer.drain()
        except (OSError, ConnectionError):
            pass
        finally:
            if pair in self._pairs:
                # One side ended: end the other side too (a half-closed proxy would hang its peer).
                self._pairs.discard(pair)
                for w in pair:
                    if w is not None and w not in self._held:
                        with contextlib.suppress(OSError):
                            w.close()
