"""What `/health`, the API and the console report: each source and sink, its status and why.

A status is one of `ok`, `warning`, `error`, `paused` or `standby`, with the reasons
that made it so. The facts come from the running pipelines (batches, counts, the
last failure), the state database (parked messages, dead letters, pauses) and the
source databases (the slot: active or not, how far behind, how much WAL it holds;
the replication connection's last status report).

Over all of them, `/health` says `healthy` (every one ok, or standby), `degraded`
(something needs a look: a warning, a paused sink) or `unhealthy` (an error; answered
with 503), with walstream's version and uptime.

A reason that quotes an error (which may quote row values: a key, a refused value)
has a public form naming only the error's kind: `/health` shows that one to anyone,
`/api/sources` and `/api/sinks` the whole text to token holders.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from walstream.delivery.parking import DEAD, PARKED
from walstream.postgres.replication import WAL_POSITION

if TYPE_CHECKING:
    from walstream.server.status import Control, SourceStatus

log = logging.getLogger(__name__)

OK, WARNING, ERROR, PAUSED, STANDBY = "ok", "warning", "error", "paused", "standby"
_RANK = {OK: 0, STANDBY: 1, PAUSED: 2, WARNING: 3, ERROR: 4}

#: A replication connection that reported nothing for this long is stale (walstream
#: reports every 5 s while connected).
STALE_REPLY_SECONDS = 30.0
#: A slot this far behind the server's WAL is a warning.
LAG_WARNING_BYTES = 1 << 30

_SLOT_QUERY = f"""
SELECT s.active,
       pg_wal_lsn_diff({WAL_POSITION}, s.confirmed_flush_lsn)::bigint,
       pg_wal_lsn_diff({WAL_POSITION}, s.restart_lsn)::bigint,
       s.confirmed_flush_lsn::text,
       extract(epoch FROM now() - r.reply_time)::float8,
       s.wal_status,
       s.safe_wal_size
FROM pg_replication_slots s LEFT JOIN pg_stat_replication r ON r.pid = s.active_pid
WHERE s.slot_name = %s
"""


class Reason(NamedTuple):
    """Why a status is what it is: `text` for token holders, `public` for anyone."""

    text: str
    public: str


def reason(text: str, public: str | None = None) -> Reason:
    return Reason(text, text if public is None else public)


def _error(prefix: str, kind: str | None, text: str, where: str) -> Reason:
    """A reason that quotes an error: publicly only its kind and where to read it."""
    return Reason(
        f"{prefix}{text}", f"{prefix}{kind or 'an error'} (the details at {where}, with a token)"
    )


def _shown(item: dict[str, Any], detail: bool) -> dict[str, Any]:
    """A source or sink as JSON: its reasons (and last error) whole or public."""
    out = dict(item)
    out["reasons"] = [r.text if detail else r.public for r in item["reasons"]]
    if not detail and (item.get("verification") or {}).get("error"):
        out["verification"] = dict(item["verification"], error="(with a token)")
    if "last_error" in item:
        err: Reason | None = item["last_error"]
        out["last_error"] = None if err is None else (err.text if detail else err.public)
    return out


def worst(statuses: list[str]) -> str:
    return max(statuses, key=lambda s: _RANK[s], default=OK)


@dataclass
class SlotState:
    reachable: bool
    exists: bool = False
    active: bool = False
    lag_bytes: int | None = None
    retained_wal_bytes: int | None = None
    confirmed_lsn: str | None = None
    reply_age_seconds: float | None = None
    wal_status: str | None = None
    safe_wal_bytes: int | None = None  # WAL it may still hold back (None: no limit)
    error: str | None = None

    def retention_warning(self) -> str | None:
        """See `walstream.postgres.slots.retention_warning`."""
        from walstream.postgres.slots import retention_warning

        return retention_warning(self.wal_status, self.safe_wal_bytes, self.retained_wal_bytes)


HEALTHY, DEGRADED, UNHEALTHY = "healthy", "degraded", "unhealthy"
_HEALTH = {OK: HEALTHY, STANDBY: HEALTHY, PAUSED: DEGRADED, WARNING: DEGRADED, ERROR: UNHEALTHY}


@dataclass
class Snapshot:
    """One look at everything, shared by /health, /metrics and the console."""

    at: float
    sources: list[dict[str, Any]] = field(default_factory=list)
    sinks: list[dict[str, Any]] = field(default_factory=list)
    uptime: float = 0.0  # seconds since the process's monitor started

    @property
    def status(self) -> str:
        return worst([s["status"] for s in self.sources + self.sinks])

    @property
    def health(self) -> str:
        return _HEALTH[self.status]

    def as_json(self, detail: bool = False) -> dict[str, Any]:
        """`detail`: the errors' whole text (for token holders); else only their kinds."""
        from walstream.version import __version__

        return {
            "health": self.health,
            "version": __version__,
            "uptime_seconds": round(self.uptime, 1),
            "status": self.status,
            "sources": self.source_list(detail),
            "sinks": self.sink_list(detail),
        }

    def source_list(self, detail: bool) -> list[dict[str, Any]]:
        return [_shown(s, detail) for s in self.sources]

    def sink_list(self, detail: bool) -> list[dict[str, Any]]:
        return [_shown(s, detail) for s in self.sinks]


def slot_state(dsn: str, slot: str, timeout: float = 3.0) -> SlotState:
    from walstream.postgres.replication import connect

    try:
        with connect(dsn, autocommit=True, connect_timeout=max(1, int(timeout))) as conn:
            conn.execute(f"SET statement_timeout = {int(timeout * 1000)}")
            row = conn.execute(_SLOT_QUERY, (slot,)).fetchone()
    except Exception as exc:  # unreachable, refused, timed out: reported, never raised
        return SlotState(reachable=False, error=f"{type(exc).__name__}: {str(exc).strip()[:300]}")
    if row is None:
        return SlotState(reachable=True)
    active, lag, retained, confirmed, reply_age, wal_status, safe = row
    return SlotState(
        True,
        True,
        bool(active),
        None if lag is None else int(lag),
        None if retained is None else int(retained),
        confirmed,
        None if reply_age is None else float(reply_age),
        wal_status,
        None if safe is None else int(safe),
    )


class Monitor:
    """Builds Snapshots of what a Control publishes (cached for `ttl` seconds: scrapes and
    page loads may come often, and each look queries the databases)."""

    def __init__(self, control: Control, ttl: float = 1.0) -> None:
        self.control = control
        self.ttl = ttl
        self._last: Snapshot | None = None
        self._started = time.monotonic()

    def snapshot(self, fresh: bool = False) -> Snapshot:
        last = self._last
        if not fresh and last is not None and time.monotonic() - last.at < self.ttl:
            return last
        snap = self._build()
        self._last = snap
        return snap

    def _build(self) -> Snapshot:
        rt = self.control
        snap = Snapshot(time.monotonic(), uptime=time.monotonic() - self._started)
        counts: dict[str, dict[str, int]] = {}
        paused: dict[str, str | None] = {}
        state_error: Reason | None = None
        verified: dict[str, Any] = {}
        if rt.parking is not None:
            try:
                counts = rt.parking.counts()
                paused = rt.parking.paused()
                if rt.verifications is not None:
                    verified = rt.verifications.latest()
            except Exception as exc:
                state_error = _error(
                    "the state database is unreachable: ",
                    type(exc).__name__,
                    f"{type(exc).__name__}: {exc}",
                    "/api/sources",
                )
        progress = rt.progress()
        failing: dict[str, SourceStatus] = {}
        statuses = rt.sources()
        for sq in statuses:
            source = self._source(sq)
            if state_error:
                source["reasons"].append(state_error)
                source["status"] = ERROR
            snap.sources.append(source)
            if sq.last_error and sq.failed:
                failing[sq.name] = sq
        sink_source = {sink.name: sink.source for sink in rt.config.sinks}
        for sink in rt.config.sinks:
            p = progress.get(sink.name)
            c = counts.get(sink.name, {})
            status, reasons = self._sink_status(sink, paused, statuses, failing, c, snap)
            newest, done = verified.get(sink.name, (None, None))
            status = _verification(sink.name, newest, done, status, reasons)
            snap.sinks.append(
                {
                    "name": sink.name,
                    "source": sink.source,
                    "type": sink.destination.type,
                    "status": status,
                    "reasons": reasons,
                    "delivered": p.delivered + p.retried if p else 0,
                    "retried": p.retried if p else 0,
                    "skipped": p.skipped if p else 0,
                    "discarded": p.discarded if p else 0,
                    "batches": p.batches if p else 0,
                    "rate_per_second": round(rt.rates.get(sink.name, 0.0), 1),
                    "parked": c.get(PARKED, 0),
                    "dead_letters": c.get(DEAD, 0),
                    "last_batch_age_seconds": _age(p.last_batch_at)
                    if p and p.last_batch_at
                    else None,
                    # commit → delivered, of the newest change of the last batch that had one
                    "latency_seconds": round(p.latency, 3) if p and p.latency is not None else None,
                    "last_commit_age_seconds": (
                        _age(p.last_committed_us / 1e6) if p and p.last_committed_us else None
                    ),
                    # the sink's newest verification (`walstream verify`, `verify:`), and
                    # what the newest one that compared every table found
                    "verification": newest.as_json() if newest is not None else None,
                    "verified_at": done.finished_at.isoformat() if done is not None else None,
                    "rows_different": done.rows_different if done is not None else None,
                }
            )
        for source in snap.sources:  # the newest change any of its sinks delivered
            newest = max(
                (
                    p.last_committed_us
                    for name, p in progress.items()
                    if sink_source.get(name) == source["name"]
                ),
                default=0,
            )
            source["last_event_at"] = _iso(newest) if newest else None
            source["last_event_age_seconds"] = _age(newest / 1e6) if newest else None
        return snap

    def _sink_status(
        self,
        sink: Any,
        paused: dict[str, str | None],
        statuses: list[SourceStatus],
        failing: dict[str, SourceStatus],
        c: dict[str, int],
        snap: Snapshot,
    ) -> tuple[str, list[Reason]]:
        """A sink's status and its reasons: paused, held, failing, parked, dead letters."""
        reasons: list[Reason] = []
        status = OK
        held_by = next((sq.holding for sq in statuses if sq.name == sink.source), {})
        holding = held_by.get(sink.name)
        if sink.name in paused:
            status = PAUSED
            why = paused[sink.name]
            reasons.append(reason(f"paused{f': {why}' if why else ''}; resume to go on"))
        elif holding:
            status = WARNING
            reasons.append(reason(holding))
        elif held_by:  # another sink of its source holds the batch: this one waits too
            status = WARNING
            reasons.append(
                reason(
                    f"waits for {', '.join(sorted(held_by))}: the sinks of a source share its "
                    "slot, so no batch reaches this one until "
                    f"{'that sink goes' if len(held_by) == 1 else 'those sinks go'} on "
                    "(its status says why and what to do)"
                )
            )
        failed = failing.get(sink.source)
        if failed and failed.last_error and f"sink {sink.name}" in failed.last_error:
            status = ERROR
            reasons.append(
                _error("", failed.last_error_kind, failed.last_error, f"/api/sinks/{sink.name}")
            )
        if c.get(PARKED):
            status = worst([status, WARNING])
            reasons.append(reason(f"{c[PARKED]:,} parked message(s) waiting for a retry"))
        if c.get(DEAD):
            status = worst([status, WARNING])
            reasons.append(reason(f"{c[DEAD]:,} dead letter(s): retry or discard them"))
        source_state = next((s for s in snap.sources if s["name"] == sink.source), None)
        if source_state is not None and source_state["status"] == STANDBY:
            status = STANDBY
        return status, reasons

    @staticmethod
    def _slot(sq: SourceStatus, slot: Any, reasons: list[Reason]) -> str:
        """The worst status the source's slot shows, its reasons added to `reasons`."""
        status = OK
        if not slot.reachable:
            status = ERROR
            reasons.append(reason(f"cannot reach the source database: {slot.error}"))
        elif not slot.exists:
            status = ERROR
            reasons.append(reason(f"replication slot {sq.slot} does not exist"))
        else:
            if not slot.active:
                status = worst([status, WARNING])
                reasons.append(reason(f"replication slot {sq.slot} has no connection"))
            elif (slot.reply_age_seconds or 0) > STALE_REPLY_SECONDS:
                status = worst([status, WARNING])
                reasons.append(
                    reason(
                        f"no status report from the replication connection for "
                        f"{slot.reply_age_seconds:.0f}s"
                    )
                )
            if slot.lag_bytes is not None and slot.lag_bytes > LAG_WARNING_BYTES:
                status = worst([status, WARNING])
                reasons.append(reason(f"the slot is {slot.lag_bytes / (1 << 20):,.0f} MiB behind"))
            if slot.wal_status == "lost":
                status = ERROR
                reasons.append(
                    reason(
                        "the slot lost WAL it needed (wal_status lost): changes are gone; "
                        f"run `walstream recover {sq.name}`"
                    )
                )
            elif (warning := slot.retention_warning()) is not None:
                status = worst([status, WARNING])
                reasons.append(reason(warning))
        return status

    def _source(self, sq: SourceStatus) -> dict[str, Any]:
        reasons: list[Reason] = []
        status = OK
        leader = sq.leader
        if not leader:
            status = STANDBY
            reasons.append(
                reason("standby: another walstream holds this source; taking over when it stops")
            )
        slot = slot_state(sq.dsn, sq.slot)
        running = sq.streaming
        if leader:
            if not running:
                status = ERROR
                reasons.append(
                    _error("not streaming: ", sq.last_error_kind, sq.last_error, "/api/sources")
                    if sq.last_error
                    else reason("not streaming")
                )
            status = worst([status, self._slot(sq, slot, reasons)])
            if sq.failures and running and sq.last_error:
                status = worst([status, WARNING])
                reasons.append(
                    _error(
                        f"restarted after {sq.failures} failure(s); last: ",
                        sq.last_error_kind,
                        sq.last_error,
                        "/api/sources",
                    )
                )
        return {
            "name": sq.name,
            "status": status,
            "reasons": reasons,
            "role": "leader" if leader else "standby",
            "streaming": running,
            "slot": sq.slot,
            "slot_active": slot.active,
            "lag_bytes": slot.lag_bytes,
            "retained_wal_bytes": slot.retained_wal_bytes,
            "safe_wal_bytes": slot.safe_wal_bytes,
            "confirmed_lsn": slot.confirmed_lsn,
            "last_report_age_seconds": (
                None if slot.reply_age_seconds is None else round(slot.reply_age_seconds, 1)
            ),
            "ingested": sq.ingested,
            "batches": sq.batches,
            "last_batch_age_seconds": _age(sq.last_batch_at) if sq.last_batch_at else None,
            "failures": sq.failures,
            "last_error": (
                _error("", sq.last_error_kind, sq.last_error, "/api/sources")
                if sq.last_error
                else None
            ),
        }


def _verification(sink: str, newest: Any, done: Any, status: str, reasons: list[Reason]) -> str:
    """A sink's status with what its verifications found: rows that differ from the source
    (the newest done one), or that the newest could not compare, is a warning (`/health`
    degraded)."""
    if done is not None and done.rows_different:
        tables = ", ".join(r["table"] for r in done.results if not r.get("equal"))
        reasons.append(
            reason(
                f"verification {done.id} found {done.rows_different:,} row(s) that differ from "
                f"the source in {tables}: `walstream verify {sink}` lists them, --repair "
                "re-backfills them"
            )
        )
        status = worst([status, WARNING])
    if newest is not None and newest.status == "failed":
        reasons.append(
            _error(
                f"verification {newest.id} could not compare: ",
                "see the error",
                newest.error or "no reason given",
                f"/api/sinks/{sink}",
            )
        )
        status = worst([status, WARNING])
    return status


def _iso(epoch_us: int) -> str:
    """A commit time (µs since the Unix epoch) as ISO 8601 UTC."""
    from datetime import UTC, datetime

    return datetime.fromtimestamp(epoch_us / 1e6, UTC).isoformat(timespec="milliseconds")


def _age(epoch_seconds: float) -> float:
    return round(max(0.0, time.time() - epoch_seconds), 1)
