"""The Kafka listener: an asyncio server that reads framed requests and answers them in order.

Each connection is served one request at a time, in the order it sent them, which is what
Kafka promises a client (a long-polling Fetch or a waiting JoinGroup blocks only its own
connection; clients use another one for the rest). A frame is bounded before it is read:
``[kafka] max_frame_before_sign_in`` until the client has signed in, ``server.max_body_size``
after. A frame that does not parse, an unknown API or version, or a request other than
ApiVersions and SASL before sign-in closes that connection only, as Kafka brokers do; so does
not having signed in ``[kafka] sign_in_timeout`` after connecting (the TLS handshake included).
A connection over ``max_connections``, or over ``max_connections_per_address`` from one
client address, is closed at once. An ApiVersions of a version this broker does not serve is
answered UNSUPPORTED_VERSION with a v0 body listing the versions it does (KIP-511), so the
client retries with one of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Iterator
from typing import Any

from capella.auth.authenticator import Authenticator
from capella.auth.throttle import client_key
from capella.backoff import backoff
from capella.config import KafkaSettings
from capella.core.cluster import Cluster
from capella.core.stats import ProtocolStats
from capella.errors import CorruptKafkaFrame, InvalidConfig
from capella.kafka import errors, sasl
from capella.kafka.codec import Header, decode_request, encode_response, frame_size, read_header
from capella.kafka.groups import Coordinator
from capella.kafka.nodes import STANDALONE, KafkaNode, node_id
from capella.kafka.session import Broker, Session
from capella.kafka.versions import API_VERSIONS, APIS, advertised
from capella.tally import LOG_EVERY, Tally

log = logging.getLogger(__name__)

# The smallest request: a header with a null client id.
MIN_FRAME = 10
# How often the group coordinator looks for members past their session timeout.
EXPIRE_INTERVAL = 0.5


class Close(Exception):
    """The connection is closed after this request (its answer, if any, is sent first)."""


class KafkaListener:
    """Serves the Kafka protocol on ``[kafka] listen`` for the broker's cluster."""

    @classmethod
    def of(
        cls,
        cluster: Cluster,
        settings: KafkaSettings,
        *,
        max_frame: int,
        authenticator: Authenticator | None,
        ssl_context: ssl.SSLContext | None,
    ) -> KafkaListener:
        coordinator = Coordinator(max_groups=settings.max_groups, max_members=settings.max_group_members)
        broker = Broker(
            cluster,
            settings,
            coordinator,
            authenticator,
            max_frame=max_frame,
            producer_ids=cluster.producer_ids,
            node_id=STANDALONE if cluster.shared is None else node_id(cluster.shared.node),
        )
        return cls(broker, ssl_context=ssl_context)

    def __init__(self, broker: Broker, *, ssl_context: ssl.SSLContext | None = None) -> None:
        self.broker = broker
        self._ssl = ssl_context
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[Any]] = set()
        self._per_address: dict[str, int] = {}  # open connections by client_key
        settings = broker.settings
        self._refused = Tally(
            "kafka connections refused: %d over max_connections=%d", settings.max_connections, log
        )
        self._refused_address = Tally(
            "kafka connections refused: %d over max_connections_per_address=%d",
            settings.max_connections_per_address,
            log,
        )
        self._not_signed_in = Tally(
            "kafka connections closed: %d did not sign in within sign_in_timeout=%gs",
            settings.sign_in_timeout,
            log,
        )
        self._bad_frames = Tally(
            "kafka connections closed: %d sent a bad frame (one line per %gs; each at debug level)",
            LOG_EVERY,
            log,
        )
        self._expiry: asyncio.Task[None] | None = None
        self._nodes_seen: list[KafkaNode] | None = None
        self.stats = ProtocolStats()
        broker.cluster.doors["kafka"] = self.stats

    @property
    def address(self) -> tuple[str, int]:
        """Where the listener is bound (the port chosen when ``listen`` asked for port 0)."""
        assert self._server is not None
        host, port = self._server.sockets[0].getsockname()[:2]
        return str(host), int(port)

    async def start(self) -> None:
        settings = self.broker.settings
        try:
            loop = asyncio.get_running_loop()
            self._server = await loop.create_server(
                self._protocol, settings.host, settings.port, reuse_address=True
            )
        except OSError as exc:
            raise InvalidConfig(
                f"cannot listen for Kafka clients on {settings.listen}: {exc.strerror}"
            ) from None
        host, port = self.address
        if settings.advertised is None:
            self.broker.host, self.broker.port = host, port
        else:
            self.broker.host, self.broker.port = settings.advertised_host, settings.advertised_port
        if self.broker.cluster.shared is not None:
            self.broker.cluster.shared.publish_kafka(self.broker.host, self.broker.port)
        self._expiry = asyncio.create_task(self._expire_loop(), name="kafka-group-expiry")
        log.info("kafka listening on %s:%d advertised=%s:%d", host, port, self.broker.host, self.broker.port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._expiry is not None:
            self._expiry.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._expiry
        self.broker.coordinator.close()
        for tally in (self._refused, self._refused_address, self._not_signed_in, self._bad_frames):
            tally.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.wait(self._connections, timeout=5)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), timeout=5)

    async def _expire_loop(self) -> None:
        failures = 0
        pause = EXPIRE_INTERVAL
        while True:
            await asyncio.sleep(pause if not failures else backoff(failures, EXPIRE_INTERVAL, 30.0))
            try:
                upcoming = self.broker.coordinator.expire()
                self._hand_over()
                failures = 0
                # Until the next deadline (an initial rebalance delay of 0.3 s), at most the interval.
                pause = EXPIRE_INTERVAL
                if upcoming is not None:
                    pause = min(EXPIRE_INTERVAL, max(0.01, upcoming - time.monotonic()))
            except Exception as exc:  # a bug: logged and counted, and the loop goes on
                failures += 1
                log.error("kafka group expiry failed failures=%d", failures, exc_info=exc)

    def _hand_over(self) -> None:
        """Once the shared cluster's live nodes change, forget the groups another node
        coordinates now: their waiting calls are answered NOT_COORDINATOR, and their members
        find the new coordinator and join there (their offsets are in PostgreSQL)."""
        nodes = self.broker.live()
        if nodes is self._nodes_seen:
            return
        self._nodes_seen = nodes
        for group in self.broker.coordinator.groups():
            coordinator = self.broker.coordinator_of(group.group_id)
            if coordinator.name != self.broker.name:
                log.info("kafka group moved group=%r node=%s", group.group_id, coordinator.name)
                self.broker.coordinator.unload(group.group_id)

    def _protocol(self) -> asyncio.StreamReaderProtocol:
        """asyncio.start_server's protocol, but TLS starts in ``_serve``, once the connection is
        counted against the limits: handshakes that never finish then hold slots too, instead
        of piling up beside max_connections."""
        reader = asyncio.StreamReader()
        if self._ssl is None:
            return asyncio.StreamReaderProtocol(reader, self._serve)
        return _Paused(reader, self._serve)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        peer = writer.get_extra_info("peername")
        address = str(peer[0]) if isinstance(peer, tuple) else ""
        settings = self.broker.settings
        client = client_key(address)
        held = self._per_address.get(client, 0)
        refused = None
        if len(self._connections) >= settings.max_connections:
            refused = self._refused
        elif held >= settings.max_connections_per_address:
            refused = self._refused_address
        if refused is not None:
            self.stats.refused_connections += 1
            refused.add(asyncio.get_running_loop())
            writer.close()
            return
        self._connections.add(task)
        self._per_address[client] = held + 1
        self.stats.connections += 1
        self.stats.open_connections += 1
        session = Session(self.broker, address)
        loop = asyncio.get_running_loop()
        sign_in_by = loop.time() + settings.sign_in_timeout
        try:
            if self._ssl is not None:
                await writer.start_tls(self._ssl, ssl_handshake_timeout=settings.sign_in_timeout)
            await self._requests(session, reader, writer, sign_in_by)
        except TimeoutError:
            if session.needs_sign_in:
                self._not_signed_in.add(asyncio.get_running_loop())
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError, Close):
            pass
        except CorruptKafkaFrame as exc:
            self.stats.closed_by_error += 1
            # A stranger can send bad frames without end: counted per window, each at debug.
            self._bad_frames.add(asyncio.get_running_loop())
            log.debug("kafka connection closed address=%s reason=%s", address, exc.message)
        except asyncio.CancelledError:
            # ``close`` ends the connection: the handler returns rather than end cancelled,
            # which Python 3.11's streams log as an error ("Exception in callback ...").
            return
        except Exception as exc:  # a bug: this connection ends, the server goes on
            self.stats.closed_by_error += 1
            log.error("kafka connection failed address=%s", address, exc_info=exc)
        finally:
            self.stats.open_connections -= 1
            self._connections.discard(task)
            left = self._per_address.pop(client) - 1
            if left:
                self._per_address[client] = left
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), timeout=1)

    async def _requests(
        self,
        session: Session,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        sign_in_by: float,
    ) -> None:
        settings = self.broker.settings
        loop = asyncio.get_running_loop()
        while True:
            # Until it has signed in, a connection is bounded by the deadline from its opening:
            # frames sent a byte at a time do not push it back.
            wait = settings.idle_timeout
            if session.needs_sign_in:
                wait = min(wait, sign_in_by - loop.time())
            async with asyncio.timeout(wait):
                size = frame_size(await reader.readexactly(4))
                limit = settings.max_frame_before_sign_in if session.needs_sign_in else self.broker.max_frame
                # A bare PLAIN token (after SaslHandshake v0) may be shorter than any request.
                low = 1 if session.raw_token else MIN_FRAME
                if not low <= size <= limit:
                    raise CorruptKafkaFrame(f"a frame of {size} bytes (at most {limit} here)")
                frame = await reader.readexactly(size)
            if session.raw_token:
                answer = await sasl.raw_token(session, frame)
                if answer is None:
                    self.stats.sign_in_failures += 1
            else:
                answer = await self._answer(session, frame)
            if answer is not None:
                writer.write(answer)
                await writer.drain()
            if session.closing:
                raise Close()

    async def _answer(self, session: Session, frame: bytes) -> bytes | None:
        header = read_header(frame)
        api = APIS.get(header.api_key)
        if api is None:
            raise CorruptKafkaFrame(f"unknown API key {header.api_key}")
        self.stats.request(api.name)
        if api is API_VERSIONS and header.api_version > api.high:
            return unsupported_version(header)
        if not api.low <= header.api_version <= api.high:
            served = f"this broker serves v{api.low}-{api.high}"
            raise CorruptKafkaFrame(f"{api.name} v{header.api_version} ({served})")
        if session.needs_sign_in and not api.before_sign_in:
            raise CorruptKafkaFrame(f"{api.name} before SASL authentication")
        session.client_id = header.client_id
        request = decode_request(header, frame)
        body = await api.handler(session, request, header.api_version)
        if body is None:
            return None
        for code in error_codes(body):
            self.stats.error(api.name, code)
            if code == errors.SASL_AUTHENTICATION_FAILED:
                self.stats.sign_in_failures += 1
        return encode_response(header.api_key, header.api_version, header.correlation_id, body)


class _Paused(asyncio.StreamReaderProtocol):
    """Reads nothing until TLS starts on it: a ClientHello read into the plain stream before
    ``start_tls`` would be lost to the handshake."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        assert isinstance(transport, asyncio.ReadTransport)
        transport.pause_reading()


def error_codes(body: object) -> Iterator[int]:
    """Every error code other than NONE in an answer's fields, nested ones included."""
    if isinstance(body, dict):
        for key, value in body.items():
            if key == "error_code":
                if value:
                    yield value
            elif isinstance(value, dict | list):
                yield from error_codes(value)
    elif isinstance(body, list):
        for item in body:
            yield from error_codes(item)


def unsupported_version(header: Header) -> bytes:
    """UNSUPPORTED_VERSION with a v0 body listing every API, whatever version was asked for."""
    body = {"error_code": errors.UNSUPPORTED_VERSION, "api_keys": advertised()}
    return encode_response(header.api_key, 0, header.correlation_id, body)
