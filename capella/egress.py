"""The egress policy: which addresses the broker may connect to on a definition's behalf.

Push receivers, PostgreSQL servers and external clusters are named by users; without a
policy a user could point them at the broker's own network position (loopback services,
cloud metadata at 169.254.169.254, private ranges). The policy is checked on the resolved
address at connect time, so a DNS name, a rebinding answer or an IPv4-mapped IPv6 form
cannot slip past a check made on the name.

With authentication on, only public addresses are allowed, plus the networks of
``[egress] allow``; with it off (loopback only, one local user) every address is (Svix blocks
private ranges at resolution with ``whitelist_subnets`` the same way).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from capella.errors import EgressRefused

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# Not public, whatever ipaddress.is_global says of a range: 100.64.0.0/10 (CGNAT) is
# "not private" but not global either; NAT64's 64:ff9b::/96 and 6to4's 2002::/16 embed IPv4
# addresses.
_NOT_PUBLIC = tuple(
    ipaddress.ip_network(n) for n in ("100.64.0.0/10", "64:ff9b::/96", "64:ff9b:1::/48", "2002::/16")
)
# Public IPv6 unicast is all inside 2000::/3. Outside it, some ranges that Python before 3.12.4
# calls global are not: IPv4-compatible ::a.b.c.d, SIIT's ::ffff:0:a.b.c.d, site-local fec0::/10.
_IPV6_UNICAST = ipaddress.IPv6Network("2000::/3")


@dataclass(frozen=True, slots=True)
class Egress:
    """``public``: public addresses are allowed; ``allow``: these networks too; ``everything``: no check."""

    allow: tuple[Network, ...] = ()
    everything: bool = False

    @classmethod
    def open(cls) -> Egress:
        return cls(everything=True)

    @classmethod
    def of(cls, allow: Iterable[str], auth_enabled: bool) -> Egress:
        return cls(tuple(ipaddress.ip_network(n, strict=False) for n in allow), everything=not auth_enabled)

    def allows(self, address: str) -> bool:
        if self.everything:
            return True
        ip = _unmapped(ipaddress.ip_address(address.split("%", 1)[0]))
        if any(ip in network for network in self.allow if network.version == ip.version):
            return True
        return public(ip)

    def check(self, address: str, host: str) -> None:
        """``EgressRefused`` naming the address and the setting unless ``address`` is allowed."""
        if not self.allows(address):
            raise self.refused(host, [address])

    def refused(self, host: str, addresses: Iterable[str]) -> EgressRefused:
        """The error for ``host`` when none of ``addresses`` (what it resolved to) is allowed."""
        shown = ", ".join(sorted(set(addresses)))
        where = shown if host == shown else f"{host} ({shown})"
        return EgressRefused(
            f"connecting to {where} is refused by the egress policy: only public addresses "
            "are allowed; list the network in [egress] allow to reach it",
            address=shown,
        )


def public(ip: Address) -> bool:
    """Whether ``ip`` is a public unicast address (not loopback, private, link-local, ...)."""
    ip = _unmapped(ip)
    if not ip.is_global or ip.is_multicast:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip not in _IPV6_UNICAST:
        return False
    return not any(ip in network for network in _NOT_PUBLIC if network.version == ip.version)


def _unmapped(ip: Address) -> Address:
    """``::ffff:127.0.0.1`` as ``127.0.0.1``: the address the packets really go to."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip
