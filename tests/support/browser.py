"""A real browser for the console and browser-attack tests: headless Chromium from Debian
(``make tools`` installs it; a browser cannot be downloaded here), driven by Playwright, and
``PageServer``, a static web server on its own loopback port that plays another site.

A test module marks itself ``pytestmark = [needs_chromium, ...]`` and gets its browser from
``chromium(...)``.
"""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, sync_playwright

from support.servers import free_port

CHROMIUM = Path("/usr/bin/chromium")

needs_chromium = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="chromium is not installed (make tools installs it)"
)


@contextlib.contextmanager
def chromium(*args: str) -> Iterator[Browser]:
    """Headless Chromium started with ``args``, closed on the way out."""
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=list(args))
        try:
            yield browser
        finally:
            browser.close()


class PageServer:
    """Serves ``pages`` (path → HTML) on 127.0.0.1 and a port of its own: another origin."""

    def __init__(self, pages: dict[str, str] | None = None) -> None:
        self.pages: dict[str, str] = dict(pages or {})
        served = self.pages

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                page = served.get(self.path.split("?")[0])
                if page is None:
                    self.send_error(404)
                    return
                body = page.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.port = int(self.httpd.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)
