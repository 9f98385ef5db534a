"""Stopping a server with Kafka clients connected: their connections end, nothing is logged as a failure."""

from __future__ import annotations

import socket
import struct
from pathlib import Path

from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse
from support.kafka import KafkaServer


def test_stopping_with_connections_open_logs_no_error(tmp_path: Path) -> None:
    server = KafkaServer(tmp_path)
    try:
        server.wait_ready()
        sockets = []
        for n in range(3):
            sock = socket.create_connection(("127.0.0.1", server.kafka_port), timeout=5)
            request = ApiVersionsRequest(version=3, client_software_name="t", client_software_version="1")
            request.with_header(correlation_id=n, client_id="shutdown")
            sock.sendall(request.encode(header=True, framed=True))
            (size,) = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))
            answer = ApiVersionsResponse.decode(sock.recv(size, socket.MSG_WAITALL), version=3, header=True)
            assert answer.error_code == 0  # the connection is served, waiting for its next frame
            sockets.append(sock)
        assert server.stop() == 0
    finally:
        server.stop()
        for sock in sockets:
            sock.close()
    log = server.log_path.read_text(errors="replace")
    # Python 3.11's streams log a cancelled connection handler as "Exception in callback".
    assert "Traceback" not in log and "ERROR" not in log, log
