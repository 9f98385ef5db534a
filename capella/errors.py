"""Every error Capella raises, in one tree.

Each class carries a stable ``code`` that clients can rely on; ``api/errors.py`` is the only
place that maps these classes to HTTP statuses.
"""

from __future__ import annotations

from typing import ClassVar


class CapellaError(Exception):
    """An unexpected failure, a bug (the server log has the details); the root of every error
    Capella raises on purpose."""

    code = "internal"
    # Raised only by the client library or the command line: the server never answers with it.
    client_only: ClassVar[bool] = False

    def __init__(self, message: str = "", **details: object) -> None:
        super().__init__(message)
        self.message = message or self.__class__.__doc__ or self.code
        self.details = details


# --- bad input ---------------------------------------------------------------------------


class InvalidRequest(CapellaError):
    """The request is malformed or breaks a rule."""

    code = "invalid_request"


class UnknownField(InvalidRequest):
    """A body or a definition names a field its type does not take.

    ``known`` holds the fields that were allowed there, for a "did you mean" in another
    wording (the configuration says "unknown key"); it is not part of the answer.
    """

    def __init__(self, message: str = "", *, field: str = "", known: tuple[str, ...] = ()) -> None:
        super().__init__(message, field=field)
        self.known = known


class InvalidMessage(InvalidRequest):
    """A message in the request is not valid."""

    code = "invalid_message"


class MessageHeadersTooLarge(InvalidMessage):
    """A message has more headers, or more bytes of header names and values, than the limit."""

    code = "message_headers_too_large"


class InvalidBatch(InvalidRequest):
    """A record-batch body (``application/vnd.capella.batch``) does not parse: a length,
    checksum, flag or column is wrong. Nothing of the request is stored."""

    code = "invalid_batch"


class CorruptKafkaFrame(InvalidRequest):
    """A Kafka protocol frame does not parse (its header or its body); the listener closes
    that connection, as Kafka brokers do."""

    code = "corrupt_kafka_frame"


class CorruptRecords(InvalidRequest):
    """Kafka record batches (a Produce's records) do not parse: too short, truncated, a length
    or varint past its end, a CRC-32C that does not match. The Kafka listener answers
    CORRUPT_MESSAGE (2) for that partition."""

    code = "corrupt_records"


class UnsupportedRecordFormat(InvalidRequest):
    """A Kafka record batch of a message format before v2 (magic 0 or 1): only v2 is served
    (UNSUPPORTED_FOR_MESSAGE_FORMAT, 43)."""

    code = "unsupported_record_format"


class TransactionsNotSupported(InvalidRequest):
    """A transactional or control Kafka record batch: Capella does not do Kafka transactions
    (INVALID_REQUEST, 42)."""

    code = "transactions_not_supported"


class UnsupportedCompression(InvalidRequest):
    """A Kafka record batch compressed with a codec this server cannot read: lz4 or snappy
    without ``cramjam`` installed, or a codec number Kafka does not define
    (UNSUPPORTED_COMPRESSION_TYPE, 76)."""

    code = "unsupported_compression"


class InvalidName(InvalidRequest):
    """A queue, subscription or mount name is not allowed."""

    code = "invalid_name"


class InvalidSubscriptionGroup(InvalidRequest):
    """A cursor's group is empty, not text, or longer than its limit (``limit`` bytes of UTF-8)."""

    code = "invalid_subscription_group"


class SubscriptionMetadataTooLarge(InvalidRequest):
    """A cursor commit's metadata is not text or longer than its limit (``limit`` bytes of UTF-8)."""

    code = "subscription_metadata_too_large"


class InvalidSaveMode(InvalidRequest):
    """The save mode is not one of none, immediate, mark, wait, default or 0-4."""

    code = "invalid_save_mode"


class UnknownAction(InvalidRequest):
    """The original protocol's envelope names an action Capella does not know."""

    code = "unknown_action"


class TooManyHops(InvalidRequest):
    """A nested call passes through more external clusters than ``[compat] max_hops``."""

    code = "too_many_hops"


class CallLoop(InvalidRequest):
    """A nested call would come back to a cluster it already passed through."""

    code = "call_loop"


class InvalidRelayPath(InvalidRequest):
    """A relayed path (``/v1/clusters/{name}/v1/{path}``) has a segment that could mean
    another path on the far side: empty, ``.`` or ``..``, percent-encoded, a backslash, or a
    character no name of Capella's holds."""

    code = "invalid_relay_path"


class NotOnSharedQueue(InvalidRequest):
    """Shared queues do not do this in this version: ack-mode subscriptions, delayed delivery,
    push and the other per-node handlers (docs/shared.md)."""

    code = "not_on_shared_queue"


class SharedNotConfigured(InvalidRequest):
    """This node has no ``[shared]`` table, so it cannot hold a shared queue."""

    code = "shared_not_configured"


class InvalidConfig(CapellaError):
    """The configuration file or a queue definition is not valid."""

    code = "invalid_config"


class PayloadTooLarge(InvalidRequest):
    """The body, a message or a batch is larger than the configured limit."""

    code = "payload_too_large"


class RecordsTooLarge(PayloadTooLarge):
    """Kafka record batches that hold (decompressed) more than the server's body limit; the
    decompression stops there (RECORD_LIST_TOO_LARGE, 18)."""

    code = "records_too_large"


class RequestTimeout(InvalidRequest):
    """The request head or body did not arrive within its deadline."""

    code = "request_timeout"


class HeadersTooLarge(InvalidRequest):
    """The request line or a header is longer than the limit, or there are too many headers."""

    code = "headers_too_large"


class MethodNotAllowed(InvalidRequest):
    """The path exists, but not with this method; the Allow header lists the methods it takes."""

    code = "method_not_allowed"


class JsonTooDeep(InvalidRequest):
    """The JSON body nests arrays and objects deeper than the limit."""

    code = "json_too_deep"


class NotAcceptable(InvalidRequest):
    """The request's Accept header names no form this answer comes in."""

    code = "not_acceptable"


# --- who is asking ----------------------------------------------------------------------


class Unauthorized(CapellaError):
    """No valid credentials: unknown user, wrong password, disabled user, bad or expired token."""

    code = "unauthorized"


class Forbidden(CapellaError):
    """The user is known but its rules do not allow this."""

    code = "forbidden"


class CrossSiteRequest(Forbidden):
    """A browser sent a state-changing request from another site, not one in ``server.cors.origins``."""

    code = "cross_site_request"


class RelayRefused(Forbidden):
    """A relay or nested call would reach the far side's users or tokens (``/v1/users``,
    ``/v1/tokens``, the original's ``Security*`` actions): never relayed, whatever the rules."""

    code = "relay_refused"


class HandlerUserUnavailable(Forbidden):
    """The user a handler runs as does not exist (yet) or is disabled: each pass fails until it
    exists, is enabled and has rights (a handler may be defined before its user)."""

    code = "handler_user_unavailable"


class HandlerUserNotCovered(Forbidden):
    """Whoever defined a handler no longer holds everything the handler's user holds (the user
    was given more, or the definer was dropped or given less): its passes fail until it does."""

    code = "handler_user_not_covered"


class HostNotAllowed(Forbidden):
    """With authentication off, the Host header names neither a loopback host nor one of
    ``server.allowed_hosts`` (how DNS rebinding would reach the API)."""

    code = "host_not_allowed"


class RateLimited(CapellaError):
    """Too many requests of this kind for now; ``retry_after`` says how many seconds to wait."""

    code = "rate_limited"

    @property
    def retry_after(self) -> int:
        value = self.details.get("retry_after")
        return value if isinstance(value, int) and value > 0 else 1


class TooManyBodies(RateLimited):
    """This client address already has as many request bodies arriving as the server takes from one."""

    code = "too_many_bodies"


class TooManyStreams(RateLimited):
    """This user already holds as many event streams as the server allows one user."""

    code = "too_many_streams"


class TooManyLogins(RateLimited):
    """Too many logins are already waiting for a password check."""

    code = "too_many_logins"


class TooManyFailedLogins(RateLimited):
    """Too many failed logins from this client address or for this user name, for now."""

    code = "too_many_failed_logins"


class SecretUnavailable(InvalidRequest):
    """A named secret cannot be used: not declared, not granted, or without a value.

    The three get one answer, so a definition cannot probe which secrets exist.
    """

    code = "secret_unavailable"


class SecretNotForHost(InvalidRequest):
    """A definition would send a secret to a host its ``[secrets.NAME] hosts`` does not list."""

    code = "secret_not_for_host"


class FileUnavailable(InvalidRequest):
    """A file a definition names cannot be used: for a user who is not an admin one answer,
    whether it is missing, outside ``[files] allow``, no regular file, unreadable or too large."""

    code = "file_unavailable"


class EgressRefused(Forbidden):
    """The egress policy does not allow a connection to this address."""

    code = "egress_refused"


# --- lookups -----------------------------------------------------------------------------


class NotFound(CapellaError):
    """The thing asked for does not exist."""

    code = "not_found"


class QueueNotFound(NotFound):
    """No queue has this name."""

    code = "queue_not_found"


class UnknownPartition(NotFound):
    """A Kafka topic has no partition of that number."""

    code = "unknown_partition"


class TopicNotFound(NotFound):
    """No topic has this name (a topic of several partitions, defined with PUT /v1/topics/{topic})."""

    code = "topic_not_found"


class SubscriptionNotFound(NotFound):
    """The queue has no subscription with this name."""

    code = "subscription_not_found"


class HandlerNotFound(NotFound):
    """No handler has this name."""

    code = "handler_not_found"


class UserNotFound(NotFound):
    """No user has this name."""

    code = "user_not_found"


class TokenNotFound(NotFound):
    """No token has this id."""

    code = "token_not_found"


class ClusterNotFound(NotFound):
    """No external cluster has this name."""

    code = "cluster_not_found"


class MessageNotFound(NotFound):
    """The queue holds no message with this id (never stored, or expired)."""

    code = "message_not_found"


class ScheduledNotFound(NotFound):
    """Nothing scheduled has this id: it was released, cancelled or never scheduled."""

    code = "scheduled_not_found"


class KeyNotFound(NotFound):
    """A storage key holds no value."""

    code = "key_not_found"


class ContextNotFound(NotFound):
    """The CLI has no saved context of this name (``capella context list``)."""

    code = "context_not_found"
    client_only = True


class AlreadyExists(CapellaError):
    """Something with this name already exists."""

    code = "already_exists"


class NameTaken(AlreadyExists):
    """A queue and a topic cannot share a name: a Kafka client would see two topics of one name."""

    code = "name_taken"


class Conflict(CapellaError):
    """The request conflicts with the current state."""

    code = "conflict"


class SameClusterName(Conflict):
    """An external cluster has this cluster's own name: the two would mint the same identities."""

    code = "same_cluster_name"


class WrongSubscriptionMode(Conflict):
    """The call needs the other kind of subscription (a cursor, or ack mode)."""

    code = "wrong_subscription_mode"


class LeaseLost(Conflict):
    """The claim's lease is gone: it expired and the message was claimed again or dead-lettered."""

    code = "lease_lost"


class UnknownReceipt(NotFound):
    """No claim was ever handed out with this receipt."""

    code = "unknown_receipt"


# --- storage and data --------------------------------------------------------------------


class StorageUnavailable(CapellaError):
    """A storage mount cannot be read or written right now."""

    code = "storage_unavailable"


class StorageTimeout(StorageUnavailable):
    """A write was not saved within ``storage.write_timeout``; it may still be saved later."""

    code = "storage_timeout"


class Unsupported(StorageUnavailable):
    """The storage provider cannot do this (for example, append on an object store)."""

    code = "unsupported"


class DatabaseUnavailable(StorageUnavailable):
    """A PostgreSQL database cannot be reached, or the connection to it was lost."""

    code = "database_unavailable"


class DatabaseRefused(StorageUnavailable):
    """A PostgreSQL database refused: authentication, an unknown database, a permission, a statement."""

    code = "database_refused"


class TableMismatch(InvalidConfig):
    """A PostgreSQL table is missing, or one of its columns is missing or of the wrong type."""

    code = "table_mismatch"


class CorruptData(CapellaError):
    """Stored bytes failed their checksum or framing check; they are never served as data."""

    code = "corrupt_data"


class NotReady(CapellaError):
    """The server is still recovering its queues."""

    code = "not_ready"


class TooManyConnections(CapellaError):
    """The server holds as many connections as it accepts; try again later."""

    code = "too_many_connections"


class TooManyConnectionsFromAddress(TooManyConnections):
    """This client address (an IPv6 /64) holds as many connections as the server takes from one."""

    code = "too_many_connections_from_address"


class ShuttingDown(CapellaError):
    """The server is stopping and takes no new work."""

    code = "shutting_down"


# --- client ------------------------------------------------------------------------------


class Unreachable(CapellaError):
    """The server could not be reached, or did not answer in time."""

    code = "unreachable"


class GatewayTimeout(Unreachable):
    """The far server took a connection or a request but did not answer in time."""

    code = "gateway_timeout"


class NotEnoughReplicas(CapellaError):
    """Fewer clusters than required acknowledged an M-of-K write."""

    code = "not_enough_replicas"
    client_only = True


def error_classes() -> list[type[CapellaError]]:
    """Every class of the tree, each after its bases (breadth first from ``CapellaError``).

    The client reads a code as the first class here that carries it; the OpenAPI document
    lists the codes under their statuses.
    """
    found: list[type[CapellaError]] = []
    pending: list[type[CapellaError]] = [CapellaError]
    while pending:
        cls = pending.pop(0)
        if cls not in found:
            found.append(cls)
            pending.extend(cls.__subclasses__())
    return found
