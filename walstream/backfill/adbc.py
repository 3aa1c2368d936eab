"""Postgres rows as Arrow through ADBC (`adbc-driver-postgresql`): libpq and a C decoder of
`COPY ... TO STDOUT (FORMAT binary)`, no Python step per row. Backfills read their chunks
with it (`backfill/read.py`, `backfill/arrow_read.py`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from psycopg import sql

from walstream.decode.types import SESSION_SETTINGS
from walstream.errors import ConnectionFailed
from walstream.postgres.replication import safe_dsn


def connect(dsn: str) -> Any:
    """An ADBC connection with the decoder's session settings (TimeZone UTC, ISO styles)."""
    import adbc_driver_postgresql.dbapi

    try:
        conn = adbc_driver_postgresql.dbapi.connect(_uri(dsn))
    except Exception as exc:  # the driver's own error type; its text names no password
        raise ConnectionFailed(
            f"cannot connect to PostgreSQL at {safe_dsn(dsn)} to read rows as Arrow: "
            f"{str(exc).strip().splitlines()[0]}",
            "check that the server runs and that host, port, user, password and database in "
            "the DSN are right",
        ) from None
    with conn.cursor() as cur:
        for name, value in SESSION_SETTINGS.items():
            cur.execute(f"SET {name} = '{value}'")  # constants of walstream, not input
    conn.commit()  # the settings outlive the transaction they were made in
    return conn


def _uri(dsn: str) -> str:
    """A libpq URI for any DSN form (ADBC takes URIs only)."""
    from urllib.parse import quote, urlencode

    from psycopg.conninfo import conninfo_to_dict

    if dsn.startswith(("postgresql://", "postgres://")):
        return dsn
    params = {k: str(v) for k, v in conninfo_to_dict(dsn).items()}
    user, password = params.pop("user", ""), params.pop("password", None)
    auth = quote(user, safe="") + (":" + quote(password, safe="") if password else "")
    host, port = params.pop("host", "localhost"), params.pop("port", None)
    where = f"{host}:{port}" if port else host
    db = quote(params.pop("dbname", ""), safe="")
    query = f"?{urlencode(params)}" if params else ""
    return f"postgresql://{auth + '@' if auth else ''}{where}/{db}{query}"


def fetch_batches(
    conn: Any, query: sql.Composed | str, params: Sequence[Any] = ()
) -> Iterator[Any]:
    """The query's rows as Arrow record batches, read in a READ ONLY transaction (a
    backfill's predicate cannot write)."""
    text = query if isinstance(query, str) else query.as_string(None)
    try:
        with conn.cursor() as cur:
            cur.execute("SET TRANSACTION READ ONLY")
            cur.execute(text, parameters=tuple(params) or None)
            yield from cur.fetch_record_batch()
    finally:
        conn.rollback()
