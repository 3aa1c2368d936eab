"""Heartbeats: a transactional logical message every few seconds, so the slot keeps moving."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import psycopg

from walstream.periodic import Periodic
from walstream.postgres.capture import HEARTBEAT_PREFIX
from walstream.postgres.replication import connect

log = logging.getLogger(__name__)


class Heartbeat:
    """Emits `walstream:heartbeat` through an ordinary connection every `interval` seconds.

    Its arrival on the slot proves the stream is live, and its transaction gives
    Spark an offset to commit on an idle database, so `confirmed_flush_lsn`
    advances while other databases on the server write WAL.
    """

    def __init__(self, dsn: str, slot: str, interval: float) -> None:
        self.dsn = dsn
        self.slot = slot
        self.interval = interval
        self.sent = 0
        self.conn: psycopg.Connection[Any] | None = None
        # A missed heartbeat is reported by the staleness check; the next one reconnects.
        self.task = Periodic(
            f"walstream-heartbeat-{slot}", self._beat, interval, first=0.0,
            level=logging.WARNING, what=f"heartbeat for slot {slot}", cleanup=self._close, logger=log,
        )  # fmt: skip

    def start(self) -> Heartbeat:
        self.task.start()
        return self

    def stop(self) -> None:
        self.task.stopping.set()  # the thread closes the connection on its way out

    def _beat(self) -> None:
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
