"""Reading lake tables the way another engine would: DuckDB with its delta / iceberg extensions.

walstream writes with delta-rs and pyiceberg; these tests read with DuckDB (its own
Delta kernel and Iceberg reader, loaded offline from the extension wheels), and find
an Iceberg table's metadata file in the SQL catalog's table with plain SQL.
"""

from __future__ import annotations

import importlib
import json
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg


def run_config(
    db: Any, tmp_path: Path, slot: str, pub: str, sinks: list[dict[str, Any]]
) -> dict[str, Any]:
    """A walstream.yaml (as data) of one source `app` and these sinks, server off."""
    return {
        "server": {"enabled": False},
        "spark": {"checkpoint_dir": str(tmp_path / "ckpt")},
        "sources": [{"name": "app", "dsn": db.dsn, "slot": slot, "publication": pub}],
        "sinks": sinks,
    }


def duck() -> Any:
    """A DuckDB connection with the delta and iceberg extensions loaded from their wheels."""
    import duckdb

    con = duckdb.connect()
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    for name in ("avro", "iceberg", "delta"):
        module = importlib.import_module(f"duckdb_extension_{name}")
        (path,) = Path(module.__file__).parent.glob("extensions/*/*.duckdb_extension")
        con.execute(f"LOAD '{path}'")
    con.execute("SET TimeZone = 'UTC'")
    return con


def rows_of(con: Any, query: str, *params: Any) -> list[dict[str, Any]]:
    cur = con.execute(query, list(params))
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def delta_rows(path: str | Path) -> list[dict[str, Any]]:
    con = duck()
    try:
        return rows_of(con, "SELECT * FROM delta_scan(?)", str(path))
    finally:
        con.close()


def iceberg_metadata(state_dsn: str, identifier: str, schema: str = "walstream") -> str | None:
    """The current metadata file of an Iceberg table, from the SQL catalog's own table."""
    namespace, table = identifier.rsplit(".", 1)
    with psycopg.connect(state_dsn) as conn:
        row = conn.execute(
            f'SELECT metadata_location FROM "{schema}".iceberg_tables '
            "WHERE table_namespace = %s AND table_name = %s",
            (namespace, table),
        ).fetchone()
    return None if row is None else str(row[0])


def iceberg_rows(state_dsn: str, identifier: str) -> list[dict[str, Any]]:
    location = iceberg_metadata(state_dsn, identifier)
    assert location is not None, f"no Iceberg table {identifier} in the catalog"
    con = duck()
    try:
        return rows_of(con, "SELECT * FROM iceberg_scan(?)", location.removeprefix("file://"))
    finally:
        con.close()


def norm(v: Any) -> Any:
    """One spelling of a value for comparing Postgres rows with lake rows."""
    if isinstance(v, UUID):
        return str(v)
    if isinstance(v, datetime) and v.tzinfo is not None:
        return v.astimezone(UTC)
    if isinstance(v, memoryview):
        return bytes(v)
    if isinstance(v, Decimal):
        return v.normalize()
    if isinstance(v, list):
        return [norm(x) for x in v]
    if isinstance(v, dict):
        return json.dumps(v, sort_keys=True)
    return v


def normalised(
    rows: list[dict[str, Any]], json_columns: tuple[str, ...] = ()
) -> list[tuple[Any, ...]]:
    """Rows as sorted tuples of normalised values (JSON text columns parsed)."""
    out = []
    for r in rows:
        values = []
        for k in sorted(r):
            v = r[k]
            if k in json_columns and isinstance(v, str):
                v = json.loads(v)
            values.append((k, norm(v)))
        out.append(tuple(values))
    return sorted(out, key=repr)


def source_rows(dsn: str, table: str) -> list[dict[str, Any]]:
    with psycopg.connect(dsn) as conn:
        cur = conn.execute(f"SELECT * FROM {table}")
        names = [d.name for d in cur.description or ()]
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
