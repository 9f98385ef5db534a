"""The blocking client: ``AsyncClient`` driven by an event loop in a private thread.

The loop lives in its own thread so the client works anywhere, including inside a program
that already runs a loop (Jupyter, a web framework). Each method blocks until its answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl as ssl_module
import threading
from collections.abc import AsyncGenerator, Coroutine, Iterable, Iterator, Mapping
from types import TracebackType
from typing import Any, Literal, TypeVar

from capella.client.async_client import DEFAULT_URL, AsyncClient, NdjsonLine, Save
from capella.client.message import MessageLike, Segments
from capella.errors import CapellaError

T = TypeVar("T")

# close() waits this long for the loop thread; it only has to close idle connections.
CLOSE_TIMEOUT = 5.0


class Client:
    """A Capella server at ``base_url``; the same methods as ``AsyncClient``, blocking.

    Use as ``with Client(url) as client:`` or call ``close()``. ``stream`` returns a plain
    iterator. A ``KeyboardInterrupt`` while a call waits also cancels the request.
    """

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        timeout: float = 30.0,
        connect_timeout: float | None = None,
        username: str | None = None,
        password: str | None = None,
        token: str | None = None,
        ssl: ssl_module.SSLContext | bool | None = None,
        compression: str | None = None,
    ) -> None:
        """The same options as ``AsyncClient`` (auth, TLS, request compression)."""
        self._client = AsyncClient(
            base_url,
            timeout=timeout,
            connect_timeout=connect_timeout,
            username=username,
            password=password,
            token=token,
            ssl=ssl,
            compression=compression,
        )
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="capella-client", daemon=True)
        self._thread.start()
        self._closed = False

    @property
    def base_url(self) -> str:
        return self._client.base_url

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        try:
            self._run(self._client.close())
            self._run(self._loop.shutdown_asyncgens())
        finally:
            self._closed = True
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(CLOSE_TIMEOUT)
            if not self._thread.is_alive():
                self._loop.close()

    # --- queues ----------------------------------------------------------------------

    def put_queue(self, name: str, **definition: Any) -> dict[str, Any]:
        return self._run(self._client.put_queue(name, **definition))

    def queues(self) -> list[dict[str, Any]]:
        return self._run(self._client.queues())

    def queue(self, name: str) -> dict[str, Any]:
        return self._run(self._client.queue(name))

    def drop_queue(self, name: str) -> None:
        self._run(self._client.drop_queue(name))

    # --- messages --------------------------------------------------------------------

    def produce(
        self, queue: str, messages: Iterable[MessageLike], *, save: Save = None
    ) -> list[dict[str, Any]]:
        return self._run(self._client.produce(queue, list(messages), save=save))

    def produce_ndjson(
        self, queue: str, lines: Iterable[NdjsonLine], *, save: Save = None
    ) -> list[dict[str, Any]]:
        """Like ``AsyncClient.produce_ndjson``; ``lines`` is iterated in the client's thread."""
        return self._run(self._client.produce_ndjson(queue, lines, save=save))

    def read(
        self,
        queue: str,
        *,
        after: int = 0,
        limit: int = 100,
        segments: Segments | None = None,
        wait: float | None = None,
    ) -> dict[str, Any]:
        return self._run(self._client.read(queue, after=after, limit=limit, segments=segments, wait=wait))

    def stream(
        self,
        queue: str,
        *,
        after: int = 0,
        segments: Segments | None = None,
        retries: int | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Follow the queue's tail; see ``AsyncClient.stream``. Close the iterator to stop."""
        events = self._client.stream(queue, after=after, segments=segments, retries=retries)
        try:
            while True:
                try:
                    yield self._run(_next(events))
                except StopAsyncIteration:
                    return
        finally:
            if not self._closed:
                # After Ctrl-C the generator may still be unwinding in the loop: then it
                # finishes by itself.
                with contextlib.suppress(RuntimeError):
                    self._run(_close(events))

    # --- delayed delivery -------------------------------------------------------------

    def schedule(
        self,
        queue: str,
        messages: Iterable[MessageLike],
        *,
        deliver_at: float | str | None = None,
        delay: float | str | None = None,
        save: Save = None,
    ) -> list[dict[str, Any]]:
        return self._run(
            self._client.schedule(queue, list(messages), deliver_at=deliver_at, delay=delay, save=save)
        )

    def scheduled(self, queue: str, *, limit: int = 100, after: str | None = None) -> dict[str, Any]:
        return self._run(self._client.scheduled(queue, limit=limit, after=after))

    def scheduled_message(self, queue: str, id: int) -> dict[str, Any]:
        return self._run(self._client.scheduled_message(queue, id))

    def reschedule(
        self,
        queue: str,
        id: int,
        *,
        deliver_at: float | str | None = None,
        delay: float | str | None = None,
        save: Save = None,
    ) -> dict[str, Any]:
        return self._run(self._client.reschedule(queue, id, deliver_at=deliver_at, delay=delay, save=save))

    def cancel_scheduled(self, queue: str, id: int, *, save: Save = None) -> None:
        self._run(self._client.cancel_scheduled(queue, id, save=save))

    def cancel_scheduled_many(self, queue: str, ids: Iterable[int], *, save: Save = None) -> dict[str, Any]:
        return self._run(self._client.cancel_scheduled_many(queue, list(ids), save=save))

    # --- subscriptions ---------------------------------------------------------------

    def read_subscription(
        self,
        queue: str,
        name: str,
        *,
        limit: int = 100,
        wait: float | None = None,
        segments: Segments | None = None,
        commit: Literal["auto", "none"] = "auto",
    ) -> dict[str, Any]:
        return self._run(
            self._client.read_subscription(
                queue, name, limit=limit, wait=wait, segments=segments, commit=commit
            )
        )

    def commit(
        self,
        queue: str,
        name: str,
        last_id: int,
        *,
        replica: bool | None = None,
        reset: bool = False,
        save: Save = None,
    ) -> dict[str, Any]:
        return self._run(self._client.commit(queue, name, last_id, replica=replica, reset=reset, save=save))

    def subscription(self, queue: str, name: str) -> dict[str, Any]:
        return self._run(self._client.subscription(queue, name))

    def subscriptions(self, queue: str) -> list[dict[str, Any]]:
        return self._run(self._client.subscriptions(queue))

    def delete_subscription(self, queue: str, name: str) -> None:
        self._run(self._client.delete_subscription(queue, name))

    def replicas(self, queue: str, id: int) -> dict[str, Any]:
        return self._run(self._client.replicas(queue, id))

    # --- work queues (ack-mode subscriptions) ---------------------------------------

    def put_work(self, queue: str, name: str, *, save: Save = None, **policy: Any) -> dict[str, Any]:
        return self._run(self._client.put_work(queue, name, save=save, **policy))

    def claim(
        self,
        queue: str,
        name: str,
        *,
        limit: int = 1,
        lease: float | str | None = None,
        wait: float | None = None,
        save: Save = None,
    ) -> list[dict[str, Any]]:
        return self._run(self._client.claim(queue, name, limit=limit, lease=lease, wait=wait, save=save))

    def ack(self, queue: str, name: str, receipts: str | Iterable[str], *, save: Save = None) -> Any:
        items = receipts if isinstance(receipts, str) else list(receipts)
        return self._run(self._client.ack(queue, name, items, save=save))

    def nack(
        self,
        queue: str,
        name: str,
        receipts: str | Iterable[str],
        *,
        delay: float | str | None = None,
        error: str | None = None,
        save: Save = None,
    ) -> Any:
        items = receipts if isinstance(receipts, str) else list(receipts)
        return self._run(self._client.nack(queue, name, items, delay=delay, error=error, save=save))

    def extend(
        self,
        queue: str,
        name: str,
        receipts: str | Iterable[str],
        *,
        lease: float | str | None = None,
        save: Save = None,
    ) -> Any:
        items = receipts if isinstance(receipts, str) else list(receipts)
        return self._run(self._client.extend(queue, name, items, lease=lease, save=save))

    def work(
        self,
        queue: str,
        name: str,
        *,
        status: str | Iterable[str] | None = None,
        source: str | None = None,
        segments: Segments | None = None,
        headers: Mapping[str, str] | None = None,
        json: Mapping[str, Any] | None = None,
        after: int = 0,
        limit: int = 100,
    ) -> dict[str, Any]:
        return self._run(
            self._client.work(
                queue,
                name,
                status=status if status is None or isinstance(status, str) else list(status),
                source=source,
                segments=segments,
                headers=headers,
                json=json,
                after=after,
                limit=limit,
            )
        )

    def work_message(self, queue: str, name: str, id: int) -> dict[str, Any]:
        return self._run(self._client.work_message(queue, name, id))

    def retry_work(self, queue: str, name: str, *, save: Save = None, **selection: Any) -> dict[str, Any]:
        return self._run(self._client.retry_work(queue, name, save=save, **selection))

    def delete_work(self, queue: str, name: str, *, save: Save = None, **selection: Any) -> dict[str, Any]:
        return self._run(self._client.delete_work(queue, name, save=save, **selection))

    # --- handlers --------------------------------------------------------------------

    def put_handler(
        self,
        name: str,
        type: str,
        *,
        queues: str | Iterable[str],
        params: Mapping[str, Any] | None = None,
        started: bool = True,
    ) -> dict[str, Any]:
        queue_list = [queues] if isinstance(queues, str) else list(queues)
        return self._run(
            self._client.put_handler(name, type, queues=queue_list, params=params, started=started)
        )

    def handlers(self) -> list[dict[str, Any]]:
        return self._run(self._client.handlers())

    def handler(self, name: str) -> dict[str, Any]:
        return self._run(self._client.handler(name))

    def drop_handler(self, name: str) -> None:
        self._run(self._client.drop_handler(name))

    def start_handler(self, name: str) -> dict[str, Any]:
        return self._run(self._client.start_handler(name))

    def stop_handler(self, name: str) -> dict[str, Any]:
        return self._run(self._client.stop_handler(name))

    def run_handler(self, name: str) -> dict[str, Any]:
        return self._run(self._client.run_handler(name))

    # --- external clusters -------------------------------------------------------------

    def put_cluster(self, name: str, **fields: Any) -> dict[str, Any]:
        return self._run(self._client.put_cluster(name, **fields))

    def clusters(self) -> list[dict[str, Any]]:
        return self._run(self._client.clusters())

    def cluster(self, name: str) -> dict[str, Any]:
        return self._run(self._client.cluster(name))

    def drop_cluster(self, name: str) -> None:
        self._run(self._client.drop_cluster(name))

    def ping_cluster(self, name: str) -> dict[str, Any]:
        return self._run(self._client.ping_cluster(name))

    # --- users and tokens --------------------------------------------------------------

    def users(self) -> list[dict[str, Any]]:
        return self._run(self._client.users())

    def user(self, name: str) -> dict[str, Any]:
        return self._run(self._client.user(name))

    def put_user(self, name: str, **fields: Any) -> dict[str, Any]:
        return self._run(self._client.put_user(name, **fields))

    def drop_user(self, name: str) -> None:
        self._run(self._client.drop_user(name))

    def change_password(self, name: str, password: str, old_password: str | None = None) -> dict[str, Any]:
        return self._run(self._client.change_password(name, password, old_password))

    def me(self) -> dict[str, Any]:
        return self._run(self._client.me())

    def create_token(
        self, ttl: float | str | None = None, description: str | None = None, user: str | None = None
    ) -> dict[str, Any]:
        return self._run(self._client.create_token(ttl, description, user))

    def tokens(self) -> list[dict[str, Any]]:
        return self._run(self._client.tokens())

    def revoke_token(self, id: str) -> None:
        self._run(self._client.revoke_token(id))

    # --- operations ------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        return self._run(self._client.health())

    def ready(self) -> bool:
        return self._run(self._client.ready())

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            coro.close()
            raise CapellaError("the client is closed")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result()
        except BaseException:
            # Ctrl-C (or any error while waiting) must not leave the request running.
            future.cancel()
            raise


async def _close(events: AsyncGenerator[dict[str, Any], None]) -> None:
    await events.aclose()


async def _next(events: AsyncGenerator[dict[str, Any], None]) -> dict[str, Any]:
    return await anext(events)
