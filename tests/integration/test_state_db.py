"""The state database's one retry policy, against a real Postgres connection dropped under it."""

from __future__ import annotations

import psycopg
import pytest

from walstream.state.db import once_more


def _kill(conn: psycopg.Connection, dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))


def test_a_dropped_idle_connection_is_replaced_once(db) -> None:  # type: ignore[no-untyped-def]
    conns: list[psycopg.Connection] = []

    def connect() -> psycopg.Connection:
        if not conns or conns[-1].closed:
            conns.append(psycopg.connect(db.dsn, autocommit=True))
        return conns[-1]

    _kill(connect(), db.dsn)  # the server restarted under an idle connection
    got = once_more(connect, lambda conn: conn.execute("SELECT 41 + 1").fetchone()[0])
    assert got == 42 and len(conns) == 2 and conns[0].closed


def test_inside_a_transaction_the_failure_is_raised_not_replayed(db) -> None:  # type: ignore[no-untyped-def]
    conn = psycopg.connect(db.dsn, autocommit=True)
    conn.execute("BEGIN")
    calls = []
    _kill(conn, db.dsn)

    def fn(c: psycopg.Connection) -> None:
        calls.append(c)
        c.execute("SELECT 1")

    with pytest.raises(psycopg.OperationalError):
        once_more(lambda: conn, fn)
    assert len(calls) == 1  # half a transaction is never run again
