"""One client per settings per worker process (or per thread): the sinks' shared cache.

Spark runs many tasks in one Python worker; each task builds a new Sink, but the
connections, pools and producers behind it are made once and reused.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

from walstream.state.db import once_more

T = TypeVar("T")


class Clients(Generic[T]):
    """Clients by key, made on first use; `per_thread`: one per key and thread (a
    connection whose transactions must not interleave with another thread's)."""

    def __init__(self, per_thread: bool = False) -> None:
        self.per_thread = per_thread
        self._clients: dict[tuple[Hashable, int], T] = {}
        self._lock = threading.Lock()

    def _key(self, key: Hashable) -> tuple[Hashable, int]:
        return (key, threading.get_ident() if self.per_thread else 0)

    def get(
        self, key: Hashable, make: Callable[[], T], usable: Callable[[T], bool] | None = None
    ) -> T:
        """The client for `key`; a new one from `make()` if there is none or it is not
        `usable` any more (a closed connection)."""
        k = self._key(key)
        with self._lock:
            client = self._clients.get(k)
            if client is not None and (usable is None or usable(client)):
                return client
            if not self.per_thread:  # made under the lock: never two for one key
                client = self._clients[k] = make()
                return client
        client = make()  # only this thread uses key k: others need not wait for a connect
        with self._lock:
            self._clients[k] = client
        return client

    def find(self, key: Hashable, usable: Callable[[T], bool] | None = None) -> T | None:
        """The client for `key` if there is a usable one (for clients made asynchronously)."""
        with self._lock:
            client = self._clients.get(self._key(key))
        return client if client is not None and (usable is None or usable(client)) else None

    def put(self, key: Hashable, client: T) -> None:
        with self._lock:
            self._clients[self._key(key)] = client

    def forget(
        self, which: Callable[[Hashable, T], bool], close: Callable[[T], object] | None = None
    ) -> None:
        """Drop the clients `which(key, client)` names (closing them with `close`)."""
        with self._lock:
            gone = [k for k, c in self._clients.items() if which(k[0], c)]
            dropped = [self._clients.pop(k) for k in gone]
        if close is not None:
            for client in dropped:
                with contextlib.suppress(Exception):
                    close(client)


#: One autocommit connection per source and thread: a task's catalog reads on the source
#: (a lake batch's table shapes and rows by key, Debezium's column types).
_SOURCES: Clients[Any] = Clients(per_thread=True)


def on_source(dsn: str, fn: Callable[[Any], T]) -> T:
    """`fn(conn)` on this thread's catalog connection to the source, with the state
    database's retry policy (a connection the server dropped is replaced once)."""
    import psycopg

    def connect() -> Any:
        return _SOURCES.get(
            dsn,
            lambda: psycopg.connect(dsn, autocommit=True, connect_timeout=10),
            lambda c: not c.closed and not c.broken,
        )

    return once_more(connect, fn)
