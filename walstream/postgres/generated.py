"""Stored generated columns: PostgreSQL 18 publishes them when the publication says so.

Before 18 pgoutput never sends a generated column. On 18 a publication made `WITH
(publish_generated_columns = stored)` sends stored generated columns like any other,
and a source's `publish_generated_columns: true` makes the publication walstream
creates so. A backfill reads the columns the stream sends (backfill/requests.py), so a
read row still equals the stream's insert of the same values.
"""

from __future__ import annotations

from typing import Any

from walstream.postgres.findings import Finding, fetch_rows
from walstream.postgres.publication import disagreement

SETTING = "publish_generated_columns"
#: The first version that can publish generated columns.
SINCE = 180000


def publishes(conn: Any, publication: str) -> bool | None:
    """Whether the publication sends stored generated columns; None when it does not exist."""
    if conn.info.server_version < SINCE:
        rows = fetch_rows(conn, "SELECT 1 FROM pg_publication WHERE pubname = %s", publication)
        return False if rows else None
    rows = fetch_rows(conn, "SELECT pubgencols FROM pg_publication WHERE pubname = %s", publication)
    return rows[0][0] == "s" if rows else None


def generated_columns(conn: Any, tables: list[tuple[str, str]]) -> dict[tuple[str, str], list[str]]:
    """The stored generated columns of those of `tables` that have any (one query: check
    runs at every start)."""
    if not tables:
        return {}
    rows = fetch_rows(
        conn,
        "SELECT n.nspname, c.relname, array_agg(a.attname ORDER BY a.attnum) "
        "FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = 's' "
        "AND (n.nspname, c.relname) IN (SELECT * FROM unnest(%s::text[], %s::text[])) "
        "GROUP BY 1, 2",
        [s for s, _ in tables],
        [t for _, t in tables],
    )
    return {(s, t): list(names) for s, t, names in rows}


def generated_findings(
    conn: Any, publication: str | None, tables: list[tuple[str, str]], wanted: bool
) -> list[Finding]:
    """Per table with stored generated columns: whether they are sent; an error when the
    source asks for them where they cannot be, or the publication disagrees."""
    version = conn.info.server_version
    if wanted and version < SINCE:
        return [
            Finding(
                "error",
                SETTING,
                f"PostgreSQL {version // 10000} cannot publish generated columns "
                "(18 can): they are never sent",
                f"set {SETTING}: false on the source, or upgrade to PostgreSQL 18",
            )
        ]
    current = publishes(conn, publication) if publication else None
    effective = wanted if current is None else current
    out = []
    found = generated_columns(conn, tables)
    for schema, table in tables:
        names = found.get((schema, table))
        if not names:
            continue
        cols = ", ".join(names)
        if effective:
            message = f"generated column(s) {cols}: sent ({SETTING})"
        elif version < SINCE:
            message = (
                f"generated column(s) {cols}: not sent, PostgreSQL before 18 cannot "
                "publish them (messages and backfills leave them out)"
            )
        else:
            message = (
                f"generated column(s) {cols}: not sent; {SETTING}: true on the source sends them"
            )
        out.append(Finding("ok", f"table {schema}.{table}", message))
    if publication and current is not None and version >= SINCE and current != wanted:
        out.append(
            disagreement(
                conn,
                publication,
                SETTING,
                "stored" if wanted else "none",
                f"it {'sends' if current else 'does not send'} generated columns, but the source "
                f"sets {SETTING}: {str(wanted).lower()}",
                str(current).lower(),
            )
        )
    return out
