"""An aiohttp connector that connects only to addresses the egress policy allows.

aiohttp finds addresses two ways, so the policy sits at two hooks. A name goes through the
resolver, which drops refused addresses: a name with a public and a private address connects
only to the public one, and a name with nothing allowed fails with ``EgressRefused`` naming
what it resolved to. An IP literal never reaches a resolver, so the socket factory, which
aiohttp calls with each address right before connecting to it, checks again: the address
checked is the address connected to, whatever a name resolved to before (DNS rebinding), in
whatever form the URL wrote it (``[::ffff:127.0.0.1]``).
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import socket
from typing import Any

import aiohttp
from aiohappyeyeballs import AddrInfoType
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.tracing import Trace
from yarl import URL

from capella.egress import Egress
from capella.errors import EgressRefused


class EgressConnector(aiohttp.TCPConnector):
    """A ``TCPConnector`` whose connections pass ``egress``; a refusal raises ``EgressRefused``."""

    def __init__(self, egress: Egress, resolver: AbstractResolver | None = None, **options: Any) -> None:
        self._egress = egress
        super().__init__(
            resolver=_Resolver(egress, resolver or aiohttp.ThreadedResolver()),
            socket_factory=self._socket,
            **options,
        )

    async def connect(
        self,
        req: aiohttp.ClientRequest,
        traces: list[Trace],
        timeout: aiohttp.ClientTimeout,  # noqa: ASYNC109 (aiohttp's signature, overridden)
    ) -> aiohttp.connector.Connection:
        try:
            return await super().connect(req, traces, timeout)
        except aiohttp.ClientConnectorError as exc:
            # aiohttp wraps what the socket factory raised; give the caller the refusal itself.
            if isinstance(exc.os_error, _Refused):
                raise exc.os_error.refused from None
            raise

    def _socket(self, addr_info: AddrInfoType) -> socket.socket:
        family, type_, proto, _, address = addr_info
        host = str(address[0])
        if not self._egress.allows(host):
            raise _Refused(self._egress.refused(host, [host]))
        return socket.socket(family=family, type=type_, proto=proto)


class _Refused(OSError):
    """A refusal on its way through aiohttp's connect loop, which passes on only ``OSError``."""

    def __init__(self, refused: EgressRefused) -> None:
        super().__init__(errno.EACCES, refused.message)
        self.refused = refused


class _Resolver(AbstractResolver):
    """``inner``'s answers without the addresses the policy refuses."""

    def __init__(self, egress: Egress, inner: AbstractResolver) -> None:
        self._egress = egress
        self._inner = inner

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self._inner.resolve(host, port, family)
        allowed = [r for r in found if self._egress.allows(r["host"])]
        if found and not allowed:
            raise self._egress.refused(host, [r["host"] for r in found])
        return allowed

    async def close(self) -> None:
        await self._inner.close()


async def check_destination(egress: Egress, url: str) -> None:
    """``EgressRefused`` when nothing ``url``'s host resolves to now is allowed.

    A check ahead of the connect-time one, for a caller that must not start work it cannot
    finish; it settles nothing (the answer may change before the connect). A host that does not
    resolve passes: the request itself reports that.
    """
    if egress.everything:
        return
    parsed = URL(url)
    host = parsed.raw_host
    if host is None:
        return
    try:
        ipaddress.ip_address(host)
    except ValueError:
        resolver = _Resolver(egress, aiohttp.ThreadedResolver())
        with contextlib.suppress(OSError):
            await resolver.resolve(host, parsed.port or 0, socket.AF_UNSPEC)
    else:
        egress.check(host, host)
