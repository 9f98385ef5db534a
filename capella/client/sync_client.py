"""The blocking client: ``AsyncClient`` driven by an event loop in a private thread.

The loop lives in its own thread so the client works anywhere, including inside a program
that already runs a loop (Jupyter, a web framework). Each method blocks until its answer.

The methods are not written twice: ``produce = blocking(AsyncClient.produce)`` makes the
async method a blocking one with the same parameters, docstring and (awaited) return type,
for ``help`` and for mypy alike, so a change to ``AsyncClient`` reaches ``Client`` by itself.
A property is shared the same way: ``transport = Delegated(AsyncClient.transport)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import ssl as ssl_module
import threading
from collections.abc import AsyncGenerator, Callable, Coroutine, Generator
from types import TracebackType
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar, cast, overload

from capella.client.async_client import DEFAULT_URL, AsyncClient
from capella.egress import Egress
from capella.errors import CapellaError

P = ParamSpec("P")
T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

# close() waits this long for the loop thread; it only has to close idle connections.
CLOSE_TIMEOUT = 5.0


# ``__call__`` is static so that its first parameter can be named ``self``, as in the methods
# themselves: mypy refuses ``Concatenate[AsyncClient, P]`` (a positional-only first parameter)
# for a method that takes ``**kwargs``, since P would then accept a ``self=`` keyword.
class AsyncMethod(Protocol[P, T_co]):
    """An ``AsyncClient`` coroutine method, taken from the class (``AsyncClient.produce``)."""

    @staticmethod
    def __call__(self: AsyncClient, *args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, T_co]: ...


class AsyncGeneratorMethod(Protocol[P, T_co]):
    """An ``AsyncClient`` async generator method, taken from the class (``AsyncClient.stream``)."""

    @staticmethod
    def __call__(self: AsyncClient, *args: P.args, **kwargs: P.kwargs) -> AsyncGenerator[T_co, None]: ...


def blocking(method: AsyncMethod[P, T]) -> Callable[Concatenate[Client, P], T]:
    """``method`` as a method of ``Client``: run it in the client's loop, return its result."""

    @functools.wraps(method)
    def call(client: Client, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return client._run(method(client._client, *args, **kwargs))

    return call


def blocking_iter(
    method: AsyncGeneratorMethod[P, T],
) -> Callable[Concatenate[Client, P], Generator[T, None, None]]:
    """``method`` as a method of ``Client``: a plain generator of what it yields."""

    @functools.wraps(method)
    def call(client: Client, /, *args: P.args, **kwargs: P.kwargs) -> Generator[T, None, None]:
        return client._iterate(method(client._client, *args, **kwargs))

    # help() would otherwise show the async generator as the return type.
    vars(call)["__signature__"] = inspect.signature(method).replace(return_annotation=inspect.Signature.empty)
    return call


class Delegated(property, Generic[T]):
    """An ``AsyncClient`` property as one of ``Client``: the async client's value.

    A property whose getter wraps the async one, so ``help``, pdoc and mypy show the same
    docstring and type. (mypy reads ``AsyncClient.transport`` as the getter; at run time it is
    the property.)
    """

    def __init__(self, attribute: Callable[[AsyncClient], T]) -> None:
        original = cast(property, attribute)

        @functools.wraps(cast(Callable[[AsyncClient], T], original.fget))
        def read(client: Client) -> T:
            return cast(T, original.__get__(client._client))

        super().__init__(read)
        self.__wrapped__ = attribute

    @overload
    def __get__(self, client: None, owner: type[Client], /) -> Delegated[T]: ...

    @overload
    def __get__(self, client: Client, owner: type[Client] | None = None, /) -> T: ...

    def __get__(self, client: Client | None, owner: type[Client] | None = None, /) -> Delegated[T] | T:
        return cast("Delegated[T] | T", super().__get__(client, owner))


class Client:
    """A Capella server at ``base_url``; the same methods as ``AsyncClient``, blocking.

    Use as ``with Client(url) as client:`` or call ``close()``. ``stream`` returns a plain
    iterator; close it to stop. A ``KeyboardInterrupt`` while a call waits also cancels the
    request. Arguments go to ``AsyncClient`` as they are, so an iterable of messages is
    iterated in the client's thread.
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
        egress: Egress | None = None,
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
            egress=egress,
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

    # The async client's own Transport: its coroutines belong to the client's loop thread.
    transport = Delegated(AsyncClient.transport)

    # --- queues ----------------------------------------------------------------------

    put_queue = blocking(AsyncClient.put_queue)
    save_queue = blocking(AsyncClient.save_queue)
    queues = blocking(AsyncClient.queues)
    queue = blocking(AsyncClient.queue)
    drop_queue = blocking(AsyncClient.drop_queue)

    # --- topics of several partitions ------------------------------------------------

    define_topic = blocking(AsyncClient.define_topic)
    topics = blocking(AsyncClient.topics)
    topic = blocking(AsyncClient.topic)
    drop_topic = blocking(AsyncClient.drop_topic)

    # --- messages --------------------------------------------------------------------

    produce = blocking(AsyncClient.produce)
    produce_batch = blocking(AsyncClient.produce_batch)
    produce_ndjson = blocking(AsyncClient.produce_ndjson)
    read = blocking(AsyncClient.read)
    stream = blocking_iter(AsyncClient.stream)

    # --- delayed delivery -------------------------------------------------------------

    schedule = blocking(AsyncClient.schedule)
    scheduled = blocking(AsyncClient.scheduled)
    scheduled_message = blocking(AsyncClient.scheduled_message)
    reschedule = blocking(AsyncClient.reschedule)
    cancel_scheduled = blocking(AsyncClient.cancel_scheduled)
    cancel_scheduled_many = blocking(AsyncClient.cancel_scheduled_many)

    # --- subscriptions ---------------------------------------------------------------

    read_subscription = blocking(AsyncClient.read_subscription)
    commit = blocking(AsyncClient.commit)
    save_subscription = blocking(AsyncClient.save_subscription)
    subscription = blocking(AsyncClient.subscription)
    subscriptions = blocking(AsyncClient.subscriptions)
    delete_subscription = blocking(AsyncClient.delete_subscription)
    replicas = blocking(AsyncClient.replicas)

    # --- work queues (ack-mode subscriptions) ---------------------------------------

    put_work = blocking(AsyncClient.put_work)
    claim = blocking(AsyncClient.claim)
    ack = blocking(AsyncClient.ack)
    nack = blocking(AsyncClient.nack)
    extend = blocking(AsyncClient.extend)
    work = blocking(AsyncClient.work)
    work_message = blocking(AsyncClient.work_message)
    retry_work = blocking(AsyncClient.retry_work)
    delete_work = blocking(AsyncClient.delete_work)

    # --- handlers --------------------------------------------------------------------

    put_handler = blocking(AsyncClient.put_handler)
    save_handler = blocking(AsyncClient.save_handler)
    handlers = blocking(AsyncClient.handlers)
    handler = blocking(AsyncClient.handler)
    drop_handler = blocking(AsyncClient.drop_handler)
    start_handler = blocking(AsyncClient.start_handler)
    stop_handler = blocking(AsyncClient.stop_handler)
    run_handler = blocking(AsyncClient.run_handler)

    # --- external clusters -------------------------------------------------------------

    put_cluster = blocking(AsyncClient.put_cluster)
    save_cluster = blocking(AsyncClient.save_cluster)
    clusters = blocking(AsyncClient.clusters)
    cluster = blocking(AsyncClient.cluster)
    drop_cluster = blocking(AsyncClient.drop_cluster)
    ping_cluster = blocking(AsyncClient.ping_cluster)

    # --- users and tokens --------------------------------------------------------------

    users = blocking(AsyncClient.users)
    user = blocking(AsyncClient.user)
    put_user = blocking(AsyncClient.put_user)
    save_user = blocking(AsyncClient.save_user)
    drop_user = blocking(AsyncClient.drop_user)
    change_password = blocking(AsyncClient.change_password)
    me = blocking(AsyncClient.me)
    create_token = blocking(AsyncClient.create_token)
    tokens = blocking(AsyncClient.tokens)
    revoke_token = blocking(AsyncClient.revoke_token)

    # --- operations ------------------------------------------------------------------

    health = blocking(AsyncClient.health)
    ready = blocking(AsyncClient.ready)

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

    def _iterate(self, events: AsyncGenerator[T, None]) -> Generator[T, None, None]:
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


# anext() and aclose() give awaitables, and run_coroutine_threadsafe wants coroutines.


async def _next(events: AsyncGenerator[T, None]) -> T:
    return await anext(events)


async def _close(events: AsyncGenerator[Any, None]) -> None:
    await events.aclose()
