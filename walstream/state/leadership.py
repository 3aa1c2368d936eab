"""High availability: one leader per source, any number of hot standbys.

A source's pipeline leads while it holds `LOCK TABLE <state>.leader_<source> IN
EXCLUSIVE MODE NOWAIT` in a transaction kept open on a dedicated connection. Only the
table's owner (walstream's role) can take that lock, so no other role can keep
walstream from leading (an advisory lock's key would let it); the transaction writes
nothing and holds no snapshot, so it takes no transaction id and holds back no vacuum.

A second `walstream run` finds the lock taken and stands by, trying every second; when
the leader dies Postgres releases the lock and the standby starts the query from the
shared checkpoint. A leader that finds its lock connection gone stops its query at
once and stands by. The slot admits one reader at a time, so two processes never read
it together. The lock needs a direct session (not a pooler in transaction mode).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from typing import Any

from psycopg import sql

from walstream.errors import ConfigError

log = logging.getLogger(__name__)


def lock_table(source: str) -> str:
    """The name of a source's leader table (within Postgres's 63-byte identifiers)."""
    name = f"leader_{source}"
    if len(name.encode()) <= 63:
        return name
    return f"leader_{source[:40]}_{hashlib.sha256(source.encode()).hexdigest()[:12]}"


class Leadership:
    """The leader lock of one source's pipeline, on its own connection to the state database."""

    def __init__(self, dsn: str, schema: str, source: str) -> None:
        self.dsn = dsn
        self.source = source
        self.name = f"{schema}.{lock_table(source)}"
        self.schema = schema
        self.table = sql.Identifier(schema, lock_table(source))
        self._conn: Any = None
        self.held = False

    def try_acquire(self) -> bool:
        """Take the lock if it is free; False when another session holds it (or the database
        cannot be reached now: the caller tries again). ConfigError when the table is not
        walstream's own."""
        if self.held:
            return True
        import psycopg

        from walstream.state.db import dedicated_connection

        try:
            if self._conn is None or self._conn.closed:
                self._conn = dedicated_connection(
                    self.dsn, application_name=f"walstream lock {self.source}"
                )
                self._prepare(self._conn)
            conn = self._conn
            conn.execute("BEGIN")
            try:
                conn.execute(sql.SQL("LOCK TABLE {} IN EXCLUSIVE MODE NOWAIT").format(self.table))
            except psycopg.errors.LockNotAvailable:
                conn.execute("ROLLBACK")
                return False
        except ConfigError:
            self._close()
            raise
        except Exception as exc:
            log.debug("source %s: lock: %s", self.source, exc)
            self._close()
            return False
        self.held = True
        return True

    def _prepare(self, conn: Any) -> None:
        """The table exists and is walstream's: made by this role, no one else granted."""
        # A lock held for days must not be ended by a server-wide idle timeout.
        conn.execute("SET idle_in_transaction_session_timeout = 0")
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema)))
        # No rows ever; the key keeps a FOR ALL TABLES publication's checks content.
        conn.execute(
            sql.SQL("CREATE TABLE IF NOT EXISTS {} (id int PRIMARY KEY)").format(self.table)
        )
        mine, owner, granted = conn.execute(
            "SELECT pg_has_role(current_user, c.relowner, 'MEMBER'), c.relowner::regrole::text, "
            "c.relacl IS NOT NULL AND EXISTS (SELECT 1 FROM aclexplode(c.relacl) a "
            "  WHERE a.grantee <> c.relowner AND a.privilege_type IN ('UPDATE', 'DELETE', "
            "  'TRUNCATE')) "
            "FROM pg_class c WHERE c.oid = %s::regclass",
            (self.name,),
        ).fetchone()
        if not mine:
            raise ConfigError(
                f"the leader table {self.name} belongs to role {owner}, not to walstream's "
                "role: another role made it and could keep walstream from leading",
                f"DROP TABLE {self.name} (as {owner} or a superuser); walstream makes its own",
            )
        if granted:
            raise ConfigError(
                f"other roles may lock the leader table {self.name} (UPDATE, DELETE or "
                "TRUNCATE was granted on it) and so keep walstream from leading",
                f"REVOKE ALL ON {self.name} FROM PUBLIC (and from every role but walstream's)",
            )

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
                self._conn.execute("ROLLBACK")
            except Exception as exc:  # the session is gone: so is the lock
                log.debug("source %s: unlock: %s", self.source, exc)
        self.held = False
        self._close()

    def _close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):  # closing a broken connection
                self._conn.close()
            self._conn = None
