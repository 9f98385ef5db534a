"""A fake PostgreSQL server that records the password each client sends it.

It refuses TLS, asks for a cleartext password (AuthenticationCleartextPassword), records the
PasswordMessage and fails the login: enough to see what a driver would send a server that a
user controls. Given a server-side ``ssl.SSLContext`` it accepts TLS instead, and records for
each password whether it came over TLS.
"""

from __future__ import annotations

import socket
import socketserver
import ssl
import struct
import threading
from collections.abc import Iterator

SSL_REQUEST = 80877103


class FakePostgres(socketserver.ThreadingTCPServer):
    """Refuses TLS (or accepts it with ``tls``), asks for a cleartext password, records it, fails."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _Session)
        self.tls = tls
        self.passwords: list[str] = []
        self.over_tls: list[bool] = []  # one per password: whether it came over TLS
        self.connections = 0

    @property
    def port(self) -> int:
        return int(self.server_address[1])


class _Session(socketserver.BaseRequestHandler):
    server: FakePostgres

    def handle(self) -> None:
        self.request.settimeout(5)
        self.server.connections += 1
        sock = self._startup(self.request)
        if sock is None:
            return
        # wrap_socket takes the file descriptor over: closing self.request would not close it.
        with sock:
            self._login(sock)

    def _startup(self, sock: socket.socket) -> socket.socket | None:
        """The socket to log in on, past any SSLRequest; ``None`` when the TLS handshake failed."""
        while True:
            length = struct.unpack("!I", _read(sock, 4))[0]
            body = _read(sock, length - 4)
            if struct.unpack("!I", body[:4])[0] != SSL_REQUEST:
                return sock
            if self.server.tls is None:
                sock.sendall(b"N")
                continue
            sock.sendall(b"S")
            try:
                sock = self.server.tls.wrap_socket(sock, server_side=True)
            except OSError:  # an ssl.SSLError: the client refused the certificate
                return None

    def _login(self, sock: socket.socket) -> None:
        sock.sendall(b"R" + struct.pack("!II", 8, 3))  # AuthenticationCleartextPassword
        try:
            kind = _read(sock, 1)
        except ConnectionError:
            return
        if kind == b"p":
            length = struct.unpack("!I", _read(sock, 4))[0]
            self.server.passwords.append(_read(sock, length - 4).rstrip(b"\0").decode())
            self.server.over_tls.append(isinstance(sock, ssl.SSLSocket))
        fields = b"SFATAL\0C28P01\0Mpassword authentication failed\0\0"
        sock.sendall(b"E" + struct.pack("!I", len(fields) + 4) + fields)


def _read(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def serving(tls: ssl.SSLContext | None = None) -> Iterator[FakePostgres]:
    """For a fixture: ``yield from serving()`` runs a fake server in a thread until the test ends."""
    server = FakePostgres(tls)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
