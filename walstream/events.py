"""Event ingestion: producers POST events, walstream keeps them in an outbox table.

`POST /v1/events` inserts one row into `<state schema>.events` in the database of
`events.source`, in one statement, and answers 202 with the event's id. The table is
captured like any other: subscriptions are sinks with `event_types: [...]`, ordered
per `ordering_key` with `group_by: [ordering_key]`, with the retries, parking and
dead letters of every sink. A repeated `Idempotency-Key` returns the first event's id
and inserts nothing (as long as that event is kept: `events.retention`).
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from typing import Any

from psycopg import sql

from walstream.errors import SetupError

log = logging.getLogger(__name__)

_DDL = """
CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS {table} (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    event_type text NOT NULL CHECK (event_type <> ''),
    payload jsonb NOT NULL CHECK (jsonb_typeof(payload) = 'object'),
    ordering_key text,
    idempotency_key text UNIQUE,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS {index} ON {table} (created_at);
"""

_INSERT = """
WITH new AS (
    INSERT INTO {table} (event_type, payload, ordering_key, idempotency_key)
    VALUES (%s, %s::jsonb, %s, %s)
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING id
)
SELECT id::text, true FROM new
UNION ALL
SELECT id::text, false FROM {table} WHERE idempotency_key = %s AND NOT EXISTS (SELECT 1 FROM new)
"""


def ensure_outbox(dsn: str, schema: str, publication: str) -> None:
    """Create the outbox table when missing, and add it to an existing publication that
    lists its tables (a new one is created with it by the source's setup)."""
    from walstream.postgres.replication import connect

    table = sql.Identifier(schema, "events")
    try:
        with connect(dsn, autocommit=True) as conn:
            index = sql.Identifier("events_created_at_idx")
            conn.execute(
                sql.SQL(_DDL).format(schema=sql.Identifier(schema), table=table, index=index)
            )
            row = conn.execute(
                "SELECT puballtables, EXISTS (SELECT 1 FROM pg_publication_tables t WHERE "
                "t.pubname = p.pubname AND t.schemaname = %s AND t.tablename = 'events') "
                "FROM pg_publication p WHERE p.pubname = %s",
                (schema, publication),
            ).fetchone()
            if row is not None and not row[0] and not row[1]:
                conn.execute(
                    sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(
                        sql.Identifier(publication), table
                    )
                )
                log.warning(
                    "added the event outbox %s.events to publication %s", schema, publication
                )
    except SetupError:
        raise
    except Exception as exc:
        raise SetupError(
            f"cannot set up the event outbox {schema}.events: {exc}",
            "walstream needs CREATE on the database (or create the table as in "
            "walstream/events.py) and ownership of the publication to add it",
        ) from exc


@dataclass(frozen=True)
class Accepted:
    id: str
    duplicate: bool  # the idempotency key was seen: nothing was inserted


class Outbox:
    """Inserts events (one connection per server thread)."""

    def __init__(self, dsn: str, schema: str) -> None:
        self.dsn = dsn
        self.table = sql.Identifier(schema, "events")
        self._insert = sql.SQL(_INSERT).format(table=self.table)
        self._local = threading.local()

    def _conn(self) -> Any:
        from walstream.postgres.replication import connect

        conn = getattr(self._local, "conn", None)
        if conn is None or conn.closed:
            conn = self._local.conn = connect(self.dsn, autocommit=True)
        return conn

    def publish(
        self,
        event_type: str,
        payload: dict[str, Any],
        ordering_key: str | None = None,
        idempotency_key: str | None = None,
    ) -> Accepted:
        body = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
        params = (event_type, body, ordering_key, idempotency_key, idempotency_key)
        for attempt in (1, 2):
            try:
                rows = self._conn().execute(self._insert, params).fetchall()
                break
            except Exception:
                self._local.conn = None  # a dropped connection: once more on a new one
                if attempt == 2:
                    raise
        if not rows:
            # The same key committed by a concurrent request after this statement's
            # snapshot: it is there now.
            rows = (
                self._conn()
                .execute(
                    sql.SQL("SELECT id::text, false FROM {} WHERE idempotency_key = %s").format(
                        self.table
                    ),
                    (idempotency_key,),
                )
                .fetchall()
            )
        (id_, inserted), *_ = rows
        return Accepted(str(id_), not inserted)

    def expire(self, seconds: float) -> int:
        """Delete events older than `seconds` (their idempotency keys go with them)."""
        cur = self._conn().execute(
            sql.SQL("DELETE FROM {} WHERE created_at < now() - make_interval(secs => %s)").format(
                self.table
            ),
            (seconds,),
        )
        return cur.rowcount or 0
