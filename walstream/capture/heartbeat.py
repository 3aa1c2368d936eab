"""Heartbeats: a transactional logical message when the slot has been quiet for a while, so it
keeps moving.

The prefix, `walstream:heartbeat`, is stable: other logical decoders on the database see
these messages too, and filter them by it (docs/production-postgres.md, "Heartbeats").
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

import psycopg

from walstream.capture.reader import HEARTBEAT_PREFIX
from walstream.periodic import Periodic
from walstream.postgres.replication import connect

log = logging.getLogger(__name__)


class Heartbeat:
    """Emits `walstream:heartbeat` through an ordinary connection every `interval` seconds in
    which no change arrived on the slot (`busy`).

    Its arrival on the slot proves the stream is live, and its transaction gives
    Spark an offset to commit on an idle database, so `confirmed_flush_lsn`
    advances while other databases on the server write WAL.
    """

    def __init__(
        self, dsn: str, slot: str, interval: float, busy: Callable[[], bool] | None = None
    ) -> None:
        self.dsn = dsn
        self.slot = slot
        self.interval = interval
        #: True while changes arrive on the slot: they move it and prove it live, so no
        #: heartbeat is written (other decoders on the database see fewer of them).
        self.busy = busy
        self.sent = 0
        self.skipped = 0
        self.conn: psycopg.Connection[Any] | None = None
        # A missed heartbeat is reported by the staleness check; the next one reconnects.
        self.task = Periodic(
            f"walstream-heartbeat-{slot}",
            self._beat,
            interval,
            first=0.0,
            level=logging.WARNING,
            what=f"heartbeat for slot {slot}",
            cleanup=self._close,
            logger=log,
        )

    def start(self) -> Heartbeat:
        self.task.start()
        return self

    def stop(self) -> None:
        self.task.stopping.set()  # the thread closes the connection on its way out

    def _beat(self) -> None:
        if self.busy is not None and self.busy():
            self.skipped += 1
            return
        try:
            if self.conn is None or self.conn.closed:
                self.conn = connect(self.dsn, autocommit=True, connect_timeout=10)
            body = json.dumps({"slot": self.slot, "at": time.time()})
            self.conn.execute(
                "SELECT pg_logical_emit_message(true, %s, %s)", (HEARTBEAT_PREFIX, body)
            )
            self.sent += 1
        except Exception:
            self._close()
            raise

    def _close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.close()
