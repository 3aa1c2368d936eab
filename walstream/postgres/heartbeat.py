"""Heartbeats: a transactional logical message every few seconds, so the slot keeps moving."""

from __future__ import annotations

import json
import logging
import threading
import time

import psycopg

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
        self._stop = threading.Event()
        self.thread = threading.Thread(
            target=self._run, name=f"walstream-heartbeat-{slot}", daemon=True
        )

    def start(self) -> Heartbeat:
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        conn: psycopg.Connection | None = None
        while not self._stop.wait(0 if self.sent == 0 else self.interval):
            try:
                if conn is None or conn.closed:
                    conn = connect(self.dsn, autocommit=True, connect_timeout=10)
                body = json.dumps({"slot": self.slot, "at": time.time()})
                conn.execute(
                    "SELECT pg_logical_emit_message(true, %s, %s)", (HEARTBEAT_PREFIX, body)
                )
                self.sent += 1
            except Exception as exc:  # a missed heartbeat is reported by the staleness check
                log.warning("heartbeat for slot %s failed: %s", self.slot, exc)
                if conn is not None:
                    conn.close()
                conn = None
        if conn is not None:
            conn.close()
