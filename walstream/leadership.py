"""High availability: one leader per source, any number of hot standbys.

Each source's pipeline holds a session-level Postgres advisory lock on the source
database while it streams. The key is 64 bits of SHA-256 over the pipeline's name
(source and slot): two pipelines collide only by a 2^-64 chance, not a 32-bit
hash's. A second `walstream run` with the same config finds the lock taken and
waits as a standby, trying again every second; when the leader dies its
connections close, Postgres releases the lock, and the standby starts the query
from the shared checkpoint within seconds.

A leader checks its lock connection on every supervision tick. If that connection
is gone, the lock may be someone else's already: the leader stops the source's
query at once and becomes a standby. The replication slot admits one reader at a
time, so even then two processes never read the slot together.

The lock needs a direct session to Postgres: a pooler in transaction mode
(pgbouncer) would hand the lock's session to others.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import struct
from typing import Any

log = logging.getLogger(__name__)


def lock_key(source: str, slot: str) -> int:
    """The advisory lock key of a pipeline: a signed 64-bit integer."""
    digest = hashlib.sha256(f"walstream pipeline {source} {slot}".encode()).digest()
    return int(struct.unpack(">q", digest[:8])[0])


class Leadership:
    """The advisory lock of one source's pipeline, on its own connection."""

    def __init__(self, dsn: str, source: str, slot: str) -> None:
        self.dsn = dsn
        self.source = source
        self.key = lock_key(source, slot)
        self._conn: Any = None
        self.held = False

    def try_acquire(self) -> bool:
        """Take the lock if it is free; False when another session holds it (or the database
        cannot be reached now: the caller tries again)."""
        if self.held:
            return True
        from walstream.postgres.replication import connect

        try:
            if self._conn is None or self._conn.closed:
                self._conn = connect(
                    self.dsn, autocommit=True, application_name=f"walstream lock {self.source}"
                )
            row = self._conn.execute("SELECT pg_try_advisory_lock(%s)", (self.key,)).fetchone()
        except Exception as exc:
            log.debug("source %s: lock: %s", self.source, exc)
            self._close()
            return False
        self.held = bool(row and row[0])
        return self.held

    def holds(self) -> bool:
        """Still the leader: the lock's session is alive (checked with a round trip)."""
        if not self.held:
            return False
        try:
            self._conn.execute("SELECT 1")
            return True
        except Exception as exc:
            log.error(
                "source %s: the connection holding its leader lock is gone (%s)", self.source, exc
            )
            self.held = False
            self._close()
            return False

    def release(self) -> None:
        if self.held and self._conn is not None:
            try:
                self._conn.execute("SELECT pg_advisory_unlock(%s)", (self.key,))
            except Exception as exc:  # the session is gone: so is the lock
                log.debug("source %s: unlock: %s", self.source, exc)
        self.held = False
        self._close()

    def _close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):  # closing a broken connection
                self._conn.close()
            self._conn = None
