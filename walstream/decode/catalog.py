"""What the decoder needs from the catalog: primary keys and user-defined types."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from walstream.decode.types import TypeRegistry, load_types

_PK_QUERY = """
SELECT n.nspname, c.relname,
       array_agg(a.attname::text ORDER BY array_position(i.indkey::int2[], a.attnum))
FROM pg_index i
JOIN pg_class c ON c.oid = i.indrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
WHERE i.indisprimary AND n.nspname NOT IN ('pg_catalog', 'information_schema')
GROUP BY n.nspname, c.relname
"""

_COLUMN_TYPES = """
SELECT DISTINCT a.atttypid::int8
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE a.attnum > 0 AND NOT a.attisdropped AND c.relkind IN ('r', 'p')
  AND n.nspname NOT IN ('pg_catalog', 'information_schema')
"""


@dataclass(frozen=True, slots=True)
class DecoderMetadata:
    types: TypeRegistry
    primary_keys: dict[tuple[str, str], list[str]]


def primary_keys(conn: Any) -> dict[tuple[str, str], list[str]]:
    return {(s, t): list(cols) for s, t, cols in conn.execute(_PK_QUERY).fetchall()}


def load_metadata(conn: Any) -> DecoderMetadata:
    """Primary keys of every user table and every user type their columns use.

    `conn` is a psycopg 3 connection. Cheap enough to reload when a Relation
    message names a table or type not seen before.
    """
    oids = [r[0] for r in conn.execute(_COLUMN_TYPES).fetchall()]
    return DecoderMetadata(TypeRegistry(load_types(conn, oids)), primary_keys(conn))
