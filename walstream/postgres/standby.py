"""Reading a physical standby (PostgreSQL 16+ decodes there): what must go to the primary.

A standby replays the primary's WAL and can hold a logical slot of its own, so the
changes (and backfill reads) come from the standby and the primary serves nothing
but its writes. What walstream writes cannot be written on a standby, so it goes to
the source's `primary_dsn`: heartbeats and backfill watermarks (logical messages, that
reach the standby's slot through replay, in their place in the WAL), the publication
and the event outbox.

- A slot created on a standby waits for the primary to log its running transactions
  (every 15 s at best, only while it writes): `create_slot` asks the primary for one
  (`pg_log_standby_snapshot()`) until the slot is there.
- A backfill chunk's low watermark is written on the primary; its rows are read on the
  standby once it has replayed past it (`wait_replayed`), so the read sees everything
  before the low watermark, and the high watermark, written next on the primary,
  lands after everything the read saw.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

import psycopg

from walstream.change import format_lsn, parse_lsn
from walstream.errors import StandbyBehind
from walstream.postgres.findings import Finding, fetch_rows
from walstream.postgres.replication import connect, ensure_slot, server_version

if TYPE_CHECKING:
    from walstream.postgres.slots import SlotInfo

log = logging.getLogger(__name__)

#: Decoding on a standby: PostgreSQL 16. Failover slots: 17.
STANDBY_DECODING, FAILOVER_SLOTS = 160000, 170000


def in_recovery(conn: Any) -> bool:
    return bool(fetch_rows(conn, "SELECT pg_is_in_recovery()")[0][0])


def standby_findings(conn: psycopg.Connection[Any], primary: str | None) -> list[Finding]:
    """What `walstream check` says about reading this server when it is a standby."""
    if not in_recovery(conn):
        return []
    if server_version(conn) < STANDBY_DECODING:
        return [
            Finding(
                "error",
                "standby",
                "the dsn is a standby; PostgreSQL before 16 cannot decode on a standby",
                "point dsn at the primary, or upgrade to PostgreSQL 16+",
            )
        ]
    out = []
    if primary is None:
        out.append(
            Finding(
                "error",
                "standby",
                "the dsn is a standby and the source has no primary_dsn: heartbeats, "
                "backfill watermarks and the publication have nowhere to go",
                "set primary_dsn to the primary's DSN",
            )
        )
    else:
        out.append(
            Finding(
                "ok",
                "standby",
                "the dsn is a standby: the slot and the changes are read there; "
                "heartbeats, watermarks and the publication go to primary_dsn",
            )
        )
    feedback, slot = fetch_rows(
        conn, "SELECT current_setting('hot_standby_feedback'), current_setting('primary_slot_name')"
    )[0]
    if feedback != "on":
        out.append(
            Finding(
                "warning",
                "hot_standby_feedback",
                "off: the primary may vacuum away catalog rows the standby's slot "
                "still needs, and PostgreSQL then invalidates the slot (rows_removed)",
                "set hot_standby_feedback = on on the standby (a reload)",
            )
        )
    if not slot:
        out.append(
            Finding(
                "warning",
                "primary_slot_name",
                "unset: without a physical slot on the primary, hot_standby_feedback "
                "is forgotten whenever the standby reconnects",
                "create a physical slot on the primary and set primary_slot_name "
                "to it on the standby",
            )
        )
    return out


def failover_findings(
    conn: psycopg.Connection[Any], slot: str | None, info: SlotInfo | None
) -> list[Finding]:
    """What `walstream check` says about the slot (`info`: as `slot_info` read it)
    surviving a failover (17+)."""
    if server_version(conn) < FAILOVER_SLOTS:
        return []
    if in_recovery(conn):
        return _copy_findings(slot, info)
    out = []
    standbys = fetch_rows(
        conn, "SELECT count(*) FROM pg_replication_slots WHERE slot_type = 'physical'"
    )[0][0]
    if info is None:
        out.append(
            Finding(
                "ok",
                "failover",
                "walstream run creates the slot as a failover slot: standbys with "
                "sync_replication_slots = on keep a copy for a promotion",
            )
        )
    elif info.failover:
        out.append(
            Finding(
                "ok",
                "failover",
                f"slot {slot} is a failover slot: standbys with "
                "sync_replication_slots = on keep a copy for a promotion",
            )
        )
    else:  # a warning where standbys stream from physical slots: they could have a copy
        out.append(
            Finding(
                "warning" if standbys else "ok",
                "failover",
                f"slot {slot} is not a failover slot: a standby promoted in a "
                "failover will not have it, and walstream then stops (lost slot)",
                f"ALTER_REPLICATION_SLOT {slot} (FAILOVER true) over a replication "
                'connection (psql "dbname=... replication=database"), while '
                "walstream is stopped",
            )
        )
    waits_for = fetch_rows(conn, "SELECT current_setting('synchronized_standby_slots')")[0][0]
    if standbys and not waits_for:
        out.append(
            Finding(
                "warning",
                "synchronized_standby_slots",
                "unset while standbys stream from physical slots: walstream may "
                "receive (and deliver) changes a standby does not have yet, and a "
                "failover to that standby loses them in the database but not in "
                "the sinks",
                "set synchronized_standby_slots to the standbys' physical slots (a reload)",
            )
        )
    elif waits_for:
        out.append(
            Finding(
                "ok",
                "synchronized_standby_slots",
                f"{waits_for}: walstream receives a change only once those standbys have it",
            )
        )
    return out


def _copy_findings(slot: str | None, info: SlotInfo | None) -> list[Finding]:
    """On a standby: whether its copy of the primary's failover slot is ready."""
    out = []
    if info is not None and info.synced and info.temporary:
        out.append(
            Finding(
                "warning",
                "failover",
                f"slot {slot} is a copy of the primary's failover slot that is "
                "not ready yet (temporary): a promotion now drops it, and "
                "walstream then stops (lost slot)",
                "wait: it becomes ready once the primary's slot passes the "
                "standby's position (walstream's heartbeats move it)",
            )
        )
    elif info is not None and info.synced:
        out.append(
            Finding(
                "ok",
                "failover",
                f"slot {slot} is a copy of the primary's failover slot, ready "
                "for a promotion (a standby cannot stream from it before)",
            )
        )
    return out


def create_slot(conn: psycopg.Connection[Any], slot: str, primary: str | None) -> bool:
    """`ensure_slot`: on a primary of 17+ a failover slot (standbys that sync slots keep a
    copy, so it survives a promotion); on a standby, the primary is asked to log its
    running transactions while the slot is being created, so that takes a moment, not
    15 s or forever."""
    if not in_recovery(conn):
        return ensure_slot(conn, slot, failover=server_version(conn) >= FAILOVER_SLOTS)
    assert primary is not None, "check_database refuses a standby without primary_dsn"
    done = threading.Event()

    def nudge() -> None:
        try:
            with connect(primary, autocommit=True, connect_timeout=10) as p:
                while not done.wait(0.2):
                    p.execute("SELECT pg_log_standby_snapshot()")
        except psycopg.errors.InsufficientPrivilege:
            log.warning(
                "creating slot %s on the standby waits for the primary to log its running "
                "transactions (every 15 s while it writes): GRANT EXECUTE ON FUNCTION "
                "pg_log_standby_snapshot() to walstream's role on the primary makes it quick",
                slot,
            )
        except Exception:  # the slot still appears, later; the creation reports real trouble
            log.warning("could not ask the primary for a snapshot", exc_info=True)

    helper = threading.Thread(target=nudge, name=f"walstream-snapshot-{slot}", daemon=True)
    helper.start()
    try:
        return ensure_slot(conn, slot)
    finally:
        done.set()
        helper.join(5)


def wait_replayed(conn: Any, lsn: int, timeout: float) -> None:
    """Wait until the standby behind `conn` has replayed the WAL up to `lsn`."""
    deadline = time.monotonic() + timeout
    while True:
        row = conn.execute("SELECT pg_last_wal_replay_lsn()::text").fetchone()
        if row is not None and row[0] is not None and parse_lsn(row[0]) >= lsn:
            return
        if time.monotonic() > deadline:
            raise StandbyBehind(
                f"the standby did not replay the primary's WAL up to {format_lsn(lsn)} within "
                f"{timeout:g}s",
                "check replication from the primary (pg_stat_replication on the primary, "
                "pg_stat_wal_receiver on the standby)",
            )
        time.sleep(0.02)
