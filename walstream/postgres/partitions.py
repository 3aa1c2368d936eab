"""Partitioned tables: under which name their changes arrive, and what check says about it.

pgoutput sends a partition's change under the partition's own name (`public.events_2026`)
unless the publication has `publish_via_partition_root`: then every partition's changes
arrive as the root table (`public.events`), with the root's columns and key, and
partitions created or attached later are published with it. A source's
`publish_via_partition_root` setting makes the publication walstream creates so; a
publication that exists already must agree with it when it publishes a partitioned
table, or the changes would arrive under names the sinks do not expect.
"""

from __future__ import annotations

from typing import Any

from walstream.postgres.findings import Finding, fetch_rows
from walstream.postgres.publication import disagreement

SETTING = "publish_via_partition_root"


def via_root(conn: Any, publication: str) -> bool | None:
    """The publication's publish_via_partition_root, or None when it does not exist."""
    rows = fetch_rows(conn, "SELECT pubviaroot FROM pg_publication WHERE pubname = %s", publication)
    return bool(rows[0][0]) if rows else None


def partitioned(conn: Any, tables: list[tuple[str, str]]) -> dict[tuple[str, str], list[str]]:
    """Which of `tables` are partitioned, each with its leaf partitions' names (schema.table)."""
    if not tables:
        return {}
    rows = fetch_rows(  # one query for all of them: check runs at every start
        conn,
        "SELECT n.nspname, c.relname, (SELECT array_agg(format('%%I.%%I', pn.nspname, "
        "  pc.relname) ORDER BY pn.nspname, pc.relname) FROM pg_partition_tree(c.oid) p "
        "  JOIN pg_class pc ON pc.oid = p.relid "
        "  JOIN pg_namespace pn ON pn.oid = pc.relnamespace WHERE p.isleaf) "
        "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.relkind = 'p' AND (n.nspname, c.relname) IN "
        "  (SELECT * FROM unnest(%s::text[], %s::text[]))",
        [s for s, _ in tables],
        [t for _, t in tables],
    )
    return {(s, t): list(leaves or []) for s, t, leaves in rows}


def published_roots(conn: Any, publication: str) -> dict[tuple[str, str], list[str]]:
    """The partitioned tables a publication covers (itself, or through its partitions)."""
    rows = fetch_rows(
        conn,
        "SELECT DISTINCT n.nspname, c.relname FROM pg_publication_tables t "
        "JOIN pg_namespace ln ON ln.nspname = t.schemaname "
        "JOIN pg_class l ON l.relnamespace = ln.oid AND l.relname = t.tablename "
        "JOIN pg_class c ON c.oid = pg_partition_root(l.oid) "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE t.pubname = %s AND c.relkind = 'p'",
        publication,
    )
    return partitioned(conn, [(s, t) for s, t in rows])


def partition_findings(
    conn: Any, publication: str | None, tables: list[tuple[str, str]], wanted: bool
) -> list[Finding]:
    """Per partitioned table: under which names its changes arrive; an error when an
    existing publication's setting differs from the source's (`wanted`)."""
    roots = partitioned(conn, tables)
    current = via_root(conn, publication) if publication else None
    if publication and current is not None:
        roots.update(published_roots(conn, publication))
    if not roots:
        return []
    out = []
    effective = wanted if current is None else current
    for (schema, table), leaves in sorted(roots.items()):
        name = f"{schema}.{table}"
        shown = ", ".join(leaves[:3]) + (f" and {len(leaves) - 3} more" if len(leaves) > 3 else "")
        if effective:
            message = (
                f"partitioned ({len(leaves)} partitions): every partition's changes "
                f"arrive as {name}, and partitions added later are published with it"
            )
        else:
            message = (
                f"partitioned ({len(leaves)} partitions): changes arrive under each "
                f"partition's name ({shown or 'none yet'}), not as {name}; "
                f"{SETTING}: true on the source sends them as {name}"
            )
        out.append(Finding("ok", f"table {name}", message))
    if publication and current is not None and current != wanted:
        out.append(
            disagreement(
                conn,
                publication,
                SETTING,
                str(wanted).lower(),
                f"{SETTING} is {str(current).lower()} on the publication but "
                f"{str(wanted).lower()} in the source's settings, and it publishes partitioned "
                "tables: their changes would arrive under other names than the sinks expect",
                str(current).lower(),
            )
        )
    return out
