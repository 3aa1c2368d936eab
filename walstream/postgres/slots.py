"""Lost replication slots: found before capture starts, never papered over.

A slot that Postgres invalidated (`wal_status = lost`: WAL it needed was removed, past
`max_slot_wal_keep_size`; on a standby also a catalog conflict) or that someone dropped
no longer holds the changes committed since the source last confirmed. Creating a new
slot and carrying on would skip them without a word, so walstream stops the source
with `SlotLost`, naming the WAL range that is gone and the recovery: `walstream recover
SOURCE` (a new slot, then a backfill of the source's tables, so the sinks converge).

Every column is read through `to_jsonb(slot)`: `invalidation_reason` exists from
PostgreSQL 17, `conflicting` from 16, and one query serves all versions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from walstream.change import format_lsn, parse_lsn
from walstream.errors import Kind, WalstreamError
from walstream.postgres.findings import Finding, fetch_rows
from walstream.postgres.replication import server_wal_lsn

#: What each `invalidation_reason` (PostgreSQL 17+) means, for the error text.
REASONS = {
    "wal_removed": "WAL it still needed was removed (max_slot_wal_keep_size was exceeded)",
    "rows_removed": "rows its catalog snapshot needed were removed (a standby's conflict)",
    "conflict": "it conflicted with recovery on this standby",
    "wal_level_insufficient": "wal_level on the primary fell below logical",
    "idle_timeout": "it was idle longer than idle_replication_slot_timeout",
}


class SlotLost(WalstreamError):
    """A source's slot is gone or invalidated: changes were lost. A restart cannot help."""

    kind: Kind = Kind.CONFIG


@dataclass(frozen=True)
class SlotInfo:
    name: str
    plugin: str | None
    slot_type: str | None  # logical or physical
    database: str | None
    active: bool
    confirmed: int | None  # confirmed_flush_lsn
    wal_status: str | None  # reserved, extended, unreserved, lost
    invalidation: str | None  # why Postgres invalidated it (a key of REASONS, or its own)
    safe_wal_size: int | None  # bytes of WAL before it is invalidated (None: no limit)
    failover: bool | None = None  # a failover slot (None: before 17)
    synced: bool | None = None  # a standby's copy of a primary's failover slot
    temporary: bool = False  # (a copy is, until the primary's slot passed the standby's WAL)

    @property
    def lost(self) -> bool:
        return self.wal_status == "lost" or self.invalidation is not None

    @property
    def why(self) -> str:
        """Why it is lost, in words."""
        return REASONS.get(self.invalidation or "", self.invalidation or "WAL it needed is gone")


def slot_info(conn: Any, name: str) -> SlotInfo | None:
    """The slot as Postgres shows it, or None when it does not exist."""
    row = conn.execute(
        "SELECT to_jsonb(s) FROM pg_replication_slots s WHERE slot_name = %s", (name,)
    ).fetchone()
    if row is None:
        return None
    s: dict[str, Any] = row[0]
    reason = s.get("invalidation_reason") or ("conflict" if s.get("conflicting") else None)
    if reason is None and s.get("wal_status") == "lost":  # before 17: WAL removed is the one
        reason = "wal_removed"
    confirmed = s.get("confirmed_flush_lsn")
    return SlotInfo(
        name=name,
        plugin=s.get("plugin"),
        slot_type=s.get("slot_type"),
        database=s.get("database"),
        active=bool(s.get("active")),
        confirmed=parse_lsn(confirmed) if confirmed else None,
        wal_status=s.get("wal_status"),
        invalidation=reason,
        safe_wal_size=s.get("safe_wal_size"),
        failover=s.get("failover"),
        synced=s.get("synced"),
        temporary=bool(s.get("temporary")),
    )


def recovery_fix(source: str) -> str:
    return (
        f"run `walstream recover {source}`: it replaces the slot and backfills the source's "
        "tables, so every sink converges (rows deleted in between stay in the sinks); a Spark "
        "query reading format('walstream'): drop the slot, start it with a new checkpoint and "
        "backfill. To keep this from happening: docs/production-postgres.md, 'WAL retention'"
    )


def check_not_lost(conn: Any, slot: str, source: str, resume_from: int | None) -> SlotInfo | None:
    """Raise SlotLost when `slot` is invalidated, or missing while the source resumes from
    `resume_from` (an LSN its checkpoint holds; None: the source starts fresh). Returns
    the slot's state (None: it does not exist and may be created)."""
    info = slot_info(conn, slot)
    if info is not None and info.lost:
        since = info.confirmed if info.confirmed is not None else resume_from
        raise SlotLost(
            f"replication slot {slot} of source {source!r} was invalidated by PostgreSQL: "
            f"{info.why}. The changes committed after {format_lsn(since) if since else 'its last position'} "
            f"up to now ({server_wal_lsn(conn)}) can no longer be read",
            recovery_fix(source),
        )
    if info is None and resume_from is not None:
        raise SlotLost(
            f"replication slot {slot} of source {source!r} does not exist, but the source "
            f"resumes from LSN {format_lsn(resume_from)}: the slot was dropped, and the changes "
            f"committed after {format_lsn(resume_from)} up to now ({server_wal_lsn(conn)}) can no "
            "longer be read. walstream does not create a new slot by itself: that would skip "
            "them without a word",
            recovery_fix(source),
        )
    return info


def check_slot_at(
    dsn: str, slot: str, source: str, resume_from: int | None, *, dropped_while: str = ""
) -> None:
    """`check_not_lost` on a connection of its own: SlotLost when the slot was invalidated,
    or is missing while the source resumes from `resume_from` or, given `dropped_while`
    (what was going on), at all. Nothing when the server cannot be reached or its catalog
    read: the caller's own error, or its next look, tells then."""
    import psycopg

    from walstream.postgres.replication import connect

    try:
        conn = connect(dsn, autocommit=True, connect_timeout=10)
    except WalstreamError:
        return
    with conn:
        try:
            info = check_not_lost(conn, slot, source, resume_from)
        except psycopg.Error:
            return
    if info is None and dropped_while:
        raise SlotLost(
            f"replication slot {slot} of source {source!r} was dropped {dropped_while}: its "
            "changes can no longer be read",
            recovery_fix(source),
        )


def confirmed_position(dsn: str, slot: str) -> int | None:
    """The slot's `confirmed_flush_lsn` (where a new stream starts: the end of the last
    transaction confirmed), on a connection of its own; None when it cannot be read."""
    import psycopg

    from walstream.postgres.replication import connect

    try:
        with connect(dsn, autocommit=True, connect_timeout=10) as conn:
            info = slot_info(conn, slot)
    except (WalstreamError, psycopg.Error):
        return None
    return None if info is None else info.confirmed


# -- what `walstream check` says of slots --------------------------------------------------
def capacity_findings(conn: Any, slot: str | None) -> list[Finding]:
    out: list[Finding] = []
    max_slots = int(fetch_rows(conn, "SHOW max_replication_slots")[0][0])
    used = int(fetch_rows(conn, "SELECT count(*) FROM pg_replication_slots")[0][0])
    exists = bool(slot) and bool(
        fetch_rows(conn, "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", slot)
    )
    free = max_slots - used
    if free <= 0 and not exists:
        out.append(
            Finding(
                "error",
                "replication slots",
                f"all {max_slots} replication slots are in use",
                "drop unused slots (SELECT pg_drop_replication_slot(name)) or raise max_replication_slots and restart",
            )
        )
    elif free < 2:
        out.append(
            Finding(
                "warning",
                "replication slots",
                f"only {free} of {max_slots} replication slots free",
                "raise max_replication_slots (needs a restart) before adding sources or shards",
            )
        )
    else:
        out.append(Finding("ok", "replication slots", f"{free} of {max_slots} free"))
    max_senders = int(fetch_rows(conn, "SHOW max_wal_senders")[0][0])
    senders = int(fetch_rows(conn, "SELECT count(*) FROM pg_stat_replication")[0][0])
    if max_senders - senders <= 0:
        out.append(
            Finding(
                "error",
                "wal senders",
                f"all {max_senders} WAL senders are busy",
                "raise max_wal_senders and restart PostgreSQL",
            )
        )
    return out


def slot_findings(conn: Any, slot: str, info: SlotInfo | None) -> list[Finding]:
    """What `walstream check` says about the slot (`info`: as `slot_info` read it)."""
    if info is None:
        return [
            Finding("ok", f"slot {slot}", "does not exist yet; walstream run creates it (pgoutput)")
        ]
    current_db = fetch_rows(conn, "SELECT current_database()")[0][0]
    drop = f"SELECT pg_drop_replication_slot('{slot}');"
    if info.slot_type != "logical" or info.plugin != "pgoutput":
        return [
            Finding(
                "error",
                f"slot {slot}",
                f"slot uses plugin {info.plugin!r} ({info.slot_type}); walstream needs a logical pgoutput slot",
                f"choose another slot name, or drop this one if nothing else uses it: {drop}",
            )
        ]
    if info.database != current_db:
        return [
            Finding(
                "error",
                f"slot {slot}",
                f"slot belongs to database {info.database!r}, not {current_db!r}",
                "point the DSN at that database or choose another slot name",
            )
        ]
    if info.lost:
        return [
            Finding(
                "error",
                f"slot {slot}",
                f"invalidated by PostgreSQL: {info.why}",
                recovery_fix("SOURCE"),
            )
        ]
    if info.active:
        return [
            retention(info),
            Finding(
                "warning",
                f"slot {slot}",
                "slot is in use by another connection right now",
                "stop the other consumer (a second walstream waits as standby), or choose another slot name",
            ),
        ]
    return [retention(info), Finding("ok", f"slot {slot}", "exists (pgoutput)")]


#: A slot with less than this share of what max_slot_wal_keep_size allows it left is a
#: warning (Postgres counts to the end of the current WAL segment past the cap).
WAL_LEFT_WARNING = 0.25


def retention_warning(wal_status: str | None, safe: int | None, held: int | None) -> str | None:
    """Whether Postgres is about to invalidate a slot for the WAL it holds back (`held`
    bytes from its restart_lsn; `safe`: pg_replication_slots.safe_wal_size): past the cap
    already, or under WAL_LEFT_WARNING of it left. None: not close, or no cap."""
    if wal_status == "unreserved":
        return (
            "the slot holds more WAL than max_slot_wal_keep_size: the next checkpoint "
            "invalidates it unless walstream catches up"
        )
    if safe is None or held is None or wal_status == "lost":
        return None
    if safe < (safe + held) * WAL_LEFT_WARNING:
        return (
            f"the slot may hold back only {safe / (1 << 20):,.0f} MiB more WAL before "
            "PostgreSQL invalidates it (max_slot_wal_keep_size)"
        )
    return None


def retention(info: SlotInfo) -> Finding:
    """How close the slot is to being invalidated for the WAL it holds back."""
    subject = f"slot {info.name} WAL retention"
    warning = retention_warning(info.wal_status, info.safe_wal_size, None)
    if warning is not None:
        return Finding(
            "warning",
            subject,
            warning,
            "let walstream catch up (check its sinks), or raise max_slot_wal_keep_size",
        )
    if info.safe_wal_size is None:
        return Finding("ok", subject, f"{info.wal_status or 'reserved'}; no limit")
    return Finding(
        "ok",
        subject,
        f"{info.safe_wal_size / (1 << 20):,.0f} MiB more WAL before PostgreSQL invalidates it",
    )
