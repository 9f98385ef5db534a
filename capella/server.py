"""Builds the objects, connects them, and serves HTTP until SIGTERM or SIGINT.

Shutdown order matters for durability: stop accepting connections, let running requests
finish (bounded by ``server.shutdown_timeout``), then close the cluster, which flushes every
queue's pending writes and cursors before the process exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import os
import re
import signal
import ssl
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from aiohttp import web

from capella.api.app import create_app
from capella.api.connection import ConnectionGuard, GuardedSite
from capella.auth.authenticator import Authenticator
from capella.auth.secret import Secrets
from capella.auth.store import AuthStore
from capella.config import Config, ServerSettings, TlsSettings
from capella.core.cluster import Cluster
from capella.core.shared_home import SharedHome
from capella.egress import Egress
from capella.errors import InvalidConfig, InvalidRequest
from capella.file_access import FileAccess
from capella.fsync import create_directories, private_tree
from capella.handlers.supervisor import Supervisor
from capella.links.registry import Links
from capella.storage import Storage

log = logging.getLogger(__name__)


async def serve(config: Config) -> None:
    """Run until SIGTERM or SIGINT, then flush everything and return."""
    create_directories(config.data_dir)
    make_private(config)
    # Listen before recovering, so /healthz answers and /readyz says 503 while queues recover.
    authenticator = open_auth(config)
    users = authenticator.store if authenticator is not None else None
    secrets = Secrets(config.secrets)
    cluster = Cluster.create(config, shared=shared_home(config, secrets))
    egress = Egress.of(config.egress.allow, auth_enabled=config.auth.enabled)
    files = FileAccess.of(config.files.allow)
    links = Links(
        cluster,
        key_file=config.data_dir / "keys" / "links.key",
        secrets=secrets,
        egress=egress,
        files=files,
    )
    supervisor = Supervisor(cluster, links=links, users=users, secrets=secrets, egress=egress, files=files)
    guard = ConnectionGuard(config.server)
    app = create_app(
        cluster, config.server, supervisor, authenticator=authenticator, guard=guard, compat=config.compat
    )
    # The guard builds each connection's protocol with the header limits and keep-alive timeout.
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=config.server.shutdown_timeout)
    stop = asyncio.Event()
    kafka: Closing | None = None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await runner.setup()
        site = await listen(runner, config.server, guard)
        log.info("capella listening cluster=%s url=%s data_dir=%s", cluster.name, site.name, config.data_dir)
        # Kafka clients too are answered while queues recover (NotReady: LEADER_NOT_AVAILABLE,
        # which they retry), and the listener is bound once /readyz says ready.
        kafka = await kafka_listener(config, cluster, authenticator)
        await cluster.start()
        await supervisor.start()
        # Everything built so far lives until exit: keep it out of every future GC pass, and
        # collect the young generation less often (each request allocates hundreds of objects).
        gc.collect()
        gc.freeze()
        gc.set_threshold(10_000, 20, 20)
        trim_heap()
        await stop.wait()
        log.info("capella stopping: finishing requests and flushing queues")
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        if kafka is not None:
            await kafka.close()
        await runner.cleanup()
        guard.close()
        await supervisor.close()
        await cluster.close()
        if users is not None:
            users.unlock()
        log.info("capella stopped")


def shared_home(config: Config, secrets: Secrets) -> Callable[[dict[str, Storage]], SharedHome] | None:
    """What builds this node's shared queues, when ``[shared]`` is configured: only then is
    ``capella.shared`` (and asyncpg) imported."""
    settings = config.shared
    if settings is None:
        return None
    from capella.shared.node import SharedNode

    url = f"http://{config.server.listen}"
    return lambda mounts: SharedNode(config, settings, mounts, secrets, url=url)


class Closing(Protocol):
    async def close(self) -> None: ...


async def kafka_listener(
    config: Config, cluster: Cluster, authenticator: Authenticator | None
) -> Closing | None:
    """The Kafka listener, when ``[kafka]`` is configured: only then is ``capella.kafka`` (and
    kafka-python) imported."""
    settings = config.kafka
    if settings is None:
        return None
    from capella.kafka.listener import KafkaListener

    listener = KafkaListener.of(
        cluster,
        settings,
        max_frame=config.server.max_body_size,
        authenticator=authenticator,
        ssl_context=None if settings.tls is None else ssl_context(settings.tls),
    )
    await listener.start()
    return listener


# glibc's mallopt parameter for the number of heaps (malloc.h).
_M_ARENA_MAX = -8
# Heaps malloc keeps for the threads (glibc's default: 8 per core).
ARENA_MAX = 2


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None  # not glibc: nothing to tune


def tune_malloc() -> None:
    """Keep the peak RSS down: two malloc heaps for all threads instead of one per worker thread.

    Block bytes, request bodies and rendered pages (0.1-4 MB, freed soon after) left a heap of
    their own fragmented in every worker thread. Measured on 2026-11-25, the ``versus``
    workloads against one server, three runs each: peak RSS 123-131 -> 112-117 MB, produce and
    consume rates unchanged. Also giving buffers from 128 KB or 1 MB up pages of their own
    (``M_MMAP_THRESHOLD``) took the peak to 108-110 MB but cost reads 17 % in page faults, so
    it is not done.
    """
    libc = _libc()
    if libc is not None:
        libc.mallopt(_M_ARENA_MAX, ARENA_MAX)


def trim_heap() -> None:
    """Give the heap start-up freed back to the OS (glibc's malloc_trim; elsewhere nothing).

    Measured on 2026-11-25: idle RSS 46.2 → 45.7 MB (0.5 MB of the anonymous memory).
    """
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


def lift_open_files_limit() -> None:
    """Raise the soft limit on open files to the hard one, as Go's runtime does at start-up.

    Each connection holds a descriptor (up to ``server.max_connections``, 1024 by default), and
    each queue one for its open block's journal and one per change log in use (its
    subscriptions, its schedule, each work queue); the usual soft limit of 1024 would run out
    first, and every accept or open after it would fail with EMFILE.
    """
    try:
        import resource
    except ImportError:  # not on Windows
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft == resource.RLIM_INFINITY or soft >= hard:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:
        log.warning("open files limit stays at %d (hard limit %d): %s", soft, hard, exc)
        return
    log.info("open files limit raised from %d to %d", soft, hard)


# Paths a start-up names one by one; the rest are counted.
NAMED_FIXES = 20


def make_private(config: Config) -> None:
    """Take the group and other permission bits off the data directory and every file mount.

    Capella writes them 0600/0700 itself (``capella.fsync``); what an older version, a restore
    or a hand wrote with a looser umask is fixed here, and each fix is logged as a warning.
    """
    roots = [config.data_dir]
    for mount in config.mounts.values():
        root = mount.options.get("root") if mount.provider == "file" else None
        if isinstance(root, Path) and not root.is_relative_to(config.data_dir):
            roots.append(root)
    fixes = sorted((fix for root in roots for fix in private_tree(root)), key=lambda fix: fix.path)
    for fix in fixes[:NAMED_FIXES]:
        if fix.error is None:
            log.warning(
                "permissions for others removed path=%s mode=%04o now=%04o",
                fix.path,
                fix.mode,
                fix.private_mode,
            )
        else:
            log.warning(
                "permissions for others left in place path=%s mode=%04o error=%s",
                fix.path,
                fix.mode,
                fix.error,
            )
    if len(fixes) > NAMED_FIXES:
        rest = fixes[NAMED_FIXES:]
        log.warning(
            "permissions for others removed from %d more paths under %s (%d could not be changed)",
            len(rest),
            ", ".join(map(str, roots)),
            sum(fix.error is not None for fix in rest),
        )


def open_auth(config: Config) -> Authenticator | None:
    """The users of ``config.data_dir``, held by this process; None when auth is off."""
    if not config.auth.enabled:
        return None
    store = AuthStore(config.data_dir / "auth")
    store.lock()
    if not store.users():
        user, env = config.auth.bootstrap_user, config.auth.bootstrap_password_env
        password = os.environ.get(env) if env else None
        if user is None or env is None or not password:
            store.unlock()
            hint = (
                f"set the environment variable {env}"
                if env
                else "set [auth] bootstrap_user and bootstrap_password_env"
            )
            raise InvalidConfig(
                f"authentication is on but {store.directory} has no user yet: {hint}, or create an "
                f"admin with `capella user add NAME --admin --data-dir {config.data_dir}`"
            )
        try:
            store.add_user(user, password, admin=True)
        except InvalidRequest as exc:
            store.unlock()
            raise InvalidConfig(f"auth.bootstrap_user: {exc.message}") from None
        log.info("admin user created from the configuration user=%s", user)
    log.info("authentication on users=%d", len(store.users()))
    return Authenticator(store, config.auth)


async def listen(runner: web.AppRunner, settings: ServerSettings, guard: ConnectionGuard) -> GuardedSite:
    """Accept connections on ``settings.host:port`` through ``guard``; HTTPS when TLS is configured."""
    context = None if settings.tls is None else ssl_context(settings.tls)
    site = GuardedSite(runner, guard, settings.host, settings.port, ssl_context=context)
    try:
        await site.start()
    except OSError as exc:
        raise InvalidConfig(f"cannot listen on {settings.host}:{settings.port}: {exc.strerror}") from None
    return site


def ssl_context(tls: TlsSettings) -> ssl.SSLContext:
    """The server side of TLS 1.2 or later; client certificates are required when a client CA is set."""
    # A bare server context, not create_default_context(): that one would also trust the
    # system's CAs, so any publicly issued certificate would pass as a client certificate.
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # Client-initiated renegotiation lets one client make the server do handshakes in a loop.
    context.options |= ssl.OP_NO_RENEGOTIATION
    try:
        context.load_cert_chain(tls.cert_file, tls.key_file, password=_no_password)
    except OSError as exc:  # ssl.SSLError too: not PEM, or the key does not match the certificate
        raise InvalidConfig(
            f"server.tls: cannot use cert_file {str(tls.cert_file)!r} with key_file "
            f"{str(tls.key_file)!r} (PEM files, the key matching the certificate): {_reason(exc)}"
        ) from None
    if tls.client_ca_file is not None:
        try:
            context.load_verify_locations(cafile=tls.client_ca_file)
        except OSError as exc:
            raise InvalidConfig(
                f"server.tls.client_ca_file {str(tls.client_ca_file)!r} cannot be used: {_reason(exc)}"
            ) from None
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _no_password() -> bytes:
    # Without a callback OpenSSL would prompt on the terminal and block the start.
    raise InvalidConfig("server.tls.key_file is encrypted: give an unencrypted PEM key (mode 0600)")


def _reason(exc: OSError) -> str:
    if isinstance(exc, ssl.SSLError):
        # "[SSL: KEY_VALUES_MISMATCH] key values mismatch (_ssl.c:3926)" without the C location
        return re.sub(r"\s*\(_ssl\.c:\d+\)$", "", str(exc))
    return str(exc.strerror or exc)


# Worker threads decode, render and seal blocks in Python while holding the GIL; the loop
# gets it back at this interval (Python's default is 5 ms). At 1 ms a sequential reader's
# pages no longer stall behind the next block's render: 375,000 -> 417,000 msg/s read side
# by side, produce unchanged.
SWITCH_INTERVAL = 0.001


def run(config: Config) -> None:
    """Serve ``config`` on uvloop when it is installed, else on asyncio's own loop."""
    sys.setswitchinterval(SWITCH_INTERVAL)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    lift_open_files_limit()
    tune_malloc()  # before any worker thread exists
    try:
        import uvloop
    except ImportError:  # uvloop is optional (not on Windows)
        asyncio.run(serve(config))
        return
    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(serve(config))
