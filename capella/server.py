"""Builds the objects, connects them, and serves HTTP until SIGTERM or SIGINT.

Shutdown order matters for durability: stop accepting connections, let running requests
finish (bounded by ``server.shutdown_timeout``), then close the cluster, which flushes every
queue's pending writes and cursors before the process exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal

from aiohttp import web

from capella.api.app import create_app
from capella.config import Config
from capella.core.cluster import Cluster
from capella.errors import InvalidConfig
from capella.handlers.links import Links
from capella.handlers.supervisor import Supervisor

log = logging.getLogger(__name__)


async def serve(config: Config) -> None:
    """Run until SIGTERM or SIGINT, then flush everything and return."""
    config.data_dir.mkdir(parents=True, exist_ok=True)
    # Listen before recovering, so /healthz answers and /readyz says 503 while queues recover.
    cluster = Cluster.create(config)
    supervisor = Supervisor(cluster, links=Links(cluster, key_file=config.data_dir / "keys" / "links.key"))
    app = create_app(cluster, config.server, supervisor)
    runner = web.AppRunner(
        app,
        handle_signals=False,
        access_log=None,
        keepalive_timeout=config.server.keepalive_timeout,
        shutdown_timeout=config.server.shutdown_timeout,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await runner.setup()
        site = web.TCPSite(runner, config.server.host, config.server.port, backlog=1024, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            raise InvalidConfig(
                f"cannot listen on {config.server.host}:{config.server.port}: {exc.strerror}"
            ) from None
        host = config.server.host
        url = f"http://{'[' + host + ']' if ':' in host else host}:{config.server.port}"
        log.info("capella listening cluster=%s url=%s data_dir=%s", cluster.name, url, config.data_dir)
        await cluster.start()
        await supervisor.start()
        # Everything built so far lives until exit: keep it out of every future GC pass, and
        # collect the young generation less often (each request allocates hundreds of objects).
        gc.collect()
        gc.freeze()
        gc.set_threshold(10_000, 20, 20)
        await stop.wait()
        log.info("capella stopping: finishing requests and flushing queues")
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await runner.cleanup()
        await supervisor.close()
        await cluster.close()
        log.info("capella stopped")


def run(config: Config) -> None:
    """Serve ``config`` on uvloop when it is installed, else on asyncio's own loop."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        import uvloop
    except ImportError:  # uvloop is optional (not on Windows)
        asyncio.run(serve(config))
        return
    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(serve(config))
