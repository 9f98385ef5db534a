"""The egress policy as a pure rule: which addresses are public, and what the allow-list adds."""

from __future__ import annotations

import pytest

from capella.egress import Egress
from capella.errors import EgressRefused

REFUSED = [
    "127.0.0.1",
    "127.0.0.2",
    "0.0.0.0",
    "10.1.2.3",
    "172.16.0.1",
    "192.168.1.1",
    "169.254.169.254",  # cloud metadata
    "100.64.0.1",  # CGNAT
    "100.127.255.254",
    "224.0.0.1",
    "255.255.255.255",
    "::1",
    "::",
    "fd00::1",
    "fd00:ec2::254",  # AWS metadata over IPv6
    "fc00::1",
    "fe80::1",
    "fe80::1%eth0",
    "fec0::1",  # site-local
    "ff02::1",
    "::ffff:127.0.0.1",  # IPv4-mapped
    "::ffff:169.254.169.254",
    "::ffff:10.0.0.1",
    "::127.0.0.1",  # IPv4-compatible
    "::ffff:0:7f00:1",  # SIIT
    "64:ff9b::7f00:1",  # NAT64
    "2002:7f00:1::1",  # 6to4
]
PUBLIC = ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "::ffff:8.8.8.8"]


@pytest.mark.parametrize("address", REFUSED)
def test_with_auth_on_only_public_addresses_are_allowed(address: str) -> None:
    assert not Egress.of([], auth_enabled=True).allows(address)


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses_are_allowed(address: str) -> None:
    assert Egress.of([], auth_enabled=True).allows(address)


@pytest.mark.parametrize("address", REFUSED)
def test_with_auth_off_everything_is_allowed(address: str) -> None:
    assert Egress.of([], auth_enabled=False).allows(address)


def test_the_allow_list_adds_networks_in_every_form_of_their_addresses() -> None:
    egress = Egress.of(["127.0.0.0/8", "fd00::/8", "10.1.0.0/16"], auth_enabled=True)

    assert egress.allows("127.0.0.2")
    assert egress.allows("::ffff:127.0.0.1")
    assert egress.allows("fd12::1")
    assert egress.allows("10.1.2.3")
    assert not egress.allows("10.2.0.1")
    assert not egress.allows("::1")
    assert not egress.allows("169.254.169.254")


def test_a_refusal_names_the_host_the_address_and_the_setting() -> None:
    with pytest.raises(EgressRefused) as info:
        Egress.of([], auth_enabled=True).check("169.254.169.254", "metadata.internal")

    assert info.value.code == "egress_refused"
    assert "metadata.internal (169.254.169.254)" in info.value.message
    assert "[egress] allow" in info.value.message
    assert info.value.details == {"address": "169.254.169.254"}
