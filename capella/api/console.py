"""The web console at ``/ui``: static files from ``capella/api/ui/``, served by the broker itself.

The files are public (no credentials needed to load the page, as with ``/healthz``): they hold
no data. Everything the page shows comes from the API, called with the credentials of the
person signed in, so the access check decides there as for any client. A strict Content
Security Policy keeps the page to its own scripts, so a payload that slipped into the DOM
could not run.
"""

from __future__ import annotations

import functools
import hashlib
import zlib
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from capella.api.openapi import answer
from capella.api.route import Route
from capella.errors import NotFound

ROOT = Path(__file__).parent / "ui"
TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # Revalidated on every load (cheap with the ETag), so an upgraded broker serves its new page.
    "Cache-Control": "no-cache",
}


@dataclass(frozen=True, slots=True)
class File:
    """A file as sent: its bytes (and gzip'd), content type and ETag."""

    body: bytes
    gzipped: bytes
    kind: str
    etag: str


@functools.cache
def files() -> dict[str, File]:
    """Every file of the console, read and compressed once (the whole console is ~70 KiB,
    ~26 KiB gzip'd)."""
    found = {}
    for path in sorted(ROOT.iterdir()):
        if path.suffix in TYPES and path.is_file():
            body = path.read_bytes()
            etag = hashlib.sha256(body).hexdigest()[:16]
            found[path.name] = File(body, _gzipped(body), TYPES[path.suffix], etag)
    return found


def _gzipped(body: bytes) -> bytes:
    """``body`` in the gzip format, by zlib (loaded anyway; the ``gzip`` module is ~70 KB more)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # wbits 16 + 15: a gzip header, mtime 0
    return packer.compress(body) + packer.flush()


def _serve(request: web.Request, name: str) -> web.Response:
    try:
        file = files()[name]
    except KeyError:
        raise NotFound(f"the console has no file {name!r}") from None
    zipped = "gzip" in request.headers.get("Accept-Encoding", "")
    # Each encoding is its own representation, with its own ETag.
    etag = f'"{file.etag}-gz"' if zipped else f'"{file.etag}"'
    headers = {**HEADERS, "ETag": etag, "Vary": "Accept-Encoding"}
    if etag in request.headers.get("If-None-Match", ""):
        return web.Response(status=304, headers=headers)
    if zipped:
        headers["Content-Encoding"] = "gzip"
    return web.Response(
        body=file.gzipped if zipped else file.body, headers={**headers, "Content-Type": file.kind}
    )


async def redirect(request: web.Request) -> web.Response:
    # The page loads its files relative to itself, so it must be at /ui/.
    raise web.HTTPPermanentRedirect("/ui/")


async def index(request: web.Request) -> web.Response:
    return _serve(request, "index.html")


async def static(request: web.Request) -> web.Response:
    return _serve(request, request.match_info["file"])


def _file_answer(description: str, *types: str) -> dict[int, dict[str, object]]:
    content = {kind.partition(";")[0]: {"schema": {"type": "string"}} for kind in types}
    return {
        200: {"description": description, "content": content},
        304: answer("Not modified since the ETag in If-None-Match"),
    }


ROUTES = [
    Route(
        "GET",
        "/ui",
        redirect,
        need=None,
        op="consoleRedirect",
        summary="The web console (redirects to /ui/)",
        tag="console",
        answers={308: answer("To /ui/")},
        fails=None,
    ),
    Route(
        "GET",
        "/ui/",
        index,
        need=None,
        op="console",
        summary="The web console's page (it calls the API with the signed-in user's credentials)",
        tag="console",
        answers=_file_answer("The console's HTML page", TYPES[".html"]),
        fails=None,
    ),
    Route(
        "GET",
        "/ui/{file}",
        static,
        need=None,
        op="consoleFile",
        summary="A script, style sheet or image of the console",
        tag="console",
        answers={
            **_file_answer("The file (JavaScript, CSS or SVG)", *TYPES.values()),
            404: answer("No such file"),
        },
        fails=None,
    ),
]
