"""Where the Postgres mirror sinks will write, checked before anything runs.

Each source table a mirror sink takes lands in `(destination.schema or its own
schema).table` of the target database. Two mistakes are refused with a ConfigError
naming both sides:

- two source tables into one target table (two sinks, or two source schemas under one
  `schema:`): their rows would mix;
- a target table that the sink's own source publishes (the target is the source's
  database and the publication covers the table: FOR ALL TABLES, its schema, or the
  table itself): every copied row would be captured and copied again.

Databases are told apart by their server (its start time) and name, not by the text
of their connection strings (localhost and 127.0.0.1 are one server). A target that
cannot be reached now is left to the sink (`<state schema>.mirror_tables` claims each
target table when it is first written).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from walstream.errors import ConfigError

log = logging.getLogger(__name__)

Table = tuple[str, str]


@dataclass(frozen=True)
class Published:
    database: tuple[str, str]  # (server start time, database name)
    all_tables: bool
    schemas: frozenset[str]
    tables: frozenset[Table]

    def covers(self, table: Table) -> bool:
        return self.all_tables or table[0] in self.schemas or table in self.tables


def _database(conn: Any) -> tuple[str, str]:
    row = conn.execute("SELECT pg_postmaster_start_time()::text, current_database()").fetchone()
    return (row[0], row[1])


def _published(conn: Any, publication: str) -> Published | None:
    row = conn.execute(
        "SELECT oid, puballtables FROM pg_publication WHERE pubname = %s", (publication,)
    ).fetchone()
    if row is None:
        return None
    schemas: set[str] = set()
    if conn.info.server_version >= 150000:
        schemas = {
            r[0]
            for r in conn.execute(
                "SELECT n.nspname FROM pg_publication_namespace p "
                "JOIN pg_namespace n ON n.oid = p.pnnspid WHERE p.pnpubid = %s",
                (row[0],),
            ).fetchall()
        }
    tables = conn.execute(
        "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s",
        (publication,),
    ).fetchall()
    return Published(
        _database(conn), bool(row[1]), frozenset(schemas), frozenset((s, t) for s, t in tables)
    )


def check_targets(config: Any, sinks: Sequence[Any]) -> None:
    """ConfigError for a mirror sink of `sinks` (the config's Postgres mirror sinks) that
    would mix two source tables in one target table or write into a table its own source
    publishes (see the module docstring)."""
    from walstream.postgres.replication import connect

    mirrors = [(s, s.destination.unwrapped()) for s in sinks]
    if not mirrors:
        return
    published: dict[str, Published | None] = {}
    claims: dict[tuple[tuple[str, str], str, str], tuple[str, str, str]] = {}
    for sink, dest in mirrors:
        source = config.source(sink.source)
        if source.name not in published:
            with connect(source.dsn.get_secret_value(), autocommit=True) as conn:
                published[source.name] = _published(conn, source.publication_name)
        pub = published[source.name]
        if pub is None:
            continue  # no publication yet (`walstream check` before the first run)
        try:
            with connect(dest.dsn.get_secret_value(), autocommit=True, connect_timeout=5) as conn:
                target_db = _database(conn)
        except Exception as exc:  # unreachable: check_destinations says so; the sink claims
            log.debug("sink %s: target not checked: %s", sink.name, exc)
            continue
        for schema, table in sorted(t for t in pub.tables if sink.wants_table(*t)):
            target = (dest.schema_ or schema, table)
            if target_db == pub.database and pub.covers(target):
                raise ConfigError(
                    f"sink {sink.name} would write {schema}.{table} into {'.'.join(target)}, "
                    f"in source {source.name}'s own database, whose publication "
                    f"{source.publication_name} covers that table: a feedback loop (every "
                    "copied row would be captured and copied again)",
                    "mirror into another database, or into a schema the publication leaves "
                    "out (list the source's tables instead of publishing all of them)",
                )
            key = (target_db, *target)
            here = (sink.name, schema, table)
            other = claims.setdefault(key, here)
            if other != here:
                raise ConfigError(
                    f"sinks {other[0]} and {sink.name} would both write into "
                    f"{'.'.join(target)} (from {other[1]}.{other[2]} and {schema}.{table}): "
                    "their rows would mix",
                    "give one of them its own destination.schema (or database), or leave the "
                    "table out of one sink (tables: [...])",
                )
