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
from dataclasses import dataclass
from typing import Any

from psycopg import sql

from walstream.errors import SetupError
from walstream.state.store import Store

log = logging.getLogger(__name__)

_DDL = """
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
    outbox = Outbox(dsn, schema)
    try:
        outbox.ensure()
        row = outbox._exec(
            sql.SQL(
                "SELECT puballtables, EXISTS (SELECT 1 FROM pg_publication_tables t WHERE "
                "t.pubname = p.pubname AND t.schemaname = %s AND t.tablename = 'events') "
                "FROM pg_publication p WHERE p.pubname = %s"
            ),
            (schema, publication),
        )
        if row and not row[0][0] and not row[0][1]:
            outbox._exec(
                sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(
                    sql.Identifier(publication), outbox.table
                )
            )
            log.warning("added the event outbox %s.events to publication %s", schema, publication)
    except SetupError:
        raise
    except Exception as exc:
        raise SetupError(
            f"cannot set up the event outbox {schema}.events: {exc}",
            "walstream needs CREATE on the database (or create the table as in "
            "walstream/state/outbox.py) and ownership of the publication to add it",
        ) from exc


@dataclass(frozen=True)
class Accepted:
    id: str
    duplicate: bool  # the idempotency key was seen: nothing was inserted


class Outbox(Store):
    """`<schema>.events` in the events source's database: inserts (the server), expiry."""

    def _setup(self) -> None:
        self.table = self.ident("events")
        self._insert = sql.SQL(_INSERT).format(table=self.table)

    def ddl(self) -> list[sql.Composable]:
        index = sql.Identifier("events_created_at_idx")
        return [sql.SQL(_DDL).format(table=self.table, index=index)]

    def publish(
        self,
        event_type: str,
        payload: dict[str, Any],
        ordering_key: str | None = None,
        idempotency_key: str | None = None,
    ) -> Accepted:
        body = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
        params = (event_type, body, ordering_key, idempotency_key, idempotency_key)
        rows = self._exec(self._insert, params)
        if not rows:
            # The same key committed by a concurrent request after this statement's
            # snapshot: it is there now.
            rows = self._exec(
                sql.SQL("SELECT id::text, false FROM {} WHERE idempotency_key = %s").format(
                    self.table
                ),
                (idempotency_key,),
            )
        (id_, inserted), *_ = rows
        return Accepted(str(id_), not inserted)

    def expire(self, seconds: float) -> int:
        """Delete events older than `seconds` (their idempotency keys go with them)."""
        rows = self._exec(
            sql.SQL(
                "WITH gone AS (DELETE FROM {} WHERE created_at < now() - make_interval(secs => %s) "
                "RETURNING 1) SELECT count(*) FROM gone"
            ).format(self.table),
            (seconds,),
        )
        return int(rows[0][0])
