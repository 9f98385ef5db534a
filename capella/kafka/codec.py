"""The Kafka wire format: requests decoded and answers encoded by kafka-python's protocol module.

This is the only module that imports kafka-python (``kafka.protocol``, generated from Apache
Kafka's message JSON: every version, flexible ones and tagged fields included). The rest of
``capella.kafka`` reads a decoded request's fields by their schema names (``topic_data``,
``partition_data``, ``records``) and answers with plain dicts and lists of the response's
fields, which ``encode`` turns into kafka-python's structs.

A frame is a 4-byte big-endian size, then the request header: api key (int16), api version
(int16), correlation id (int32), client id (a classic nullable string even in the flexible
header v2, which then adds tagged fields). The header is read here by hand, so an unknown
key or version is told apart from a malformed frame before any schema is looked up.
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

from kafka.protocol.consumer import (
    FetchRequest,
    FetchResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from kafka.protocol.metadata import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    MetadataRequest,
    MetadataResponse,
)
from kafka.protocol.producer import (
    InitProducerIdRequest,
    InitProducerIdResponse,
    ProduceRequest,
    ProduceResponse,
)
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from capella.errors import CorruptKafkaFrame

# api key -> (request class, response class)
MESSAGES: dict[int, tuple[Any, Any]] = {
    0: (ProduceRequest, ProduceResponse),
    1: (FetchRequest, FetchResponse),
    2: (ListOffsetsRequest, ListOffsetsResponse),
    3: (MetadataRequest, MetadataResponse),
    8: (OffsetCommitRequest, OffsetCommitResponse),
    9: (OffsetFetchRequest, OffsetFetchResponse),
    10: (FindCoordinatorRequest, FindCoordinatorResponse),
    11: (JoinGroupRequest, JoinGroupResponse),
    12: (HeartbeatRequest, HeartbeatResponse),
    13: (LeaveGroupRequest, LeaveGroupResponse),
    14: (SyncGroupRequest, SyncGroupResponse),
    17: (SaslHandshakeRequest, SaslHandshakeResponse),
    18: (ApiVersionsRequest, ApiVersionsResponse),
    22: (InitProducerIdRequest, InitProducerIdResponse),
    36: (SaslAuthenticateRequest, SaslAuthenticateResponse),
}

_HEAD = struct.Struct(">hhih")
_SIZE = struct.Struct(">i")


class Header(NamedTuple):
    """A request's header as read from its frame."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


def read_header(frame: bytes) -> Header:
    """The header's fixed fields (``CorruptKafkaFrame`` when the frame is too short for them)."""
    if len(frame) < _HEAD.size:
        raise CorruptKafkaFrame(f"a Kafka request header is at least {_HEAD.size} bytes, not {len(frame)}")
    key, version, correlation, length = _HEAD.unpack_from(frame)
    client_id = None
    if length >= 0:
        end = _HEAD.size + length
        if end > len(frame):
            raise CorruptKafkaFrame("the request header's client id runs past the frame")
        client_id = frame[_HEAD.size : end].decode("utf-8", "replace")
    return Header(key, version, correlation, client_id)


def flexible(api_key: int, version: int) -> bool:
    """Whether this version of the API uses compact types and tagged fields."""
    request: Any = MESSAGES[api_key][0]
    return bool(request.flexible_version_q(version))


def schema_versions(api_key: int) -> tuple[int, int]:
    """The versions kafka-python's schema of the API knows."""
    low, high = MESSAGES[api_key][0].valid_versions
    return int(low), int(high)


def decode_request(header: Header, frame: bytes) -> Any:
    """The request's body, as kafka-python's struct (``CorruptKafkaFrame`` when it does not parse)."""
    request: Any = MESSAGES[header.api_key][0]
    try:
        return request.decode(frame, version=header.api_version, header=True)
    except Exception as exc:  # kafka-python raises struct.error, ValueError, IndexError, ...
        raise CorruptKafkaFrame(
            f"{request.__name__} v{header.api_version} does not parse: {type(exc).__name__}"
        ) from None


def encode_response(api_key: int, version: int, correlation_id: int, body: dict[str, Any]) -> bytes:
    """The framed answer to a request: ``body`` holds the response's fields by their schema names."""
    response: Any = MESSAGES[api_key][1]
    message = _built(response, body, version)
    message.with_header(correlation_id=correlation_id)
    return bytes(message.encode(header=True, framed=True))


def _built(cls: Any, values: dict[str, Any], version: int) -> Any:
    fields: dict[str, Any] = {}
    for name, field in cls._struct.fields.items():
        # A handler answers every field it knows; the version decides which are sent.
        if name not in values or not field.for_version_q(version):
            continue
        value = values[name]
        if value is not None and field.is_struct_array():
            value = [_built(field.data_class, item, version) for item in value]
        elif value is not None and field.is_struct():
            value = _built(field.data_class, value, version)
        fields[name] = value
    return cls(**fields, version=version)


def frame_size(head: bytes) -> int:
    """The size a frame's 4-byte prefix announces."""
    return int(_SIZE.unpack(head)[0])
