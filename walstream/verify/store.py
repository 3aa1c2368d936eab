"""Verifications in the state database: one row each, with its results table by table and
where the table being compared has got to, so that one cut short (kill -9, Ctrl-C, a
stopping `walstream run`) resumes where it was, and the last result of each sink is there
for `/health`, `/metrics` and the console (docs/verify.md, "Scheduled, resumed, cancelled").

A verification is `running` while a process owns it (`owner`: host and pid, and a
heartbeat); `done` once every table was compared (equal or not), `failed` when it could
not compare (`error` says why), `cancelled` when asked. A running one whose owner is gone
(its pid no longer lives on this host, it let go of it, or its heartbeat is older than
`STALE_SECONDS`) is taken over by the next verification of the same sink.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import sql
from psycopg.types.json import Jsonb

from walstream.errors import ConfigError
from walstream.state import Store

#: A running verification whose heartbeat is older than this (and whose owner cannot be
#: seen from here) is taken to be dead.
STALE_SECONDS = 120.0
RUNNING, DONE, FAILED, CANCELLED = "running", "done", "failed", "cancelled"

_COLUMNS = """id, sink, tables, "where", trigger, status, owner, started_at, finished_at,
    heartbeat_at, error, results, progress, rows_different"""


@dataclass
class Record:
    """One verification as the state database has it."""

    id: int
    sink: str
    tables: list[str]  # asked for (empty: every table of the sink)
    where: str | None
    trigger: str  # "command" or "schedule"
    status: str
    owner: str | None
    started_at: datetime
    finished_at: datetime | None
    heartbeat_at: datetime | None
    error: str | None
    results: list[dict[str, Any]]  # one per table compared, in order (`TableResult.as_json`)
    progress: dict[str, Any] | None  # where the table being compared has got to
    rows_different: int

    def as_json(self) -> dict[str, Any]:
        """For the API and the console: what it found, no row values (there are none)."""
        return {
            "id": self.id,
            "trigger": self.trigger,
            "status": self.status,
            "started_at": self.started_at.isoformat(),
            "finished_at": self.finished_at.isoformat() if self.finished_at else None,
            "error": self.error,
            "rows_different": self.rows_different,
            "tables_compared": len(self.results),
            "tables_different": [r["table"] for r in self.results if not r.get("equal")],
            "comparing": (self.progress or {}).get("table") if self.status == RUNNING else None,
        }


def me() -> str:
    """This process as an owner: host and pid."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _gone(owner: str | None) -> bool:
    """Whether `owner` is known not to run: released, or a pid this host does not have."""
    if owner is None:
        return True
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False  # another host's: only its heartbeat tells
    if int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # it lives, as another user
    return False


class Cancelled(Exception):
    """The verification was cancelled (`walstream verify SINK --cancel`)."""


class VerificationStore(Store):
    """The `verifications` table of a state schema."""

    def _setup(self) -> None:
        self.table = self.ident("verifications")

    def _run(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        return self._exec(sql.SQL(query).format(t=self.table), params)

    def ddl(self) -> list[sql.Composable]:
        return [
            sql.SQL(
                """CREATE TABLE IF NOT EXISTS {} (
                 id bigserial PRIMARY KEY, sink text NOT NULL,
                 tables text[] NOT NULL DEFAULT '{{}}', "where" text,
                 trigger text NOT NULL CHECK (trigger IN ('command', 'schedule')),
                 status text NOT NULL DEFAULT 'running'
                   CHECK (status IN ('running', 'done', 'failed', 'cancelled')),
                 owner text, started_at timestamptz NOT NULL DEFAULT now(),
                 finished_at timestamptz, heartbeat_at timestamptz DEFAULT now(), error text,
                 results jsonb NOT NULL DEFAULT '[]', progress jsonb,
                 rows_different bigint NOT NULL DEFAULT 0)"""
            ).format(self.table),
            sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (sink, id)").format(
                sql.Identifier("verifications_sink"), self.table
            ),
        ]

    def _select(self, where: str, params: Any, tail: str = "") -> list[Record]:
        rows = self._run(f"SELECT {_COLUMNS} FROM {{t}} WHERE {where} ORDER BY id {tail}", params)
        return [Record(*r) for r in rows]

    def get(self, id_: int) -> Record | None:
        found = self._select("id = %s", (id_,))
        return found[0] if found else None

    def running(self, sink: str) -> Record | None:
        found = self._select("sink = %s AND status = 'running'", (sink,))
        return found[-1] if found else None

    def begin(self, sink: str, tables: list[str], where: str | None, trigger: str) -> Record:
        """A verification of `sink` owned by this process: the one cut short if there is one
        (asked the same), else a new one. One already running elsewhere is a ConfigError."""
        with self.transaction():
            # one begin per sink at a time: two processes never both take the same one over
            self._run("SELECT pg_advisory_xact_lock(hashtext('walstream-verify:' || %s))", (sink,))
            found = self.running(sink)
            if found is not None and not self.dead(found):
                raise ConfigError(
                    f"verification {found.id} of sink {sink} is running ({found.trigger}, "
                    f"in {found.owner}, since {found.started_at:%Y-%m-%d %H:%M:%S %Z})",
                    f"wait for it, or cancel it: walstream verify {sink} --cancel",
                )
            if found is not None and found.tables == tables and found.where == where:
                self._run(
                    "UPDATE {t} SET owner = %s, heartbeat_at = now() WHERE id = %s",
                    (me(), found.id),
                )
                found.owner = me()
                return found
            if found is not None:
                self.finish(found.id, FAILED, "cut short, and replaced by one asked otherwise")
            rows = self._run(
                'INSERT INTO {t} (sink, tables, "where", trigger, owner) '
                "VALUES (%s, %s, %s, %s, %s) RETURNING id",
                (sink, tables, where, trigger, me()),
            )
        record = self.get(int(rows[0][0]))
        assert record is not None
        return record

    def dead(self, record: Record) -> bool:
        """Whether a running verification's owner is gone (see the module docstring)."""
        if _gone(record.owner):
            return True
        age = self._run(
            "SELECT extract(epoch FROM now() - heartbeat_at) FROM {t} WHERE id = %s", (record.id,)
        )
        return bool(age) and age[0][0] is not None and float(age[0][0]) > STALE_SECONDS

    def beat(self, id_: int, progress: dict[str, Any] | None) -> None:
        """The heartbeat, with where the comparison has got to: Cancelled if it was."""
        rows = self._run(
            "UPDATE {t} SET heartbeat_at = now(), progress = %s "
            "WHERE id = %s AND status = 'running' RETURNING id",
            (Jsonb(progress) if progress is not None else None, id_),
        )
        if not rows:
            raise Cancelled(f"verification {id_} was cancelled")

    def table_done(self, id_: int, result: dict[str, Any], different: int) -> None:
        """One table compared: its result kept, the progress cleared."""
        self._run(
            "UPDATE {t} SET results = results || %s, progress = NULL, heartbeat_at = now(), "
            "rows_different = rows_different + %s WHERE id = %s",
            (Jsonb([result]), different, id_),
        )

    def release(self, id_: int, progress: dict[str, Any] | None) -> None:
        """Let go of a running verification (stopped, interrupted): the next one resumes it."""
        self._run(
            "UPDATE {t} SET owner = NULL, progress = coalesce(%s, progress) "
            "WHERE id = %s AND status = 'running'",
            (Jsonb(progress) if progress is not None else None, id_),
        )

    def finish(self, id_: int, status: str, error: str | None = None) -> None:
        self._run(
            "UPDATE {t} SET status = %s, error = %s, finished_at = now(), owner = NULL, "
            "progress = NULL WHERE id = %s AND status = 'running'",
            (status, error, id_),
        )

    def cancel(self, sink: str) -> list[int]:
        rows = self._run(
            "UPDATE {t} SET status = 'cancelled', finished_at = now() "
            "WHERE sink = %s AND status = 'running' RETURNING id",
            (sink,),
        )
        return sorted(int(r[0]) for r in rows)

    def latest(self) -> dict[str, tuple[Record, Record | None]]:
        """Per sink, its newest verification (any status) and its newest done one."""
        rows = self._run(
            f"""(SELECT DISTINCT ON (sink) false, {_COLUMNS} FROM {{t}} ORDER BY sink, id DESC)
                UNION ALL
                (SELECT DISTINCT ON (sink) true, {_COLUMNS} FROM {{t}} WHERE status = 'done'
                 ORDER BY sink, id DESC)""",
            None,
        )
        newest: dict[str, Record] = {}
        done: dict[str, Record] = {}
        for r in rows:
            record = Record(*r[1:])
            (done if r[0] else newest)[record.sink] = record
        return {k: (v, done.get(k)) for k, v in newest.items()}

    def last_finished(self, sink: str) -> Record | None:
        """The newest finished verification of `sink`."""
        found = self._select("sink = %s AND status <> 'running'", (sink,), "DESC LIMIT 1")
        return found[0] if found else None
