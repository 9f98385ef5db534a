"""Optional C kernels for per-message loops a profile still showed: ``KERNELS``, or None.

``capella/_kernels.c`` is built by ``pip install`` where a C compiler and Python's headers
exist (``setup.py``: optional, as in aiohttp, yarl and multidict), and used unless the
environment sets ``CAPELLA_NO_EXTENSIONS=1``. Every kernel has a pure-Python equivalent
that its caller falls back to, also when the kernel returns None for an input it leaves to
Python; ``tests/core/test_kernels.py`` checks the two against each other on generated input.

- ``batch_json(data, body, end, flags, count, base_id, base_time, source)``: each message of
  a record batch as its StoredMessage JSON object (``capella.core.log.batch.Batch.json``).
- ``batch_messages(make, data, body, end, flags, count, base_id, base_time, source)``: each
  message of a record batch as ``make(id, time, source, external_id, external_time, segment,
  headers, data)`` (``capella.wire.batch_page.decode_page``: the client's binary reads).

- ``crc32(data, value=0)``: ``zlib.crc32``'s answer, folded with PCLMULQDQ where the CPU
  has it (``FAST_CRC32``); four to five times as fast as zlib on the blocks a read checks. The module's
  ``crc32`` is that kernel when it is fast, ``zlib.crc32`` otherwise.
- ``crc32c(data, value=0)``: CRC-32C (Castagnoli), running as ``zlib.crc32`` does, for Kafka's
  record batches: the SSE4.2 ``crc32`` instruction in three streams where the CPU has it
  (``FAST_CRC32C``: ~23 GB/s on a MiB, 16 on 16 KiB), slicing-by-8 tables otherwise (~1.5
  GB/s); Python manages ~14 MB/s. The module's ``crc32c`` is
  the kernel, or ``capella.crc32c.crc32c`` (pure Python) when the kernels are not built.
- ``kafka_records(ids, external_times, payloads, headers, start, stop, slow)``: the records of
  one Kafka batch (v2, uncompressed) for messages ``start..stop`` of a batch's columns, with
  its first and greatest CreateTime (``capella.kafka.records``, the fetch's render); a message
  with headers is mapped by ``slow`` (the Python mapping of keys, null values and headers).
- ``kafka_batch_records(slow, data, body, end, flags, count, base_id, base_time)``: the same for
  every message of a stored record batch, read from its body (no columns made in between).

The record batch's head comes from ``capella.records.record_batch.read`` (checked); the kernels
parse the body and trust nothing of it. Each returns None for what it leaves to Python: a
payload that is not UTF-8, a time orjson writes in exponent notation, a body that does not
parse (Python then raises ``CorruptData``).
"""

from __future__ import annotations

import importlib
import os
import zlib
from collections.abc import Callable
from typing import Protocol, TypeVar, cast

T = TypeVar("T")

# kafka_records' and kafka_batch_records' mapping of a message with headers (``capella.kafka.
# records._parts``), and their answer: the records, the first and the greatest CreateTime.
KafkaParts = Callable[[dict[str, str], bytes, int], tuple[bytes, bytes | None, int, bytes]]
KafkaRecords = tuple[bytes, int, int]


class Crc32(Protocol):
    def __call__(self, data: bytes | bytearray | memoryview, value: int = 0, /) -> int: ...


class Kernels(Protocol):
    def batch_json(
        self,
        data: bytes,
        body: int,
        end: int,
        flags: int,
        count: int,
        base_id: int,
        base_time: float,
        source: str,
        /,
    ) -> list[bytes] | None: ...

    def batch_messages(
        self,
        make: Callable[[int, float, str, int, float, int, dict[str, str], str], T],
        data: bytes,
        body: int,
        end: int,
        flags: int,
        count: int,
        base_id: int,
        base_time: float,
        source: str,
        /,
    ) -> list[T] | None: ...

    def kafka_records(
        self,
        ids: list[int],
        external_times: list[float],
        payloads: list[bytes],
        headers: list[dict[str, str]],
        start: int,
        stop: int,
        slow: KafkaParts,
        /,
    ) -> KafkaRecords | None: ...

    def kafka_batch_records(
        self,
        slow: KafkaParts,
        data: bytes,
        body: int,
        end: int,
        flags: int,
        count: int,
        base_id: int,
        base_time: float,
        /,
    ) -> KafkaRecords | None: ...

    crc32: Crc32
    crc32c: Crc32
    crc32c_tables: Crc32  # crc32c's table path alone (tests/core/test_crc32c.py)

    FAST_CRC32: bool
    FAST_CRC32C: bool


def _load() -> Kernels | None:
    if os.environ.get("CAPELLA_NO_EXTENSIONS", "") not in ("", "0"):
        return None
    try:
        return cast(Kernels, importlib.import_module("capella._kernels"))
    except ImportError:
        return None


KERNELS = _load()
crc32: Crc32 = KERNELS.crc32 if KERNELS is not None and KERNELS.FAST_CRC32 else zlib.crc32


def _crc32c() -> Crc32:
    if KERNELS is not None:
        return KERNELS.crc32c
    # Imported only here: its tables take half a MiB that a process with the kernels never needs.
    from capella.crc32c import crc32c

    return crc32c


crc32c: Crc32 = _crc32c()
