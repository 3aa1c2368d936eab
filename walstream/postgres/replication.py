"""Slots, publications and the streaming-replication connection (psycopg2)."""

from __future__ import annotations

import select
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from walstream.errors import ConnectionFailed, SetupError
from walstream.postgres.publication import NO_OPTIONS, PublicationOptions
from walstream.postgres.types import session_options


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


def replication_connection(dsn: str, extra_options: str = "") -> Any:
    """A psycopg2 LogicalReplicationConnection with walstream's session settings."""
    import psycopg2
    import psycopg2.extras

    try:
        return psycopg2.connect(
            dsn,
            connection_factory=psycopg2.extras.LogicalReplicationConnection,
            options=(session_options() + " " + extra_options).strip(),
        )
    except psycopg2.OperationalError as exc:
        raise ConnectionFailed(
            f"cannot open a replication connection to {safe_dsn(dsn)}: {str(exc).strip()}",
            "the role needs the REPLICATION attribute (ALTER ROLE ... WITH REPLICATION) and "
            "pg_hba.conf must allow it; wal_level must be logical",
        ) from exc


def ensure_publication(
    conn: psycopg.Connection[Any], name: str, tables: Iterable[str] | None,
    options: PublicationOptions = NO_OPTIONS,
) -> bool:  # fmt: skip
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


def max_protocol_version(version_num: int) -> int:
    """The newest pgoutput protocol this server speaks (4 needs 16+, 3 needs 15+)."""
    if version_num >= 160000:
        return 4
    if version_num >= 150000:
        return 3
    return 2 if version_num >= 140000 else 1


def start_options(
    publication: str, proto_version: int = 1, streaming: bool | str = False
) -> dict[str, str]:
    """pgoutput's options; `streaming`: True ("on") or "parallel" (protocol 4, 16+: Stream
    Abort then carries the abort's LSN and time) sends big transactions before they commit."""
    opts = {
        "proto_version": str(proto_version),
        "publication_names": publication,
        "messages": "true",
    }
    if streaming:
        opts["streaming"] = streaming if isinstance(streaming, str) else "on"
    return opts


@dataclass(frozen=True, slots=True)
class RawMessage:
    data_start: int
    wal_end: int
    payload: bytes


def read_messages(
    dsn: str,
    slot: str,
    publication: str,
    *,
    until_lsn: int,
    proto_version: int = 1,
    streaming: bool | str = False,
    extra_options: str = "",
    timeout: float = 60.0,
) -> Iterator[RawMessage]:
    """Read raw pgoutput messages from a slot until a Commit whose end reaches `until_lsn`.

    A simple synchronous reader for tools, tests and benchmarks; the Spark
    source's capture thread is the production reader. It confirms nothing.
    """
    conn = replication_connection(dsn, extra_options)
    try:
        cur = conn.cursor()
        cur.start_replication(
            slot_name=slot,
            decode=False,
            options=start_options(publication, proto_version, streaming),
        )
        deadline = time.monotonic() + timeout
        while True:
            msg = cur.read_message()
            if msg is None:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"slot {slot} did not reach LSN {until_lsn:X} within {timeout}s"
                    )
                select.select([cur], [], [], 1.0)
                continue
            payload = msg.payload
            yield RawMessage(msg.data_start, msg.wal_end, payload)
            kind = payload[:1]
            if kind in (b"C", b"c") and int.from_bytes(payload[-16:-8], "big") >= until_lsn:
                return
    finally:
        conn.close()


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


#: At most this many messages, or about this many bytes, are read in one burst: the
#: capture checks its buffer's bound between bursts.
BURST = 1000
BURST_BYTES = 1 << 20
#: When a drained connection becomes readable, what arrives is left to gather this long
#: before it is read: reading each message as it arrived cost the capture thread (and
#: the walsender) a wake-up and a few system calls per message, half the capture's CPU
#: (docs/performance-log.md, "the capture reads in bursts"). A change's latency grows by as much.
COALESCE = 0.002


def read_burst(cur: Any) -> tuple[list[bytes], int]:
    """The messages a replication cursor holds now (up to BURST or BURST_BYTES; none:
    nothing arrived) and the highest WAL position among them."""
    out: list[bytes] = []
    read = cur.read_message
    received = size = 0
    while len(out) < BURST and size < BURST_BYTES:
        msg = read()
        if msg is None:
            break
        received = max(received, msg.data_start)
        payload = msg.payload
        size += len(payload)
        out.append(payload)
    return out, received


def wait_for_messages(cur: Any, timeout: float) -> None:
    """Wait up to `timeout` seconds for a drained replication cursor to become readable,
    then COALESCE seconds more (see there)."""
    if select.select([cur], [], [], timeout)[0]:
        time.sleep(COALESCE)
