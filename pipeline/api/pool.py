"""The API's reads off the event loop: a bounded thread pool of its own and a store client per thread.

Never the default executor that the worker's own blocking work (sink inserts, store look-ups) uses, so
a burst of API reads cannot delay the worker; and never a shared client, which clickhouse-connect does
not allow two queries on at once.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from typing import Any, TypeVar

from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import OperationalError

T = TypeVar("T")


class ApiBusyError(RuntimeError):
    """Every pool thread is busy and the waiting line is full."""


class QueryPool:
    """A small executor of its own for API reads, with a bounded waiting line."""

    def __init__(self, threads: int, max_waiting: int) -> None:
        self.threads = threads
        self.max_waiting = max_waiting
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="callqa-api")
        self._admitted = 0  # running + waiting; only touched on the event loop's thread
        self._on_shutdown: list[Callable[[], None]] = []

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if self._admitted >= self.threads + self.max_waiting:
            raise ApiBusyError(f"the query API is busy ({self.threads} queries running, {self.max_waiting} "
                               "waiting); try again shortly")
        self._admitted += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, partial(fn, *args, **kwargs))
        finally:
            self._admitted -= 1

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        for close in self._on_shutdown:
            close()

    def on_shutdown(self, close: Callable[[], None]) -> None:
        """Call ``close`` when the pool shuts down (the views' per-thread clients)."""
        self._on_shutdown.append(close)


class ThreadClients:
    """One store client per thread, opened by ``factory`` on the thread's first ``get()``.

    A clickhouse-connect client must not run two queries at once: over HTTP the second one in its
    session fails ("concurrent queries within the same session"), and a chdb client serializes them
    on its one handle. A failed open is not remembered, and a client whose connection failed
    (``OperationalError``: refused, timed out, its session maybe still busy) is closed and dropped, so
    the thread's next request opens a new one."""

    def __init__(self, factory: Callable[[], Client]) -> None:
        self._factory = factory
        self._local = threading.local()
        self._lock = threading.Lock()
        self._opened: list[Client] = []

    @contextmanager
    def client(self) -> Iterator[Client]:
        """This thread's client, for one request."""
        client: Client | None = getattr(self._local, "client", None)
        if client is None:
            client = self._factory()
            self._local.client = client
            with self._lock:
                self._opened.append(client)
        try:
            yield client
        except OperationalError:
            self._local.client = None
            with self._lock:
                if client in self._opened:
                    self._opened.remove(client)
            client.close()
            raise

    def close(self) -> None:
        """Close every client opened so far (at shutdown: a thread still querying gets an error)."""
        with self._lock:
            opened, self._opened = self._opened, []
        for client in opened:
            client.close()
