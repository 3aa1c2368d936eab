"""Connections, slots and publications: what replication needs set up on the server.

The streaming-replication connection itself is the capture's (`capture/stream.py`)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import psycopg
from psycopg import sql

from walstream.decode.types import session_options
from walstream.errors import ConnectionFailed, SetupError
from walstream.postgres.publication import NO_OPTIONS, PublicationOptions


def connect(dsn: str, **kwargs: Any) -> psycopg.Connection[Any]:
    """An ordinary connection (psycopg 3) with walstream's session settings."""
    try:
        return psycopg.connect(dsn, options=session_options(), **kwargs)
    except psycopg.OperationalError as exc:
        raise ConnectionFailed(
            f"cannot connect to PostgreSQL at {safe_dsn(dsn)}: {str(exc).strip()}",
            "check that the server runs and that host, port, user, password and database in the DSN are right",
        ) from exc


def safe_dsn(dsn: str) -> str:
    """The DSN without its password, for messages."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<unparsable DSN>"
    info.pop("password", None)
    return " ".join(f"{k}={v}" for k, v in info.items())


def ensure_publication(
    conn: psycopg.Connection[Any],
    name: str,
    tables: Iterable[str] | None,
    options: PublicationOptions = NO_OPTIONS,
) -> bool:
    """Create the publication when missing (FOR TABLE ..., or FOR ALL TABLES) with `options`.
    True if created."""
    cur = conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (name,))
    if cur.fetchone():
        return False
    tables = list(tables or [])
    if tables:
        idents = sql.SQL(", ").join(sql.Identifier(*t.split(".", 1)) for t in tables)
        stmt = sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(sql.Identifier(name), idents)
    else:
        stmt = sql.SQL("CREATE PUBLICATION {} FOR ALL TABLES").format(sql.Identifier(name))
    stmt += options.clause()
    try:
        conn.execute(stmt)
    except psycopg.errors.InsufficientPrivilege as exc:
        raise SetupError(
            f"cannot create publication {name}: {exc}",
            f"ask the table owner or a superuser to run: {stmt.as_string(conn)}",
        ) from exc
    return True


def ensure_slot(conn: psycopg.Connection[Any], name: str, failover: bool = False) -> bool:
    """Create a pgoutput logical slot when missing; check the plugin when present.
    `failover` (PostgreSQL 17+, on a primary): standbys that sync slots keep a copy."""
    row = conn.execute(
        "SELECT plugin, database FROM pg_replication_slots WHERE slot_name = %s", (name,)
    ).fetchone()
    if row:
        plugin, database = row
        current = conn.execute("SELECT current_database()").fetchone()[0]  # type: ignore[index]
        if database != current:
            raise SetupError(
                f"replication slot {name} belongs to database {database!r}, not {current!r}",
                "point the DSN at that database or configure another slot name",
            )
        if plugin != "pgoutput":
            raise SetupError(
                f"replication slot {name} uses plugin {plugin!r}, walstream needs pgoutput",
                f"drop it (SELECT pg_drop_replication_slot('{name}')) or configure another slot name",
            )
        return False
    if failover:  # (name, plugin, temporary, two-phase, failover)
        conn.execute(
            "SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, false, true)", (name,)
        )
    else:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (name,))
    return True


def drop_slot(conn: psycopg.Connection[Any], name: str, wait: float = 10.0) -> None:
    """Drop a slot, waiting for a just-closed walsender to let go of it."""
    deadline = time.monotonic() + wait
    while True:
        try:
            conn.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
                (name,),
            )
            return
        except psycopg.errors.ObjectInUse:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def server_version(conn: psycopg.Connection[Any]) -> int:
    return int(conn.execute("SHOW server_version_num").fetchone()[0])  # type: ignore[index]


#: How far the server's WAL goes, in SQL: written on a primary, replayed on a standby
#: (where pg_current_wal_lsn() fails); NULL when a standby replayed nothing yet.
WAL_POSITION = (
    "(CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END)"
)


def server_wal_lsn(conn: Any) -> str | None:
    """WAL_POSITION as text."""
    row = conn.execute(f"SELECT {WAL_POSITION}::text").fetchone()
    return None if row is None or row[0] is None else str(row[0])


def current_lsn(conn: psycopg.Connection[Any]) -> int:
    from walstream.change import parse_lsn

    return parse_lsn(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])  # type: ignore[index]
