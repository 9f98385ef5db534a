"""What a web page in someone's browser may not make the server do: the cross-site and Host checks.

Both run in one middleware, before the access check and before any body is read, so a refused
request has changed nothing and cost nothing.

- **Cross-site requests** (as Go 1.25's ``http.CrossOriginProtection``). A page on any site
  can make a browser send a ``POST`` with a ``text/plain`` or form body without a preflight,
  and the API would read it as JSON; an ``<img>`` sends a ``GET``. So a write that the
  browser marks as coming from another site is refused with ``403 cross_site_request``. A
  write is a ``POST``, ``PUT``, ``PATCH`` or ``DELETE``, or a request to a route whose row says
  it ``writes`` (``api/route.py``): a subscription read that commits its cursor, every relayed
  request, the original protocol's ``GET /cluster``. Marked cross-site means
  ``Sec-Fetch-Site: cross-site`` or ``same-site`` (``same-origin`` and ``none``, a typed
  address, pass), or, from browsers that send no ``Sec-Fetch-Site``, an ``Origin`` that is
  not the server's own. An origin listed in ``[server.cors] origins`` passes: its pages are
  trusted (``*`` trusts every page, as it lets every page call the API anyway). Requests
  without these headers are not from a browser page (curl, the SDKs, the CLI) and pass.
- **Foreign Host headers** (DNS rebinding). With authentication off, a page on a site whose
  name the attacker re-points at 127.0.0.1 is "same-origin" to the browser, so only its
  ``Host`` header gives it away. Then every request whose ``Host`` is neither a loopback name
  (``localhost``, ``127.0.0.0/8``, ``[::1]``, any port) nor in ``server.allowed_hosts`` is
  refused with ``403 host_not_allowed`` — but for ``/healthz`` and ``/readyz``, which hold no
  data and which probes may call by any name. With authentication on, credentials protect
  the API and the Host header is not checked.

Every answer also carries ``ANSWER_HEADERS`` (``on_prepare``): ``nosniff``, so a browser
renders nothing as other than its declared type, and a Content-Security-Policy that lets
nothing load or run and no page frame it, so an answer opened as a page is inert. The
console (``/ui``) sets its own policy, which is kept.
"""

from __future__ import annotations

import logging

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from capella.api.route import HEALTHZ_PATH, READYZ_PATH, Writes
from capella.config import ServerSettings, is_loopback
from capella.errors import CrossSiteRequest, HostNotAllowed

log = logging.getLogger(__name__)

STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# The routes that write whatever their method, by (method, path template): the ``writes`` of
# their rows (``True``, or whether this request does).
WRITES = web.AppKey("writes", dict[tuple[str, str], Writes])
# On every answer; a handler's own value (the console's policy) wins.
ANSWER_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": (
        "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    ),
}
# What Sec-Fetch-Site says of a request the page's own origin (or the user) started.
SAME_ORIGIN = frozenset({"same-origin", "none"})
# Served whatever the Host: liveness and readiness probes, which carry no data.
ANY_HOST = frozenset({HEALTHZ_PATH, READYZ_PATH})
# A Host or Origin is echoed in the refusal; this much of it is enough to recognise.
ECHOED = 200
# Host headers whose verdict is remembered (a client sends the same one on every request);
# bounded, since a stranger picks the header.
KNOWN_HOSTS = 64


class BrowserGuard:
    """The cross-site check, and (with authentication off) the Host check, of one app."""

    def __init__(self, settings: ServerSettings, *, check_host: bool) -> None:
        origins = settings.cors.origins
        self._any_origin = "*" in origins
        self._origins = frozenset(origins)
        self._hosts = frozenset(settings.allowed_hosts)
        self._check_host = check_host
        self._verdicts: dict[str, bool] = {}

    def host_allowed(self, host: str | None) -> bool:
        """Whether ``host`` (a Host header: name or address, perhaps a port) may be served."""
        if host is None:
            return True  # HTTP/1.0 without Host: not a browser, which always sends one
        verdict = self._verdicts.get(host)
        if verdict is None:
            name = host_name(host)
            verdict = is_loopback(name.strip("[]") if name.startswith("[") else name) or name in self._hosts
            if len(self._verdicts) >= KNOWN_HOSTS:
                self._verdicts.clear()
            self._verdicts[host] = verdict
        return verdict

    def cross_site(self, request: web.Request) -> bool:
        """Whether a browser marks ``request`` as coming from a page of another, untrusted site."""
        origin = request.headers.get("Origin")
        if origin is not None and (self._any_origin or origin.lower() in self._origins):
            return False
        site = request.headers.get("Sec-Fetch-Site")
        if site is not None:
            return site.lower() not in SAME_ORIGIN
        if origin is None:
            return False  # no browser page sent this (or a browser that marks nothing)
        host = request.headers.get("Host", "")
        return origin.lower() != f"{request.scheme}://{host.lower()}"

    @property
    def middleware(self) -> Middleware:
        @web.middleware
        async def browser(request: web.Request, handler: Handler) -> web.StreamResponse:
            if self._check_host and request.path not in ANY_HOST:
                host = request.headers.get("Host")
                if not self.host_allowed(host):
                    assert host is not None
                    log.debug("refused a foreign Host host=%r peer=%s", host[:ECHOED], request.remote)
                    raise HostNotAllowed(
                        f"this server does not serve the host {host[:ECHOED]!r}: with authentication "
                        "off it answers only to localhost, 127.0.0.1 and [::1] (a defence against DNS "
                        "rebinding); add the name to server.allowed_hosts to serve it",
                        host=host[:ECHOED],
                    )
            if writes(request) and self.cross_site(request):
                origin = request.headers.get("Origin")
                site = request.headers.get("Sec-Fetch-Site")
                log.debug("refused a cross-site request origin=%r site=%r", origin, site)
                details = {"origin": origin[:ECHOED]} if origin is not None else {}
                raise CrossSiteRequest(
                    f"a web page of another site sent this {request.method} "
                    f"({_marks(origin, site)}): state-changing requests from other sites are refused. "
                    "List the page's origin in [server.cors] origins to trust it.",
                    **details,
                )
            return await handler(request)

        return browser


def writes(request: web.Request) -> bool:
    """Whether ``request`` may change state: by its method, or by its route's ``writes``."""
    if request.method in STATE_CHANGING:
        return True
    resource = request.match_info.route.resource
    if resource is None:
        return False
    method = "GET" if request.method == "HEAD" else request.method
    rule = request.app.get(WRITES, {}).get((method, resource.canonical), False)
    return rule if isinstance(rule, bool) else rule(request)


async def on_prepare(request: web.BaseRequest, response: web.StreamResponse) -> None:
    """Add ``ANSWER_HEADERS`` to an answer that does not set them itself."""
    for name, value in ANSWER_HEADERS.items():
        response.headers.setdefault(name, value)


def host_name(host: str) -> str:
    """The name or address of a Host header, without its port, lower case."""
    host = host.strip().lower()
    if host.startswith("["):
        return host.partition("]")[0] + "]"
    name, sep, port = host.rpartition(":")
    return name if sep and port.isdigit() else host


def _marks(origin: str | None, site: str | None) -> str:
    marks = [f"Sec-Fetch-Site: {site[:ECHOED]}"] if site is not None else []
    if origin is not None:
        marks.append(f"Origin: {origin[:ECHOED]}")
    return ", ".join(marks)
