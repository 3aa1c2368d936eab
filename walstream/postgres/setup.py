"""Check that a database is ready for walstream; every finding says the fix."""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from walstream.errors import ConnectionFailed
from walstream.postgres.findings import Finding, fetch_rows
from walstream.postgres.generated import generated_findings
from walstream.postgres.partitions import partition_findings
from walstream.postgres.publication import NO_OPTIONS, PublicationOptions
from walstream.postgres.replication import connect
from walstream.postgres.slots import capacity_findings, slot_findings, slot_info
from walstream.postgres.standby import failover_findings, standby_findings

__all__ = ["Finding", "check_database", "has_errors"]

MIN_SERVER_VERSION = 140000  # pgoutput `messages` and streaming need 14+


def check_database(
    dsn: str,
    slot: str | None = None,
    publication: str | None = None,
    tables: Sequence[str] = (),
    primary: str | None = None,
    options: PublicationOptions = NO_OPTIONS,
    streaming: bool = False,
) -> list[Finding]:
    """Run every setup check; never raises for a database problem, returns findings.
    `primary`: the source's primary_dsn (when `dsn` may be a standby); `options`: what it
    asks of its publication; `streaming`: whether it streams in-progress transactions."""
    try:
        conn = connect(dsn, autocommit=True, connect_timeout=10)
    except ConnectionFailed as exc:
        return [Finding("error", "connection", exc.problem, exc.fix)]
    with conn:
        out: list[Finding] = []
        out += _server(conn, streaming)
        out += standby_findings(conn, primary)
        out += _role(conn)
        out += capacity_findings(conn, slot)
        info = slot_info(conn, slot) if slot else None  # read once, for both
        if slot:
            out += slot_findings(conn, slot, info)
        out += failover_findings(conn, slot, info)
        resolved, missing = _resolve_tables(conn, tables)
        out += missing
        if publication:
            pub_findings, pub_tables = _publication(conn, publication, resolved, bool(tables))
            out += pub_findings
            if not tables:
                resolved = pub_tables
        for schema, table in resolved:
            out += _table(conn, schema, table)
        out += partition_findings(conn, publication, resolved, options.via_root)
        out += generated_findings(conn, publication, resolved, options.generated)
        return out


def _server(conn: psycopg.Connection[Any], streaming: bool = False) -> list[Finding]:
    out: list[Finding] = []
    version = int(fetch_rows(conn, "SHOW server_version_num")[0][0])
    human = fetch_rows(conn, "SHOW server_version")[0][0]
    if version < MIN_SERVER_VERSION:
        out.append(
            Finding(
                "error",
                "server version",
                f"PostgreSQL {human} is too old; walstream needs 14 or newer",
                "upgrade the server to PostgreSQL 14+",
            )
        )
    else:
        out.append(Finding("ok", "server version", f"PostgreSQL {human}; {features(version)}"))
    keep = fetch_rows(conn, "SHOW max_slot_wal_keep_size")[0][0]
    if keep == "-1":
        out.append(
            Finding(
                "ok",
                "max_slot_wal_keep_size",
                "-1: a slot that stops advancing keeps WAL until the disk is full",
                "to cap it, set max_slot_wal_keep_size: a slot past it is "
                "invalidated instead, and `walstream recover` restores the sinks",
            )
        )
    else:
        out.append(
            Finding(
                "ok",
                "max_slot_wal_keep_size",
                f"{keep}: a slot holding more WAL than that is invalidated "
                "(walstream warns in /health as it gets close)",
            )
        )
    work_mem = fetch_rows(conn, "SHOW logical_decoding_work_mem")[0][0]
    if streaming:
        large = (
            f"{work_mem}: the server streams a transaction with more changes than that "
            "while it runs (streaming: true); walstream spools it on its own disk "
            "(spill_dir) and delivers it when it commits"
        )
    else:
        large = (
            f"{work_mem}: the server decodes a transaction larger than that through its "
            "own disk (pg_replslot) and sends it when it commits; walstream takes it in "
            "batches, within the source's max_buffer_bytes (streaming: true moves that "
            "spill to walstream's disk)"
        )
    out.append(Finding("ok", "logical_decoding_work_mem", large))
    wal_level = fetch_rows(conn, "SHOW wal_level")[0][0]
    if wal_level != "logical":
        out.append(
            Finding(
                "error",
                "wal_level",
                f"wal_level is {wal_level!r}; logical replication needs 'logical'",
                "run `ALTER SYSTEM SET wal_level = logical;` as a superuser and restart PostgreSQL "
                "(managed services: set the rds.logical_replication / cloudsql.logical_decoding flag)",
            )
        )
    else:
        out.append(Finding("ok", "wal_level", "logical"))
    return out


#: What a server version enables for walstream: (version_num, what).
FEATURES = (
    (160000, "logical decoding on a standby"),
    (170000, "failover slots"),
    (180000, "stored generated columns published"),
)


def features(version: int) -> str:
    """The version-dependent features, each with yes / no and the version it needs."""
    return ", ".join(
        f"{what}: {'yes' if version >= needs else f'no (needs {needs // 10000}+)'}"
        for needs, what in FEATURES
    )


def _role(conn: psycopg.Connection[Any]) -> list[Finding]:
    user, can_replicate, superuser = fetch_rows(
        conn,
        "SELECT current_user, rolreplication, rolsuper FROM pg_roles WHERE rolname = current_user",
    )[0]
    if can_replicate or superuser:
        return [Finding("ok", "replication permission", f"role {user} may replicate")]
    return [
        Finding(
            "error",
            "replication permission",
            f"role {user} has no REPLICATION attribute",
            f"run as a superuser: {sql.SQL('ALTER ROLE {} WITH REPLICATION').format(sql.Identifier(user)).as_string(conn)};",
        )
    ]


def _resolve_tables(
    conn: psycopg.Connection[Any], tables: Sequence[str]
) -> tuple[list[tuple[str, str]], list[Finding]]:
    """Expand `schema.table` names and globs (`public.*`) to existing tables."""
    if not tables:
        return [], []
    existing = fetch_rows(
        conn,
        "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.relkind IN ('r', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema') "
        "ORDER BY 1, 2",
    )
    resolved: list[tuple[str, str]] = []
    findings: list[Finding] = []
    for pattern in tables:
        if "." not in pattern:
            pattern = "public." + pattern
        matches = [(s, t) for s, t in existing if fnmatch.fnmatchcase(f"{s}.{t}", pattern)]
        if not matches:
            findings.append(
                Finding(
                    "error",
                    f"table {pattern}",
                    "no such table",
                    "check the name (schema.table; globs like public.* allowed) and the database in the DSN",
                )
            )
        resolved += [m for m in matches if m not in resolved]
    return resolved, findings


def _publication(
    conn: psycopg.Connection[Any], name: str, tables: list[tuple[str, str]], named: bool
) -> tuple[list[Finding], list[tuple[str, str]]]:
    """Findings about the publication; `named`: tables were asked for (an empty `tables`
    then means none of them exists, not "all tables")."""
    rows = fetch_rows(
        conn,
        "SELECT puballtables, pubinsert, pubupdate, pubdelete, pubtruncate "
        "FROM pg_publication WHERE pubname = %s",
        name,
    )
    subject = f"publication {name}"
    if not rows and named and not tables:  # the missing tables are the problem to fix first
        return [
            Finding(
                "warning",
                subject,
                "does not exist yet; walstream run creates it for the tables once they exist",
            )
        ], []
    if not rows:
        target = (
            sql.SQL("FOR TABLE {}").format(
                sql.SQL(", ").join(sql.Identifier(s, t) for s, t in tables)
            )
            if tables
            else sql.SQL("FOR ALL TABLES")
        )
        stmt = sql.SQL("CREATE PUBLICATION {} ").format(sql.Identifier(name)) + target
        return [
            Finding(
                "warning",
                subject,
                "does not exist yet; walstream run creates it (the role must own the tables, "
                "or be superuser for FOR ALL TABLES)",
                f"to create it yourself: {stmt.as_string(conn)};",
            )
        ], []
    all_tables, ins, upd, dele, trunc = rows[0]
    out: list[Finding] = []
    skipped = [
        a
        for a, on in (("insert", ins), ("update", upd), ("delete", dele), ("truncate", trunc))
        if not on
    ]
    if skipped:
        out.append(
            Finding(
                "warning",
                subject,
                f"does not publish {', '.join(skipped)}; those changes will never reach walstream",
                f"ALTER PUBLICATION {sql.Identifier(name).as_string(conn)} SET (publish = 'insert, update, delete, truncate');",
            )
        )
    covered = set(
        fetch_rows(
            conn, "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s", name
        )
    )
    uncovered = [t for t in tables if t not in covered]
    if uncovered and not all_tables:
        names = sql.SQL(", ").join(sql.Identifier(s, t) for s, t in uncovered)
        stmt = sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(sql.Identifier(name), names)
        out.append(
            Finding(
                "error",
                subject,
                f"does not cover {', '.join(f'{s}.{t}' for s, t in uncovered)}",
                f"{stmt.as_string(conn)};",
            )
        )
    elif not skipped:
        scope = "all tables" if all_tables else f"{len(covered)} table(s)"
        out.append(Finding("ok", subject, f"exists, covers {scope}"))
    return out, sorted(covered)


def _table(conn: psycopg.Connection[Any], schema: str, table: str) -> list[Finding]:
    ident = sql.Identifier(schema, table).as_string(conn)
    subject = f"table {schema}.{table}"
    rows = fetch_rows(
        conn,
        """
        SELECT c.relreplident,
               (SELECT array_agg(a.attname ORDER BY array_position(i.indkey, a.attnum))
                  FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
                 WHERE i.indrelid = c.oid AND i.indisprimary)
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %s AND c.relname = %s
        """,
        schema,
        table,
    )
    if not rows:
        return [Finding("error", subject, "no such table", "check the table name")]
    ident_kind, pk = rows[0]
    out: list[Finding] = []
    if not pk:
        if ident_kind == "f":
            out.append(
                Finding(
                    "warning",
                    subject,
                    "has no primary key; REPLICA IDENTITY FULL makes every column the key, "
                    "so per-row ordering and backfills cannot use a key",
                    f"add one: ALTER TABLE {ident} ADD PRIMARY KEY (...);",
                )
            )
        elif ident_kind == "i":
            out.append(Finding("ok", subject, "no primary key; replica identity uses an index"))
        else:
            out.append(
                Finding(
                    "error",
                    subject,
                    "has no primary key: Postgres rejects its UPDATEs and DELETEs once it is "
                    "published, and walstream cannot order or backfill its rows",
                    f"add one: ALTER TABLE {ident} ADD PRIMARY KEY (...); "
                    f"or at least: ALTER TABLE {ident} REPLICA IDENTITY FULL;",
                )
            )
            return out
    if ident_kind == "d":
        out.append(
            Finding(
                "warning",
                subject,
                f"primary key ({', '.join(pk)}); REPLICA IDENTITY DEFAULT sends no old values on "
                "update and only the key on delete",
                f"for old values: ALTER TABLE {ident} REPLICA IDENTITY FULL;",
            )
        )
    elif ident_kind == "n":
        out.append(
            Finding(
                "error",
                subject,
                "REPLICA IDENTITY NOTHING: Postgres rejects its UPDATEs and DELETEs once published",
                f"ALTER TABLE {ident} REPLICA IDENTITY FULL; (or DEFAULT)",
            )
        )
    elif pk:
        kind = "FULL" if ident_kind == "f" else "USING INDEX"
        out.append(
            Finding("ok", subject, f"primary key ({', '.join(pk)}), replica identity {kind}")
        )
    return out


def has_errors(findings: Sequence[Finding]) -> bool:
    return any(f.level == "error" for f in findings)
