"""Connections to the state database and the one way statements run on them."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
from psycopg import sql

from walstream.errors import ConnectionFailed

T = TypeVar("T")

_CONNS: dict[tuple[str, int], psycopg.Connection[Any]] = {}
_LOCK = threading.Lock()


def dedicated_connection(dsn: str, **kwargs: Any) -> psycopg.Connection[Any]:
    """A new autocommit connection of its own (a lock held in an open transaction)."""
    try:
        return psycopg.connect(dsn, autocommit=True, connect_timeout=10, **kwargs)
    except psycopg.OperationalError as exc:
        raise ConnectionFailed(
            f"cannot reach the state database: {str(exc).strip()}",
            "check state.dsn (default: the first source's dsn) and that the server is up",
        ) from exc


def state_connection(dsn: str) -> psycopg.Connection[Any]:
    """One autocommit connection per state database per thread (executors reuse workers).

    Per thread: the driver's retrier runs transactions while the batch thread writes
    the ledger, and statements of one must never land inside the other's transaction.
    """
    key = (dsn, threading.get_ident())
    with _LOCK:
        conn = _CONNS.get(key)
        if conn is not None and not conn.closed and not conn.broken:
            return conn
        conn = dedicated_connection(dsn)
        _CONNS[key] = conn
        return conn


def once_more(connect: Callable[[], Any], fn: Callable[[Any], T]) -> T:
    """The retry policy of every statement on a state, outbox or stream-reading connection:
    `fn(conn)`; after an OperationalError or InterfaceError (a server restart dropped the
    connection) the connection is closed and `fn` runs once more on a new one from
    `connect()` — only if no transaction was open (half a transaction is never replayed)."""
    conn = connect()
    idle = conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    try:
        return fn(conn)
    except (psycopg.OperationalError, psycopg.InterfaceError):
        if not idle:
            raise
        conn.close()
    return fn(connect())


def execute(dsn: str, query: sql.Composable, params: Any = None) -> list[tuple[Any, ...]]:
    """Run a statement on this thread's state connection; its rows (none for DDL/DML)."""

    def run(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
        cur = conn.execute(query, params)  # type: ignore[call-overload]
        return cur.fetchall() if cur.description else []

    return once_more(lambda: state_connection(dsn), run)
