"""A fake PostgreSQL server that records the password each client sends it.

It refuses TLS, asks for a cleartext password (AuthenticationCleartextPassword), records the
PasswordMessage and fails the login: enough to see what a driver would send a server that a
user controls.
"""

from __future__ import annotations

import socket
import socketserver
import struct
import threading
from collections.abc import Iterator

SSL_REQUEST = 80877103


class FakePostgres(socketserver.ThreadingTCPServer):
    """Refuses TLS, asks for a cleartext password, records it, and fails the login."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Session)
        self.passwords: list[str] = []
        self.connections = 0

    @property
    def port(self) -> int:
        return int(self.server_address[1])


class _Session(socketserver.BaseRequestHandler):
    server: FakePostgres

    def handle(self) -> None:
        sock = self.request
        sock.settimeout(5)
        self.server.connections += 1
        while True:
            length = struct.unpack("!I", _read(sock, 4))[0]
            body = _read(sock, length - 4)
            if struct.unpack("!I", body[:4])[0] == SSL_REQUEST:
                sock.sendall(b"N")
                continue
            break
        sock.sendall(b"R" + struct.pack("!II", 8, 3))  # AuthenticationCleartextPassword
        try:
            kind = _read(sock, 1)
        except ConnectionError:
            return
        if kind == b"p":
            length = struct.unpack("!I", _read(sock, 4))[0]
            self.server.passwords.append(_read(sock, length - 4).rstrip(b"\0").decode())
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


def serving() -> Iterator[FakePostgres]:
    """For a fixture: ``yield from serving()`` runs a fake server in a thread until the test ends."""
    server = FakePostgres()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
