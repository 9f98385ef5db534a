"""Kafka record batches to Capella's and back (capella/kafka/records.py), with kafka-python as the oracle.

kafka-python's ``kafka.record`` builds what a client sends (``DefaultRecordBatchBuilder``,
every codec it can: none, gzip, zstd; lz4 and snappy batches are its uncompressed ones with
the records compressed by ``cramjam``, as librdkafka and the Java client send them) and reads
what a fetch renders (``MemoryRecords``, CRC checked), and so does aiokafka's parser (Cython,
its own CRC-32C). Nobody here wrote any of them.
"""

from __future__ import annotations

import base64
import os
import struct
import subprocess
import sys
import time
import tracemalloc
import warnings
import zlib
from pathlib import Path
from typing import Any

import cramjam
import pytest
import zstandard
from aiokafka.record.memory_records import MemoryRecords as AiokafkaRecords
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import capella
from capella.core.cluster import Cluster
from capella.core.limits import FUTURE_SKEW
from capella.core.log.batch import Batch
from capella.core.message import Draft, LogMessage, SaveMode
from capella.errors import (
    CapellaError,
    CorruptRecords,
    RecordsTooLarge,
    TransactionsNotSupported,
    UnsupportedCompression,
    UnsupportedRecordFormat,
)
from capella.kafka import records
from capella.kafka.records import (
    HEADERS_B64,
    KEY,
    KEY_B64,
    NULL,
    TIME,
    KafkaBatch,
    decode_headers_b64,
    decode_records,
    read_batches,
    render,
    to_capella,
)
from capella.kernels import KERNELS
from capella.records.record_batch import decode_given, encode, read, stamp

# kafka-python 3.0.12 loads its protocol schemas with importlib.resources.read_text, deprecated.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.record._crc32c import crc as kafka_crc
    from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
    from kafka.record.legacy_records import LegacyRecordBatchBuilder
    from kafka.record.memory_records import MemoryRecords

MAX = 1 << 20
NOW = 1_700_000_000.0
NOW_MS = int(NOW * 1000)
# key, value, headers, CreateTime (ms)
Record = tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]


def built(recs: list[Record], *, codec: int = 0, producer: tuple[int, int, int] = (-1, -1, -1)) -> bytes:
    """What a client sends: kafka-python's own batch of ``recs``."""
    builder = DefaultRecordBatchBuilder(2, codec, False, *producer, batch_size=1 << 30)
    for i, (key, value, headers, ms) in enumerate(recs):
        assert builder.append(i, ms, key, value, headers) is not None
    return bytes(builder.build())


def reheaded(data: bytes, *, attributes: int | None = None, blob: bytes | None = None) -> bytes:
    """``data``'s batch with other attributes or records bytes, its length and CRC made again
    (the CRC by kafka-python's CRC-32C)."""
    head = bytearray(data[:61])
    blob = data[61:] if blob is None else blob
    struct.pack_into(">i", head, 8, 49 + len(blob))
    if attributes is not None:
        struct.pack_into(">h", head, 21, attributes)
    struct.pack_into(">I", head, 17, kafka_crc(bytes(head[21:]) + blob))
    return bytes(head) + blob


def xerial(raw: bytes, block: int = 32 * 1024) -> bytes:
    """Snappy as the Java client frames it (kafka-python's ``snappy_encode``, xerial-compatible)."""
    parts = [b"\x82SNAPPY\x00", struct.pack(">ii", 1, 1)]
    for start in range(0, len(raw), block):
        chunk = bytes(cramjam.snappy.compress_raw(raw[start : start + block]))
        parts += (struct.pack(">i", len(chunk)), chunk)
    return b"".join(parts)


def compressed(data: bytes, codec: str) -> bytes:
    """``data`` (an uncompressed batch) as a client sends it compressed with ``codec``."""
    blob = data[61:]
    if codec == "snappy-raw":
        return reheaded(data, attributes=2, blob=bytes(cramjam.snappy.compress_raw(blob)))
    if codec == "snappy-xerial":
        return reheaded(data, attributes=2, blob=xerial(blob, block=64))
    if codec == "lz4":
        return reheaded(data, attributes=3, blob=bytes(cramjam.lz4.compress(blob)))
    raise AssertionError(codec)


def kafka_python_records(data: bytes) -> list[tuple[int, int, bytes | None, bytes | None, list[Any]]]:
    """What kafka-python reads in ``data``: (offset, timestamp, key, value, headers), CRCs
    checked; aiokafka's own parser (Cython, its own CRC-32C) must read the same."""
    found = []
    batches = MemoryRecords(data)
    while (batch := batches.next_batch()) is not None:
        assert isinstance(batch, DefaultRecordBatch) and batch.validate_crc()
        found += [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in batch]
    also = []
    batches = AiokafkaRecords(data)
    while (batch := batches.next_batch()) is not None:
        assert batch.validate_crc()
        also += [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in batch]
    assert also == found
    return found


def one(data: bytes) -> tuple[KafkaBatch, list[records.KafkaRecord]]:
    (batch,) = read_batches(data, max_size=MAX)
    return batch, decode_records(batch, max_size=MAX)


def fetched(recs: list[Record], *, base_id: int = 1, source: str | None = None, **kwargs: Any) -> Any:
    """``recs`` produced, stored as a record batch from ``base_id``, fetched: what kafka-python
    reads, and the stored messages' (source, external id)."""
    batch, decoded = one(built(recs, **kwargs))
    converted = to_capella(batch, decoded, now=NOW, source=source)
    stored = read(stamp(read(converted.record_batch), base_id, NOW + 1, "own"))
    fields = stored.fields()
    identities = list(zip(fields.sources, fields.external_ids, strict=True))
    return kafka_python_records(b"".join(r.data for r in render(Batch.of_records([stored])))), identities


PLAIN: list[Record] = [
    (b"k1", b"v1", [("a", b"1"), ("b", b"2")], NOW_MS),
    (None, b"v2", [], NOW_MS + 5),
    (b"\xff\x00", None, [("dup", b"x"), ("dup", None)], NOW_MS - 7),
    (b"", b"", [("kafka.own", b"y"), ("bin", b"\xfe")], NOW_MS + 1),
]


# --- reading what clients send -----------------------------------------------------------


@pytest.mark.parametrize("codec", [0, 1, 4], ids=["none", "gzip", "zstd"])
def test_every_codec_kafka_python_builds_reads_as_kafka_python_reads_it(codec: int) -> None:
    # Values that compress, or kafka-python sends the batch uncompressed.
    recs = [(b"k%d" % i, b"value " * 20 + b"%d" % i, [("h", b"%d" % i)], NOW_MS + i) for i in range(50)]
    data = built(recs, codec=codec)
    batch, decoded = one(data)
    assert batch.codec == codec and batch.records_count == 50
    expected = kafka_python_records(data)
    got = [
        (
            batch.base_offset + r.offset_delta,
            batch.base_timestamp + r.timestamp_delta,
            r.key,
            r.value,
            r.headers,
        )
        for r in decoded
    ]
    assert got == expected


@pytest.mark.parametrize("codec", ["snappy-raw", "snappy-xerial", "lz4"])
def test_lz4_and_both_snappy_framings_read_as_the_uncompressed_batch(codec: str) -> None:
    plain = built([(b"k", b"lz4 and snappy " * 30, [("h", None)], NOW_MS + i) for i in range(20)])
    data = compressed(plain, codec)
    batch, decoded = one(data)
    assert batch.codec == (3 if codec == "lz4" else 2)
    assert decoded == one(plain)[1]


def test_gzip_members_and_zstd_frames_one_after_another_read_as_one_stream() -> None:
    plain = built(PLAIN)
    blob = plain[61:]
    half = len(blob) // 2
    members = zlib.compress(blob[:half], wbits=31) + zlib.compress(blob[half:], wbits=31)
    frames = zstandard.ZstdCompressor().compress(blob[:half]) + zstandard.ZstdCompressor().compress(
        blob[half:]
    )
    for codec, packed in ((1, members), (4, frames)):
        assert one(reheaded(plain, attributes=codec, blob=packed))[1] == one(plain)[1]
    with pytest.raises(CorruptRecords):
        one(reheaded(plain, attributes=1, blob=members[:-3]))
    with pytest.raises(CorruptRecords):
        one(reheaded(plain, attributes=4, blob=frames[:-3]))


def test_several_batches_in_one_records_field_are_each_read() -> None:
    data = built(PLAIN) + built(PLAIN[:1], codec=1)
    assert [b.records_count for b in read_batches(data, max_size=MAX)] == [4, 1]


def test_a_bad_crc_a_cut_and_a_wrong_length_are_corrupt() -> None:
    data = built(PLAIN)
    flipped = bytearray(data)
    flipped[-1] ^= 1
    for bad in (bytes(flipped), data[:-1], data[:60], data[:10], b"", data + data[:20]):
        with pytest.raises(CorruptRecords):
            read_batches(bad, max_size=MAX)
    # A record list that does not fill its batch, or runs past it: the CRC is right, the records are not.
    for bad in (reheaded(data, blob=data[61:-1]), reheaded(data, blob=data[61:] + b"\x00")):
        (batch,) = read_batches(bad, max_size=MAX)
        with pytest.raises(CorruptRecords):
            decode_records(batch, max_size=MAX)


@pytest.mark.parametrize("magic", [0, 1])
def test_the_older_message_formats_are_refused_as_unsupported(magic: int) -> None:
    builder = LegacyRecordBatchBuilder(magic, 0, 1 << 20)
    builder.append(0, NOW_MS if magic else None, b"k", b"v")
    with pytest.raises(UnsupportedRecordFormat):
        read_batches(bytes(builder.build()), max_size=MAX)


def test_transactional_and_control_batches_are_refused() -> None:
    builder = DefaultRecordBatchBuilder(2, 0, True, 7, 0, 0, batch_size=1 << 20)
    builder.append(0, NOW_MS, None, b"v", [])
    with pytest.raises(TransactionsNotSupported):
        read_batches(bytes(builder.build()), max_size=MAX)
    with pytest.raises(TransactionsNotSupported):
        read_batches(reheaded(built(PLAIN), attributes=0x20), max_size=MAX)


@pytest.mark.parametrize("codec", [5, 6, 7])
def test_a_codec_kafka_does_not_define_is_unsupported_compression(codec: int) -> None:
    (batch,) = read_batches(reheaded(built(PLAIN), attributes=codec), max_size=MAX)
    with pytest.raises(UnsupportedCompression):
        decode_records(batch, max_size=MAX)


def test_without_cramjam_lz4_and_snappy_are_unsupported_compression_and_gzip_still_reads() -> None:
    plain = built(PLAIN)
    cases = {
        "lz4": compressed(plain, "lz4"),
        "snappy": compressed(plain, "snappy-raw"),
        "gzip": built([(b"k", b"gzip " * 50, [], NOW_MS)], codec=1),
    }
    program = (
        "import sys\n"
        "sys.modules['cramjam'] = None  # import cramjam now raises ImportError\n"
        "from capella.kafka.records import read_batches, decode_records\n"
        "for name, data in sorted(eval(sys.stdin.read()).items()):\n"
        "    (batch,) = read_batches(data, max_size=1 << 20)\n"
        "    try:\n"
        "        print(name, len(decode_records(batch, max_size=1 << 20)))\n"
        "    except Exception as exc:\n"
        "        print(name, type(exc).__name__)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(capella.__file__).parent.parent)}
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", program],
        input=repr(cases),
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    assert done.stdout.split("\n") == [
        "gzip 1",
        "lz4 UnsupportedCompression",
        "snappy UnsupportedCompression",
        "",
    ]


@settings(max_examples=300, deadline=None)
@given(
    garbage=st.binary(max_size=200),
    attributes=st.integers(0, 7),
    count=st.integers(-2, 40),
)
def test_garbage_is_refused_with_a_records_error_and_nothing_else(
    garbage: bytes, attributes: int, count: int
) -> None:
    """Random bytes, and random records behind a head whose CRC is right (so decoding runs)."""
    with pytest.raises(CapellaError):
        read_batches(garbage, max_size=MAX)
    head = bytearray(built(PLAIN[:1]))
    struct.pack_into(">i", head, 57, count)
    data = reheaded(bytes(head), attributes=attributes, blob=garbage)
    try:
        for batch in read_batches(data, max_size=MAX):
            decode_records(batch, max_size=MAX)
    except (CorruptRecords, UnsupportedCompression, RecordsTooLarge):
        pass


# --- bombs: decompression is bounded ------------------------------------------------------

GIB = 1 << 30


def gzip_bomb() -> bytes:
    """One gzip member of 1 GiB of zeros, made without holding it: after a full flush every
    MiB of zeros deflates to the same bytes, so the middle is one piece repeated."""
    mib = bytes(1 << 20)
    deflate = zlib.compressobj(9, zlib.DEFLATED, 31)
    first = deflate.compress(mib) + deflate.flush(zlib.Z_FULL_FLUSH)
    middle = deflate.compress(mib) + deflate.flush(zlib.Z_FULL_FLUSH)
    assert middle == deflate.compress(mib) + deflate.flush(zlib.Z_FULL_FLUSH)
    crc = 0
    for _ in range(GIB >> 20):
        crc = zlib.crc32(mib, crc)
    # The final block, then the trailer: the CRC-32 and size of the whole.
    tail = deflate.flush(zlib.Z_FINISH)[:-8] + struct.pack("<II", crc, GIB & 0xFFFFFFFF)
    return first + middle * ((GIB >> 20) - 1) + tail


def zstd_bomb() -> bytes:
    mib = bytes(1 << 20)
    compressor = zstandard.ZstdCompressor().compressobj()
    return b"".join([compressor.compress(mib) for _ in range(GIB >> 20)] + [compressor.flush()])


def lz4_bomb() -> bytes:
    """An LZ4 frame of 1 GiB of zeros: cramjam's frame of two independent 64 KiB blocks,
    with the second block repeated."""
    lz4 = cramjam.lz4.Compressor(content_checksum=False, block_linked=False)
    lz4.compress(bytes(128 * 1024))
    frame = bytes(lz4.finish())
    head, pos = frame[:7], 7
    blocks = []
    block_checksum = frame[4] & 0x10
    while True:
        (size,) = struct.unpack_from("<I", frame, pos)
        if size == 0:
            break
        end = pos + 4 + (size & 0x7FFFFFFF) + (4 if block_checksum else 0)
        blocks.append(frame[pos:end])
        pos = end
    assert len(blocks) == 2 and blocks[0] == blocks[1]
    return head + blocks[0] * (GIB >> 16) + frame[pos:]


@pytest.fixture(scope="module", params=["gzip", "zstd", "lz4"])
def bomb(request: pytest.FixtureRequest) -> tuple[int, bytes]:
    make = {"gzip": (1, gzip_bomb), "zstd": (4, zstd_bomb), "lz4": (3, lz4_bomb)}[request.param]
    return make[0], make[1]()


def test_a_gib_of_compressed_zeros_is_refused_fast_and_without_being_inflated(
    bomb: tuple[int, bytes],
) -> None:
    codec, blob = bomb
    head = built([(None, b"x", [], NOW_MS)])
    data = reheaded(head, attributes=codec, blob=blob)
    (batch,) = read_batches(data, max_size=len(data))
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(RecordsTooLarge):
            decode_records(batch, max_size=MAX)
        elapsed = time.perf_counter() - started
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # Inflating it all would take a GiB and seconds; the bound stops it at 1 MiB.
    assert peak < 16 * MAX, peak
    assert elapsed < 2.0, elapsed


def test_snappy_says_its_size_before_it_inflates() -> None:
    claim = bytearray()
    size = GIB
    while size >= 0x80:
        claim.append(size & 0x7F | 0x80)
        size >>= 7
    claim.append(size)
    data = reheaded(built(PLAIN[:1]), attributes=2, blob=bytes(claim) + b"\x00" * 8)
    (batch,) = read_batches(data, max_size=MAX)
    with pytest.raises(RecordsTooLarge):
        decode_records(batch, max_size=MAX)
    # Xerial blocks each within the bound, more than it together.
    data = reheaded(built(PLAIN[:1]), attributes=2, blob=xerial(bytes(2 * MAX)))
    (batch,) = read_batches(data, max_size=MAX)
    with pytest.raises(RecordsTooLarge):
        decode_records(batch, max_size=MAX)


def test_records_over_the_limit_uncompressed_are_too_large() -> None:
    with pytest.raises(RecordsTooLarge):
        read_batches(built(PLAIN), max_size=100)


# --- Kafka to Capella ---------------------------------------------------------------------


def capella_messages(
    recs: list[Record], *, now: float = NOW, source: str | None = None, **kwargs: Any
) -> Any:
    batch, decoded = one(built(recs, **kwargs))
    converted = to_capella(batch, decoded, now=now, source=source)
    return converted, decode_given(read(converted.record_batch))


def test_keys_values_and_headers_map_onto_payloads_and_reserved_headers() -> None:
    converted, (fields, ids, times) = capella_messages(PLAIN)
    assert converted.clamped == 0
    assert fields.payloads == [b"v1", b"v2", b"", b""]
    plain, no_key, binary, reserved = fields.headers
    assert plain == {KEY: "k1", "a": "1", "b": "2"}
    assert no_key == {}
    assert binary[KEY_B64] == base64.b64encode(b"\xff\x00").decode() and binary[NULL] == "1"
    assert decode_headers_b64(binary[HEADERS_B64]) == [("dup", b"x"), ("dup", None)]
    assert reserved[KEY] == "" and NULL not in reserved
    assert decode_headers_b64(reserved[HEADERS_B64]) == [("kafka.own", b"y"), ("bin", b"\xfe")]
    assert times == [NOW, NOW + 0.005, NOW - 0.007, NOW + 0.001]
    assert ids is None and set(fields.sources) == {""}


def test_a_create_time_past_the_skew_is_clamped_and_kept() -> None:
    ahead = NOW_MS + int(FUTURE_SKEW * 1000) + 1
    converted, (fields, _, times) = capella_messages([(None, b"a", [], ahead), (None, b"b", [], NOW_MS)])
    assert converted.clamped == 1
    assert times == [NOW + FUTURE_SKEW, NOW]
    assert fields.headers == [{TIME: str(ahead)}, {}]


def test_a_create_time_a_float_of_seconds_cannot_hold_is_kept_as_well() -> None:
    far = -(2**53) - 1  # 285,000 years before 1970, where floats of seconds are 2 ms apart
    _, (fields, _, times) = capella_messages([(None, b"a", [], far), (None, b"b", [], NOW_MS)])
    assert fields.headers == [{TIME: str(far)}, {}]
    assert times == [far / 1000, NOW]


def test_a_length_below_minus_one_is_corrupt() -> None:
    # One record: length 8, attributes, deltas 0, a key of length -2 (zigzag 3), value -1, no headers.
    data = reheaded(built([(None, b"v", [], NOW_MS)]), blob=bytes([16, 0, 0, 0, 3, 1, 0, 0, 0]))
    (batch,) = read_batches(data, max_size=MAX)
    with pytest.raises(CorruptRecords):
        decode_records(batch, max_size=MAX)


def test_a_log_append_time_batch_leaves_external_times_to_the_default() -> None:
    batch, decoded = one(reheaded(built(PLAIN), attributes=0x08))
    converted = to_capella(batch, decoded, now=NOW, source=None)
    assert decode_given(read(converted.record_batch))[2] is None


def test_an_idempotent_batch_has_the_producers_source_and_epoch_and_sequence_as_external_ids() -> None:
    recs = [(None, b"%d" % i, [], NOW_MS) for i in range(3)]
    _, (fields, ids, _) = capella_messages(recs, source="own/kafka/7", producer=(7, 3, 10))
    assert fields.sources == ["own/kafka/7"] * 3
    assert ids == [(3 << 32) | 10, (3 << 32) | 11, (3 << 32) | 12]
    # Sequences wrap at int32's largest, as Kafka's do.
    _, (_, ids, _) = capella_messages(recs, source="s", producer=(7, 0, 2**31 - 2))
    assert ids == [2**31 - 2, 2**31 - 1, 0]
    # A producer id without a sequence would make every message the same identity.
    with pytest.raises(CorruptRecords):
        capella_messages(recs, source="s", producer=(7, 0, -1))


# --- round trips: Kafka to Capella to stored to Kafka --------------------------------------

NAMES = st.sampled_from(["", "h", "dup", "kafka.key", "kafka.x", "ü"]) | st.text(max_size=6)
BYTES = st.binary(max_size=12) | st.text(max_size=12).map(str.encode)
HEADERS = st.lists(st.tuples(NAMES, st.none() | BYTES), max_size=4)
# Around now (some past the skew), anywhere an int64 delta reaches, and where floats of seconds hold no ms.
TIMES = (
    st.integers(NOW_MS - 10**6, NOW_MS + 10**7)
    | st.integers(-(2**60), 2**60)
    | st.integers(-(2**55), -(2**45))
)
RECORDS = st.lists(st.tuples(st.none() | BYTES, st.none() | BYTES, HEADERS, TIMES), min_size=1, max_size=8)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    recs=RECORDS,
    base_id=st.integers(1, 2**40),
    codec=st.sampled_from([0, 1, 4]),
    producer=st.none()
    | st.tuples(st.integers(0, 2**40), st.integers(0, 2**15 - 1), st.integers(0, 2**31 - 1)),
)
def test_what_a_client_sends_comes_back_from_a_fetch_as_it_was_sent(
    recs: list[Record], base_id: int, codec: int, producer: tuple[int, int, int] | None
) -> None:
    source = None if producer is None else f"own/kafka/{producer[0]}"
    got, identities = fetched(
        recs, base_id=base_id, codec=codec, source=source, producer=producer or (-1, -1, -1)
    )
    assert got == [(base_id + i, ms, k, v, h) for i, (k, v, h, ms) in enumerate(recs)]
    if producer is None:
        assert identities == [("own", base_id + i) for i in range(len(recs))]
    else:
        _, epoch, sequence = producer
        assert identities == [(source, epoch << 32 | (sequence + i) % 2**31) for i in range(len(recs))]


async def test_through_a_queue_kafka_and_http_messages_fetch_with_their_ids_as_offsets(
    cluster: Cluster,
) -> None:
    q, _ = await cluster.put_queue("t", {"block": {"max_messages": 5}})
    now = q.now()
    ahead = int((now + 3600) * 1000)
    sent: list[list[Record]] = [
        PLAIN,
        [(b"idem", b"%d" % i, [("n", b"%d" % i)], int(now * 1000)) for i in range(3)],
        [(None, b"late clock", [], ahead)],
    ]
    expected = []
    for n, recs in enumerate(sent):
        batch, decoded = one(built(recs, codec=1, producer=(9, 1, 0) if n == 1 else (-1, -1, -1)))
        converted = to_capella(batch, decoded, now=now, source=f"{q.own}/kafka/9" if n == 1 else None)
        answers = await q.append_batch(read(converted.record_batch), SaveMode.WAIT)
        expected += [(a.id, ms, k, v, h) for a, (k, v, h, ms) in zip(answers, recs, strict=True)]
        if n == 1:
            # The producer's retry is a duplicate, answered with the ids it has.
            again = await q.append_batch(read(converted.record_batch), SaveMode.WAIT)
            assert [(a.id, a.duplicate) for a in again] == [(a.id, True) for a in answers]
    (appended,) = await q.append([Draft(b"over http", headers={"h": "v"}, external_time=now - 1.5)])
    page = await q.read_page(0, 100, render=render)
    assert len(page.parts) > 1  # sealed blocks and the open one
    fetched_ = []
    for batch, start, stop in page.parts:
        wanted = set(batch.ids[start:stop])
        data = b"".join(r.data for r in render(batch))
        assert batch.holds(render)
        fetched_ += [m for m in kafka_python_records(data) if m[0] in wanted]
    http = (appended.id, round((now - 1.5) * 1000), None, b"over http", [("h", b"v")])
    assert fetched_ == [*expected, http]


# --- rendering what was stored --------------------------------------------------------------


def message(id_: int, payload: bytes = b"x", headers: dict[str, str] | None = None, **kw: Any) -> LogMessage:
    fields: dict[str, Any] = {"time": 100.0, "source": "own", "external_id": id_, "external_time": 100.0}
    fields.update(kw)
    return LogMessage(id=id_, segment=0, payload=payload, headers=headers or {}, **fields)


def test_messages_made_otherwise_render_one_batch_per_run_of_ids_with_null_keys() -> None:
    batch = Batch.of_messages(
        [
            message(5, headers={"h": "v", NULL: "2"}),
            message(6, b"", headers={NULL: "1", KEY_B64: "not base64!"}, external_time=50.25),
            message(9, headers={TIME: "x"}, time=200.0, external_time=200.0),
        ]
    )
    rendered = render(batch)
    assert [(r.first_id, r.last_id) for r in rendered] == [(5, 6), (9, 9)]
    assert kafka_python_records(b"".join(r.data for r in rendered)) == [
        (5, 100000, None, b"x", [("h", b"v"), (NULL, b"2")]),
        (6, 50250, None, None, [(KEY_B64, b"not base64!")]),
        (9, 200000, None, b"x", [(TIME, b"x")]),
    ]


def test_a_rendering_is_made_once_and_dropped_with_the_other_forms() -> None:
    batch = Batch.of_messages([message(1), message(2)])
    assert not batch.holds(render)
    first = render(batch)
    assert batch.holds(render) and batch.rendered and render(batch) is first
    batch.drop_forms()
    assert not batch.holds(render) and render(batch) is not first


def test_batch_form_keeps_each_makers_answer_under_its_key() -> None:
    batch = Batch.of_messages([message(1)])
    calls: list[int] = []

    def make(b: Batch) -> int:
        calls.append(len(b))
        return len(calls)

    def key(b: Batch) -> object:
        raise AssertionError("a key is never called")

    assert batch.form(make) == 1 and batch.form(make) == 1 and batch.holds(make)
    assert batch.form(make, key=key) == 2 and batch.holds(key)
    batch.drop_forms()
    assert not batch.holds(make) and batch.form(make) == 3 and calls == [1, 1, 1]


# --- the render's kernel (capella/_kernels.c: kafka_records) against its Python -------------

needs_kernels = pytest.mark.skipif(KERNELS is None, reason="the C kernels are not built or are turned off")
COLUMN_TIMES = st.floats(
    allow_nan=False, allow_infinity=False, min_value=-1e12, max_value=1e12
) | st.sampled_from([0.0, 0.0005, 0.0015, 2.5e-3, -0.0005, 1e16, -1e16, 4.7e15, -4.7e15, 1e300, -1e300])
RESERVED = st.sampled_from([KEY, KEY_B64, NULL, TIME, HEADERS_B64, "kafka.other", "h", "dup"])
COLUMN_HEADERS = st.dictionaries(
    RESERVED | st.text(max_size=6),
    st.sampled_from(["", "1", "2", "x", "a2V5", "!!", "-5", "99999999999999999999"]) | st.text(max_size=8),
    max_size=4,
)


def assert_as_python_makes(
    made: tuple[bytes, int, int] | None,
    ids: list[int],
    times: list[float],
    payloads: list[bytes],
    headers: list[dict[str, str]],
) -> None:
    """A kernel's records are the Python render's; it leaves them to Python (None) only where a
    time delta does not fit Kafka's varlong (an int64)."""
    if made is None:
        ms = [
            records._parts(h, p, t)[2] if h else t
            for h, p, t in zip(headers, payloads, records._create_times(times), strict=True)
        ]
        assert any(not -(2**63) <= t - ms[0] < 2**63 for t in ms)
    else:
        assert made == records._records_of(ids, times, payloads, headers, 0, len(ids))


@needs_kernels
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    columns=st.lists(
        st.tuples(st.integers(0, 2**20), COLUMN_TIMES, st.binary(max_size=300), COLUMN_HEADERS),
        min_size=1,
        max_size=40,
    ),
    first=st.integers(1, 2**62),
    data=st.data(),
)
def test_the_render_kernel_makes_the_records_python_makes(
    columns: list[tuple[int, float, bytes, dict[str, str]]], first: int, data: st.DataObject
) -> None:
    ids, id_ = [], first
    for gap, *_ in columns:
        ids.append(id_)
        id_ += 1 + gap % 3 * gap  # mostly consecutive, sometimes gaps
    times = [t for _, t, _, _ in columns]
    payloads = [p for _, _, p, _ in columns]
    headers = [h for _, _, _, h in columns]
    start = data.draw(st.integers(0, len(ids) - 1))
    stop = data.draw(st.integers(start + 1, len(ids)))
    assert KERNELS is not None
    made = KERNELS.kafka_records(ids, times, payloads, headers, start, stop, records._parts)
    assert_as_python_makes(
        made, ids[start:stop], times[start:stop], payloads[start:stop], headers[start:stop]
    )


@needs_kernels
def test_the_render_kernel_leaves_columns_it_does_not_read_to_python() -> None:
    assert KERNELS is not None
    ok = ([1, 2], [1.0, 2.0], [b"a", b"b"], [{}, {}])
    assert KERNELS.kafka_records(*ok, 0, 2, records._parts) is not None
    for column, odd in [(0, [1, 2**64]), (1, [1.0, 2]), (2, [b"a", bytearray(b"b")]), (3, [{}, None])]:
        args = list(ok)
        args[column] = odd
        assert KERNELS.kafka_records(*args, 0, 2, records._parts) is None
    for start, stop in [(-1, 1), (1, 1), (0, 3)]:
        with pytest.raises(ValueError, match="outside the columns"):
            KERNELS.kafka_records(*ok, start, stop, records._parts)
    with pytest.raises(TypeError, match="must give"):
        KERNELS.kafka_records([1], [1.0], [b"a"], [{"h": "v"}], 0, 1, lambda h, p, ms: (b"", b"", ms))
    with pytest.raises(ZeroDivisionError):
        KERNELS.kafka_records([1], [1.0], [b"a"], [{"h": "v"}], 0, 1, lambda h, p, ms: 1 / 0)


def test_a_render_of_messages_with_and_without_headers_reads_back_as_kafka_python_reads_it() -> None:
    # Both test passes run this: with the kernel and with CAPELLA_NO_EXTENSIONS=1.
    batch = Batch.of_messages(
        [
            message(i, b"v%d" % i, {KEY: f"k{i}"} if i % 3 == 0 else None, external_time=100 + i / 1e3)
            for i in range(1, 301)
        ]
    )
    got = kafka_python_records(b"".join(r.data for r in render(batch)))
    assert got == [(i, 100000 + i, b"k%d" % i if i % 3 == 0 else None, b"v%d" % i, []) for i in range(1, 301)]


def test_a_reserved_header_that_is_not_ascii_stays_an_ordinary_header() -> None:
    # base64 refuses a text that is not ASCII with a ValueError that is not binascii.Error: a
    # message produced over HTTP with such a kafka.key.b64 once made every fetch of it fail.
    batch = Batch.of_messages([message(1, headers={KEY_B64: "clé", HEADERS_B64: "é"})])
    assert kafka_python_records(b"".join(r.data for r in render(batch))) == [
        (1, 100000, None, b"x", [(KEY_B64, "clé".encode()), (HEADERS_B64, "é".encode())])
    ]


@needs_kernels
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    columns=st.lists(
        st.tuples(
            st.binary(max_size=300),
            st.none() | COLUMN_HEADERS,
            st.none() | COLUMN_TIMES,
            st.none() | st.sampled_from(["a", "b/kafka/1"]),
            st.none() | st.integers(0, 2**63 - 1),
        ),
        min_size=1,
        max_size=40,
    ),
    base_id=st.integers(1, 2**62),
    base_time=COLUMN_TIMES,
)
def test_the_stored_batch_kernel_makes_the_records_python_makes_from_its_fields(
    columns: list[tuple[bytes, dict[str, str] | None, float | None, str | None, int | None]],
    base_id: int,
    base_time: float,
) -> None:
    payloads, headers, times, sources, external_ids = (list(c) for c in zip(*columns, strict=True))
    stored = read(
        stamp(
            read(
                encode(
                    payloads,
                    headers=[h or {} for h in headers] if any(headers) else None,
                    external_times=times,
                    sources=sources,
                    external_ids=external_ids,
                )
            ),
            base_id,
            base_time,
            "own",
        )
    )
    assert KERNELS is not None
    made = KERNELS.kafka_batch_records(
        records._parts,
        stored.data,
        stored.body,
        stored.end,
        stored.flags,
        stored.count,
        stored.base_id,
        stored.base_time,
    )
    f = stored.fields()
    assert_as_python_makes(made, f.ids, f.external_times, f.payloads, f.headers)


@needs_kernels
def test_the_stored_batch_kernel_leaves_a_body_that_does_not_parse_to_python() -> None:
    assert KERNELS is not None
    stored = read(stamp(read(encode([b"a", b"b"], headers=[{"h": "v"}, {}])), 1, 100.0, "own"))
    args = (
        stored.data,
        stored.body,
        stored.end,
        stored.flags,
        stored.count,
        stored.base_id,
        stored.base_time,
    )
    assert KERNELS.kafka_batch_records(records._parts, *args) is not None
    cut = (stored.data, stored.body, stored.end - 1, *args[3:])
    assert KERNELS.kafka_batch_records(records._parts, *cut) is None
    outside = (stored.data, stored.body, len(stored.data) + 1, *args[3:])
    assert KERNELS.kafka_batch_records(records._parts, *outside) is None
    with pytest.raises(ZeroDivisionError):
        KERNELS.kafka_batch_records(lambda h, p, ms: 1 / 0, *args)
