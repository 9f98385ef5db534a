"""Where a consumer group's offsets live (capella/kafka/offsets.py): the name of its subscription."""

from __future__ import annotations

import hashlib

import pytest

from capella.core.definition import check_name
from capella.kafka.offsets import subscription_name


def hashed(group_id: str) -> str:
    return "kafka." + hashlib.sha256(group_id.encode()).hexdigest()[:16]


# "" makes "kafka.", a valid name; the listener refuses an empty group id before (INVALID_GROUP_ID).
@pytest.mark.parametrize("group_id", ["g", "billing", "orders.eu-west_2", "-starts-with-dash", "9" * 122, ""])
def test_a_group_id_that_fits_a_subscription_name_is_its_name(group_id: str) -> None:
    assert subscription_name(group_id) == f"kafka.{group_id}"


@pytest.mark.parametrize(
    "group_id",
    [
        "9" * 123,  # kafka. + 123 characters: 129, one over the limit
        "orders/eu",
        "with space",
        "ünïcode",
        "a:b",
        "tab\there",
        "🙂",
    ],
)
def test_any_other_group_id_is_the_first_16_hex_digits_of_its_sha256(group_id: str) -> None:
    name = subscription_name(group_id)
    assert name == hashed(group_id)
    assert len(name) == 22 and check_name(name, "subscription") == name


def test_every_name_is_a_valid_subscription_name_and_stable() -> None:
    for group_id in ["g", "x" * 500, "a/b", "ünï", "9" * 122, "9" * 123]:
        name = subscription_name(group_id)
        assert check_name(name, "subscription") == name
        assert subscription_name(group_id) == name
    # Different ids that do not fit get different names.
    assert len({subscription_name(f"group/{n}") for n in range(1000)}) == 1000


def test_a_name_that_fits_exactly_128_characters_is_kept() -> None:
    group_id = "g" * 122
    assert len(f"kafka.{group_id}") == 128
    assert subscription_name(group_id) == f"kafka.{group_id}"
