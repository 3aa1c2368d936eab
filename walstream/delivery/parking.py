"""Parked messages and dead letters: what a sink could not deliver, kept in the state database.

A message a sink fails to deliver after the inline retries is *parked*: it is
stored with its error, attempt count and next attempt time, and its group is
*blocked*. Every later message of a blocked group is parked behind it (no error,
no schedule of its own), so the group's order holds while other groups flow. The
batch then completes and the slot moves on: the parked rows are durable before
the ledger records the chunk, in the same transaction.

A retrier (walstream run's driver) re-delivers each blocked group from its head
when the head's next attempt is due, with exponential backoff and jitter. When
the head succeeds, it and the messages behind it are delivered in order and
deleted; the group unblocks when none is left. When the head fails
`max_attempts` times, or once with a non-retryable error, it and every message
parked behind it become *dead letters*. Dead letters do not block: later
messages of that group flow again (an operator may retry a dead letter, which
then arrives after them).

Rows carry the formatted message (value, key, route), so a retry needs neither
Spark nor the change: the exact bytes the sink refused are what is resent.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from psycopg import sql

from walstream.sinks.base import Message
from walstream.state import Store

PARKED, DEAD = "parked", "dead"


@dataclass(frozen=True)
class Parked:
    """One stored message (parked or dead)."""

    id: int
    sink: str
    group: str
    lsn: int
    seq: int
    tombstone: bool
    status: str
    attempts: int
    next_attempt_at: datetime | None
    errors: list[dict[str, Any]]
    message: Message
    created_at: datetime
    #: The value is the Python transform's input (the transform raised on it): a retry
    #: applies the sink's transform again before sending.
    untransformed: bool = False

    @property
    def cursor(self) -> tuple[int, int]:
        return (self.lsn, self.seq)


_COLUMNS = (
    "id, sink, group_key, lsn, seq, tombstone, status, attempts, next_attempt_at, errors, "
    "key, value, route, table_name, action, created_at, untransformed, ikey, part"
)


def _row(r: Sequence[Any]) -> Parked:
    (
        id_,
        sink,
        group,
        lsn,
        seq,
        tomb,
        status,
        attempts,
        next_at,
        errors,
        key,
        value,
        route,
        table,
        action,
        created,
        untransformed,
        ikey,
        part,
    ) = r
    msg = Message(
        lsn,
        seq,
        None if tomb or value is None else bytes(value),
        bytes(key) if key is not None else None,
        route,
        table=table,
        action=action,
        group=group,
        idempotency_override=ikey,
        part=part,
    )
    return Parked(
        id_,
        sink,
        group,
        lsn,
        seq,
        tomb,
        status,
        attempts,
        next_at,
        errors,
        msg,
        created,
        untransformed,
    )


class ParkingLot(Store):
    """Access to `parked_messages` (and `sink_state`) in the state database; picklable."""

    def _setup(self) -> None:
        self.table = self.ident("parked_messages")
        self.state = self.ident("sink_state")

    def ddl(self) -> list[sql.Composable]:
        return [
            sql.SQL(
                """CREATE TABLE IF NOT EXISTS {} (
                     id bigserial PRIMARY KEY,
                     sink text NOT NULL, group_key text NOT NULL,
                     lsn bigint NOT NULL, seq int NOT NULL, tombstone boolean NOT NULL,
                     status text NOT NULL CHECK (status IN ('parked', 'dead')),
                     attempts int NOT NULL DEFAULT 0,
                     next_attempt_at timestamptz,
                     errors jsonb NOT NULL DEFAULT '[]',
                     key bytea, value bytea, route text,
                     table_name text NOT NULL, action text NOT NULL,
                     sink_config jsonb, untransformed boolean NOT NULL DEFAULT false,
                     created_at timestamptz NOT NULL DEFAULT now(),
                     updated_at timestamptz NOT NULL DEFAULT now(),
                     part smallint NOT NULL DEFAULT 0)"""
            ).format(self.table),
            sql.SQL(
                "CREATE INDEX IF NOT EXISTS {} ON {} (sink, status, group_key, lsn, seq)"
            ).format(sql.Identifier("parked_messages_group"), self.table),
            sql.SQL(
                """CREATE TABLE IF NOT EXISTS {} (
                     sink text PRIMARY KEY, paused boolean NOT NULL DEFAULT false,
                     reason text, skip_before bigint,
                     updated_at timestamptz NOT NULL DEFAULT now())"""
            ).format(self.state),
            # tables made before backfills: their rows' idempotency key
            sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS ikey text").format(self.table),
            # tables made before `walstream reset` existed
            sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS skip_before bigint").format(
                self.state
            ),
            # tables made before a change could be several records (`Message.part`): a
            # tombstone was the one after its delete; the key was (sink, lsn, seq, tombstone)
            sql.SQL(
                "ALTER TABLE {} ADD COLUMN IF NOT EXISTS part smallint NOT NULL DEFAULT 0"
            ).format(self.table),
            sql.SQL("UPDATE {} SET part = 1 WHERE tombstone AND part = 0").format(self.table),
            sql.SQL("CREATE UNIQUE INDEX IF NOT EXISTS {} ON {} (sink, lsn, seq, part)").format(
                sql.Identifier("parked_messages_part"), self.table
            ),
            sql.SQL("ALTER TABLE {} DROP CONSTRAINT IF EXISTS {}").format(
                self.table, sql.Identifier("parked_messages_sink_lsn_seq_tombstone_key")
            ),
        ]

    # -- executors: parking ---------------------------------------------------------------
    def blocked(self, sink: str) -> tuple[set[str], int]:
        """The sink's blocked groups and how many messages are parked."""
        rows = self._exec(
            sql.SQL(
                "SELECT group_key, count(*) FROM {} WHERE sink = %s AND status = 'parked' "
                "GROUP BY group_key"
            ).format(self.table),
            (sink,),
        )
        return {r[0] for r in rows}, sum(int(r[1]) for r in rows)

    def park(
        self,
        sink: str,
        entries: Iterable[tuple[Message, str, str | None, int, float | None]],
        sink_config: dict[str, Any] | None = None,
    ) -> None:
        """Store (message, status, error, attempts, next attempt in seconds) rows.

        Idempotent: a replayed batch parks the same cursor once. Call inside the
        transaction that also records the chunk in the ledger.
        """
        now = datetime.now(UTC)
        rows = []
        for m, status, error, attempts, delay in entries:
            errors = [{"at": now.isoformat(), "error": error}] if error else []
            rows.append(
                (
                    sink,
                    m.group,
                    m.lsn,
                    m.seq,
                    m.value is None,
                    status,
                    attempts,
                    now + timedelta(seconds=delay) if delay is not None else None,
                    json.dumps(errors),
                    m.key,
                    m.value,
                    m.route,
                    m.table,
                    m.action,
                    json.dumps(sink_config) if status == DEAD and sink_config else None,
                    m.error is not None,
                    m.idempotency_override,
                    m.part,
                )
            )
        if not rows:
            return
        with self._conn().cursor() as cur:
            cur.executemany(
                sql.SQL(
                    """INSERT INTO {} (sink, group_key, lsn, seq, tombstone, status, attempts,
                         next_attempt_at, errors, key, value, route, table_name, action, sink_config,
                         untransformed, ikey, part)
                       VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s,
                               %s)
                       ON CONFLICT (sink, lsn, seq, part) DO NOTHING"""
                ).format(self.table),
                rows,
            )

    # -- driver: the retrier ---------------------------------------------------------------
    def due_groups(self, sink: str, limit: int = 100) -> list[str]:
        """Blocked groups whose head (oldest parked message) is due for an attempt."""
        rows = self._exec(
            sql.SQL(
                """SELECT group_key FROM (
                     SELECT DISTINCT ON (group_key) group_key, next_attempt_at FROM {}
                     WHERE sink = %s AND status = 'parked' ORDER BY group_key, lsn, seq, part
                   ) heads WHERE next_attempt_at IS NULL OR next_attempt_at <= now()
                   ORDER BY next_attempt_at NULLS FIRST LIMIT %s"""
            ).format(self.table),
            (sink, limit),
        )
        return [r[0] for r in rows]

    def group(self, sink: str, group: str, status: str = PARKED, limit: int = 1000) -> list[Parked]:
        rows = self._exec(
            sql.SQL(
                f"SELECT {_COLUMNS} FROM {{}} WHERE sink = %s AND group_key = %s AND status = %s "
                "ORDER BY lsn, seq, part LIMIT %s"
            ).format(self.table),
            (sink, group, status, limit),
        )
        return [_row(r) for r in rows]

    def delivered(self, ids: Sequence[int]) -> None:
        if ids:
            self._exec(
                sql.SQL("DELETE FROM {} WHERE id = ANY(%s)").format(self.table), (list(ids),)
            )

    def failed(
        self,
        head: Parked,
        error: str,
        *,
        dead: bool,
        delay: float,
        sink_config: dict[str, Any] | None = None,
    ) -> None:
        """Record a failed attempt of a group's head; `dead`: the head and its group die."""
        entry = json.dumps([{"at": datetime.now(UTC).isoformat(), "error": error}])
        with self._conn().transaction():
            self._exec(
                sql.SQL(
                    "UPDATE {} SET attempts = attempts + 1, errors = errors || %s::jsonb, "
                    "next_attempt_at = now() + make_interval(secs => %s), updated_at = now() "
                    "WHERE id = %s"
                ).format(self.table),
                (entry, delay, head.id),
            )
            if dead:
                # The messages behind the head die with it; each says why (no error of its own).
                behind = json.dumps(
                    [
                        {
                            "at": datetime.now(UTC).isoformat(),
                            "error": f"dead with its group: message {head.id} before it failed: {error}",
                        }
                    ]
                )
                self._exec(
                    sql.SQL(
                        "UPDATE {} SET status = 'dead', next_attempt_at = NULL, updated_at = now(), "
                        "sink_config = %s, errors = CASE WHEN id = %s THEN errors "
                        "ELSE errors || %s::jsonb END "
                        "WHERE sink = %s AND group_key = %s AND status = 'parked'"
                    ).format(self.table),
                    (
                        json.dumps(sink_config) if sink_config else None,
                        head.id,
                        behind,
                        head.sink,
                        head.group,
                    ),
                )

    def parked_counts(self, sinks: list[str]) -> dict[str, int]:
        """{sink: parked messages} for these sinks: an index range per sink, so dead letters
        piling up (they stay until discarded) do not slow the check made before every batch."""
        rows = self._exec(
            sql.SQL(
                "SELECT sink, count(*) FROM {} WHERE sink = ANY(%s) AND status = 'parked' "
                "GROUP BY sink"
            ).format(self.table),
            (list(sinks),),
        )
        return {sink: int(n) for sink, n in rows}

    def counts(self) -> dict[str, dict[str, int]]:
        """{sink: {"parked": n, "dead": n}}."""
        rows = self._exec(
            sql.SQL("SELECT sink, status, count(*) FROM {} GROUP BY sink, status").format(
                self.table
            )
        )
        out: dict[str, dict[str, int]] = {}
        for sink, status, n in rows:
            out.setdefault(sink, {PARKED: 0, DEAD: 0})[status] = int(n)
        return out

    # -- operators --------------------------------------------------------------------------
    def list(
        self,
        status: str,
        sink: str | None = None,
        group: str | None = None,
        limit: int = 100,
    ) -> list[Parked]:
        rows = self._exec(
            sql.SQL(
                f"SELECT {_COLUMNS} FROM {{}} WHERE status = %s "
                "AND (%s::text IS NULL OR sink = %s) AND (%s::text IS NULL OR group_key = %s) "
                "ORDER BY sink, lsn, seq, part LIMIT %s"
            ).format(self.table),
            (status, sink, sink, group, group, limit),
        )
        return [_row(r) for r in rows]

    def get(self, id_: int) -> Parked | None:
        rows = self._exec(
            sql.SQL(f"SELECT {_COLUMNS} FROM {{}} WHERE id = %s").format(self.table), (id_,)
        )
        return _row(rows[0]) if rows else None

    def sink_config(self, id_: int) -> dict[str, Any] | None:
        rows = self._exec(
            sql.SQL("SELECT sink_config FROM {} WHERE id = %s").format(self.table), (id_,)
        )
        return rows[0][0] if rows else None

    def _select(
        self, ids: Sequence[int] | None, sink: str | None, group: str | None
    ) -> tuple[sql.SQL, tuple[Any, ...]]:
        return (
            sql.SQL(
                "status = 'dead' AND (%s::bigint[] IS NULL OR id = ANY(%s)) "
                "AND (%s::text IS NULL OR sink = %s) AND (%s::text IS NULL OR group_key = %s)"
            ),
            (list(ids) if ids else None, list(ids) if ids else None, sink, sink, group, group),
        )

    def retry_dead(
        self, ids: Sequence[int] | None = None, sink: str | None = None, group: str | None = None
    ) -> int:
        """Dead letters back to parked, due now (the retrier delivers them in order)."""
        where, params = self._select(ids, sink, group)
        rows = self._exec(
            sql.SQL(
                "UPDATE {} SET status = 'parked', attempts = 0, next_attempt_at = now(), "
                "updated_at = now() WHERE {} RETURNING id"
            ).format(self.table, where),
            params,
        )
        return len(rows)

    def discard_dead(
        self, ids: Sequence[int] | None = None, sink: str | None = None, group: str | None = None
    ) -> int:
        where, params = self._select(ids, sink, group)
        rows = self._exec(
            sql.SQL("DELETE FROM {} WHERE {} RETURNING id").format(self.table, where), params
        )
        return len(rows)

    # -- pause / resume -----------------------------------------------------------------------
    def set_paused(self, sink: str, paused: bool, reason: str | None = None) -> None:
        self._exec(
            sql.SQL(
                """INSERT INTO {} (sink, paused, reason) VALUES (%s, %s, %s)
                   ON CONFLICT (sink) DO UPDATE SET paused = EXCLUDED.paused,
                     reason = EXCLUDED.reason, updated_at = now()"""
            ).format(self.state),
            (sink, paused, reason),
        )

    def paused(self) -> dict[str, str | None]:
        """{sink: reason} of the paused sinks."""
        rows = self._exec(sql.SQL("SELECT sink, reason FROM {} WHERE paused").format(self.state))
        return {r[0]: r[1] for r in rows}

    def states(self) -> tuple[dict[str, str | None], dict[str, int]]:
        """({sink: reason} of paused sinks, {sink: LSN before which its changes are skipped})."""
        rows = self._exec(
            sql.SQL(
                "SELECT sink, paused, reason, skip_before FROM {} WHERE paused OR skip_before IS NOT NULL"
            ).format(self.state)
        )
        return (
            {r[0]: r[2] for r in rows if r[1]},
            {r[0]: int(r[3]) for r in rows if r[3] is not None},
        )

    def reset(self, sink: str, lsn: int) -> tuple[int, int]:
        """The sink skips every change committed before `lsn`; its parked messages and dead
        letters before it are discarded. Returns (parked, dead) discarded."""
        with self.transaction():
            self._exec(
                sql.SQL(
                    """INSERT INTO {} (sink, skip_before) VALUES (%s, %s)
                       ON CONFLICT (sink) DO UPDATE SET skip_before = EXCLUDED.skip_before,
                         updated_at = now()"""
                ).format(self.state),
                (sink, lsn),
            )
            rows = self._exec(
                sql.SQL("DELETE FROM {} WHERE sink = %s AND lsn < %s RETURNING status").format(
                    self.table
                ),
                (sink, lsn),
            )
        return sum(r[0] == PARKED for r in rows), sum(r[0] == DEAD for r in rows)
