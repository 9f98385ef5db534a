"""CRC-32C: the C kernel and the pure-Python fallback against kafka-python's own (``kafka.record._crc32c``).

``make test`` runs this module twice, as ``test_kernels.py``: with the kernels built, where
both paths are checked, and with ``CAPELLA_NO_EXTENSIONS=1``, where ``capella.kernels.crc32c``
must be the pure-Python one.
"""

from __future__ import annotations

import os
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capella import crc32c as pure
from capella.kernels import KERNELS, Crc32, crc32c

# kafka-python 3.0.12 loads its protocol schemas with importlib.resources.read_text, deprecated.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.record._crc32c import crc as kafka_crc
    from kafka.record._crc32c import crc_update as kafka_crc_update

SWITCHED_OFF = os.environ.get("CAPELLA_NO_EXTENSIONS", "") not in ("", "0")

# Every path this process has: the kernel where it is built, and always the fallback.
PATHS: dict[str, Crc32] = {"python": pure.crc32c}
if KERNELS is not None:
    PATHS["kernel"] = KERNELS.crc32c
    # The kernel's tables, which a CPU without SSE4.2 (any ARM) runs instead.
    PATHS["kernel tables"] = KERNELS.crc32c_tables


@pytest.fixture(params=sorted(PATHS))
def crc(request: pytest.FixtureRequest) -> Crc32:
    return PATHS[request.param]


def test_the_module_takes_the_kernel_when_built_and_python_when_not() -> None:
    if SWITCHED_OFF or KERNELS is None:
        assert crc32c is pure.crc32c
    else:
        assert crc32c is KERNELS.crc32c
        assert isinstance(KERNELS.FAST_CRC32C, bool)


def test_the_check_value(crc: Crc32) -> None:
    """The CRC-32C catalogue's check value, and the empty input (0, or the running value)."""
    assert crc(b"123456789") == 0xE3069283
    assert crc(b"") == 0 and crc(b"", 0xDEADBEEF) == 0xDEADBEEF


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=600), start=st.integers(0, 16), cut=st.integers(0, 600))
def test_every_path_is_kafka_pythons_for_any_length_start_and_cut(data: bytes, start: int, cut: int) -> None:
    """Lengths across the eight-byte steps, views that start off any alignment, and a running
    value (a crc continued over a second piece) all give kafka-python's answer."""
    view = memoryview(data)[min(start, len(data)) :]
    expected = kafka_crc(view)
    head, tail = view[: min(cut, len(view))], view[min(cut, len(view)) :]
    for crc in PATHS.values():
        assert crc(view) == expected
        assert crc(tail, crc(head)) == expected
        assert crc(tail, kafka_crc_update(0, head)) == expected


STRETCHES = [767, 768, 769, 3 * 256 + 9, 3 * 8192 - 1, 3 * 8192, 3 * 8192 + 777, 100_003]


@pytest.mark.parametrize("size", STRETCHES)
def test_lengths_around_the_kernels_three_stream_stretches(crc: Crc32, size: int) -> None:
    """The kernel runs three streams over 3 x 8 KiB, then 3 x 256 bytes, then one: every
    length around those, at every alignment, gives kafka-python's answer."""
    data = os.urandom(size + 7)
    for start in range(8):
        view = memoryview(data)[start : start + size]
        assert crc(view) == kafka_crc(view)
        assert crc(view[5:], crc(view[:5])) == kafka_crc(view)


def test_a_large_buffer_and_what_is_refused(crc: Crc32) -> None:
    """Past 5 KiB the kernel lets go of the GIL; a bytearray is a buffer too; a str is not."""
    data = bytes(range(256)) * 40 + b"tail"
    assert crc(data) == kafka_crc(data)
    assert crc(bytearray(data[3:]), 0xFFFFFFFF) == kafka_crc_update(0xFFFFFFFF, data[3:])
    with pytest.raises(TypeError):
        crc("text")  # type: ignore[arg-type]
