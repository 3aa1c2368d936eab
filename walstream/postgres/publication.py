"""A source's choices for its publication, without psycopg: the Spark source's planning
processes read them (tests/unit/source/test_source_imports.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PublicationOptions:
    """A source's choices for the publication walstream creates (an existing one must agree)."""

    #: Partitions' changes are published as their root table's (partitions.py).
    via_root: bool = False
    #: Stored generated columns are published, PostgreSQL 18+ (generated.py).
    generated: bool = False

    def clause(self) -> Any:
        """The CREATE PUBLICATION clause (a psycopg `sql.Composable`)."""
        from psycopg import sql

        options = []
        if self.via_root:
            options.append(sql.SQL("publish_via_partition_root = true"))
        if self.generated:
            options.append(sql.SQL("publish_generated_columns = stored"))
        if not options:
            return sql.SQL("")
        return sql.SQL(" WITH ({})").format(sql.SQL(", ").join(options))


def disagreement(
    conn: Any, publication: str, setting: str, value: str, problem: str, keep: str
) -> Any:
    """The error `check` reports when an existing publication's `setting` is not what the
    source asks: its fix sets the publication's to `value` (SQL), or the source's to `keep`."""
    from psycopg import sql

    from walstream.postgres.findings import Finding

    stmt = sql.SQL("ALTER PUBLICATION {} SET ({} = {})").format(
        sql.Identifier(publication), sql.SQL(setting), sql.SQL(value)
    )
    return Finding(
        "error",
        f"publication {publication}",
        problem,
        f"{stmt.as_string(conn)}; or set {setting}: {keep} on the source",
    )


#: A source that asks nothing of its publication.
NO_OPTIONS = PublicationOptions()
