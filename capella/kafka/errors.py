"""Kafka's error codes, and the one table from Capella's errors to them.

The numbers are Kafka's (``org.apache.kafka.common.protocol.Errors``); a client decides from
them whether to retry, refresh its metadata, reset its offset or give up. ``code_for`` is the
only place that maps a ``CapellaError`` to one, as ``api/errors.py`` is for HTTP statuses.
"""

from __future__ import annotations

from capella.errors import (
    CapellaError,
    CorruptKafkaFrame,
    CorruptRecords,
    Forbidden,
    InvalidMessage,
    InvalidName,
    InvalidRequest,
    InvalidSubscriptionGroup,
    MessageHeadersTooLarge,
    NotFound,
    NotReady,
    PayloadTooLarge,
    QueueNotFound,
    RateLimited,
    RecordsTooLarge,
    ShuttingDown,
    StorageTimeout,
    StorageUnavailable,
    SubscriptionMetadataTooLarge,
    TransactionsNotSupported,
    Unauthorized,
    UnsupportedCompression,
    UnsupportedRecordFormat,
)

UNKNOWN_SERVER_ERROR = -1
NONE = 0
OFFSET_OUT_OF_RANGE = 1
CORRUPT_MESSAGE = 2
UNKNOWN_TOPIC_OR_PARTITION = 3
LEADER_NOT_AVAILABLE = 5
NOT_LEADER_OR_FOLLOWER = 6
REQUEST_TIMED_OUT = 7
MESSAGE_TOO_LARGE = 10
OFFSET_METADATA_TOO_LARGE = 12
COORDINATOR_LOAD_IN_PROGRESS = 14
COORDINATOR_NOT_AVAILABLE = 15
NOT_COORDINATOR = 16
INVALID_TOPIC_EXCEPTION = 17
RECORD_LIST_TOO_LARGE = 18
INVALID_REQUIRED_ACKS = 21
ILLEGAL_GENERATION = 22
INCONSISTENT_GROUP_PROTOCOL = 23
INVALID_GROUP_ID = 24
UNKNOWN_MEMBER_ID = 25
INVALID_SESSION_TIMEOUT = 26
REBALANCE_IN_PROGRESS = 27
TOPIC_AUTHORIZATION_FAILED = 29
GROUP_AUTHORIZATION_FAILED = 30
CLUSTER_AUTHORIZATION_FAILED = 31
INVALID_TIMESTAMP = 32
UNSUPPORTED_SASL_MECHANISM = 33
ILLEGAL_SASL_STATE = 34
UNSUPPORTED_VERSION = 35
INVALID_REQUEST = 42
UNSUPPORTED_FOR_MESSAGE_FORMAT = 43
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
KAFKA_STORAGE_ERROR = 56
SASL_AUTHENTICATION_FAILED = 58
UNSUPPORTED_COMPRESSION_TYPE = 76
MEMBER_ID_REQUIRED = 79
GROUP_MAX_SIZE_REACHED = 81
FENCED_INSTANCE_ID = 82
INVALID_RECORD = 87
THROTTLING_QUOTA_EXCEEDED = 89

# The first class of an error's MRO found here gives its code.
CODES: dict[type[CapellaError], int] = {
    QueueNotFound: UNKNOWN_TOPIC_OR_PARTITION,
    InvalidName: INVALID_TOPIC_EXCEPTION,
    PayloadTooLarge: MESSAGE_TOO_LARGE,
    MessageHeadersTooLarge: INVALID_RECORD,
    InvalidMessage: INVALID_RECORD,
    CorruptKafkaFrame: CORRUPT_MESSAGE,
    CorruptRecords: CORRUPT_MESSAGE,
    UnsupportedRecordFormat: UNSUPPORTED_FOR_MESSAGE_FORMAT,
    TransactionsNotSupported: INVALID_REQUEST,
    UnsupportedCompression: UNSUPPORTED_COMPRESSION_TYPE,
    RecordsTooLarge: RECORD_LIST_TOO_LARGE,
    SubscriptionMetadataTooLarge: OFFSET_METADATA_TOO_LARGE,
    InvalidSubscriptionGroup: INVALID_GROUP_ID,
    InvalidRequest: INVALID_REQUEST,
    Unauthorized: SASL_AUTHENTICATION_FAILED,
    Forbidden: TOPIC_AUTHORIZATION_FAILED,
    RateLimited: THROTTLING_QUOTA_EXCEEDED,
    NotFound: UNKNOWN_TOPIC_OR_PARTITION,
    StorageTimeout: REQUEST_TIMED_OUT,
    # Retriable for every client: it retries the write after a backoff.
    StorageUnavailable: KAFKA_STORAGE_ERROR,
    NotReady: LEADER_NOT_AVAILABLE,
    ShuttingDown: NOT_LEADER_OR_FOLLOWER,
}


def code_for(exc: CapellaError) -> int:
    """The Kafka error code a client is answered with for ``exc``."""
    return next((CODES[c] for c in type(exc).__mro__ if c in CODES), UNKNOWN_SERVER_ERROR)
