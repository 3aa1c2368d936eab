"""`walstream verify`: compare each table of a sink with its source while the stream flows,
and re-backfill what differs (docs/verify.md).

Per table: one pass over the source sums rows and row hashes per key bucket
(`hashing.py`); the sink is then read once it has applied everything the source had when
that pass ended (`Position.reach`: a heartbeat message, and the slot's confirmed position
past it); the buckets whose sums differ are read again on both sides, row by row, and the
keys that differ are looked up again at a later position. A key is reported only when it
differed twice while neither side's row changed (`Verification._settle`): a row that
changed between the reads is checked again, and one that never stops changing is reported
as unsettled, not as a difference. A pass over a Postgres side can be cut short and
resumed after its last key range (`Checkpoint`, kept in the state database by `job.py`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from walstream.backfill.read import read_ahead
from walstream.errors import WalstreamError
from walstream.verify.hashing import Differences, Hasher, Sums, compare
from walstream.verify.sides import Boundary, PostgresTable, Side

log = logging.getLogger(__name__)

#: Buckets per table: about one per this many rows (at least 64, at most 65,536).
ROWS_PER_BUCKET = 1_000
Key = tuple[Any, ...]


def buckets_for(rows: int | None) -> int:
    return max(64, min(65_536, (rows or 0) // ROWS_PER_BUCKET))


#: Seconds between the heartbeats `Position.reach` writes while it waits.
NUDGE = 0.5


class Position:
    """Where the source's slots are: `reach()` returns once every slot of the sink's source
    has confirmed a heartbeat written now, so the sink has applied every change committed
    before it (the pipeline confirms a batch only after its sinks wrote it)."""

    def __init__(
        self,
        dsn: str,
        slots: list[str],
        source: str,
        timeout: float,
        writes_dsn: str | None = None,
        tick: Callable[[], None] = lambda: None,
    ) -> None:
        self.dsn, self.slots, self.source, self.timeout = dsn, slots, source, timeout
        #: Where the heartbeat is written: the primary, when the slot is on a standby.
        self.writes_dsn = writes_dsn or dsn
        self.tick = tick  # called while it waits (a verification's heartbeat)

    def reach(self) -> int:
        """Wait until the sink applied every change committed before now; the heartbeat's LSN.

        Spark commits a batch's end to the source only when it plans the next batch, so on
        an idle source the batch holding the heartbeat would be confirmed at the next
        change or walstream's own next heartbeat, seconds later: while it waits, another
        heartbeat is written every NUDGE seconds (a few bytes of WAL each)."""
        from walstream.capture.reader import HEARTBEAT_PREFIX
        from walstream.change import format_lsn, parse_lsn
        from walstream.postgres.replication import connect

        def beat(primary: Any) -> int:
            body = json.dumps({"verify": True, "at": time.time()})
            row = primary.execute(
                "SELECT pg_logical_emit_message(true, %s, %s)::text", (HEARTBEAT_PREFIX, body)
            ).fetchone()
            assert row is not None
            return parse_lsn(row[0])

        with (
            connect(self.writes_dsn, autocommit=True) as primary,
            connect(self.dsn, autocommit=True) as conn,
        ):
            mark, nudged = beat(primary), time.monotonic()
            deadline = time.monotonic() + self.timeout
            while True:
                rows = conn.execute(
                    "SELECT slot_name, confirmed_flush_lsn::text FROM pg_replication_slots "
                    "WHERE slot_name = ANY(%s)",
                    (self.slots,),
                ).fetchall()
                at = {name: parse_lsn(lsn) if lsn else 0 for name, lsn in rows}
                behind = [s for s in self.slots if at.get(s, -1) < mark]
                if not behind:
                    return mark
                if any(s not in at for s in behind):
                    raise WalstreamError(
                        f"source {self.source} has no slot {behind[0]}: nothing delivers its "
                        "changes, so the sink cannot be compared with it",
                        "start `walstream run` with this config, then verify again",
                    )
                if time.monotonic() > deadline:
                    raise WalstreamError(
                        f"the sink has not applied source {self.source} up to "
                        f"{format_lsn(mark)} within {self.timeout:g}s (slot {behind[0]} is at "
                        f"{format_lsn(at[behind[0]])})",
                        "is `walstream run` running, and the sink not paused (`walstream "
                        "status`)? Verify again once it has caught up, or give more --wait",
                    )
                if time.monotonic() - nudged >= NUDGE:
                    beat(primary)
                    nudged = time.monotonic()
                self.tick()
                time.sleep(0.2)


@dataclass
class TableResult:
    """What verifying one table found. Keys are tuples of the key columns' values."""

    table: str
    target: str
    source_rows: int = 0
    sink_rows: int = 0
    buckets: int = 0
    buckets_different: int = 0
    missing: list[Key] = field(default_factory=list)  # in the source, not in the sink
    extra: list[Key] = field(default_factory=list)  # in the sink, not in the source
    different: list[Key] = field(default_factory=list)  # other values in the sink
    unsettled: list[Key] = field(default_factory=list)  # changed at every re-check
    #: A topic's latest message of the key leaves out unchanged TOASTed values: equal on
    #: the rest (`Verification.equivalent`, `topic.equivalent`).
    incomplete: list[Key] = field(default_factory=list)
    #: With values asked for: per key (as text), the source's row and the sink's.
    values: dict[str, dict[str, Any]] = field(default_factory=dict)
    repaired: int | None = None  # keys re-backfilled (None: no repair asked)
    removed: int | None = None  # rows only in the sink a repair deleted (a Postgres mirror)
    seconds: float = 0.0

    @property
    def equal(self) -> bool:
        return not (self.missing or self.extra or self.different)

    @property
    def rows_different(self) -> int:
        return len(self.missing) + len(self.extra) + len(self.different)

    def as_json(self, limit: int | None = None) -> dict[str, Any]:
        """The result as JSON; at most `limit` keys of each kind (the counts are whole)."""

        def keys(found: list[Key]) -> list[list[Any]]:
            return [list(k) for k in found[:limit]]

        out = {
            "table": self.table,
            "target": self.target,
            "equal": self.equal,
            "source_rows": self.source_rows,
            "sink_rows": self.sink_rows,
            "buckets": self.buckets,
            "buckets_different": self.buckets_different,
            "missing": keys(self.missing),
            "extra": keys(self.extra),
            "different": keys(self.different),
            "unsettled": keys(self.unsettled),
            "incomplete": keys(self.incomplete),
            "counts": {
                "missing": len(self.missing),
                "extra": len(self.extra),
                "different": len(self.different),
                "unsettled": len(self.unsettled),
                "incomplete": len(self.incomplete),
            },
            "seconds": round(self.seconds, 3),
        }
        if self.values and limit is None:  # never kept in the state database: PII
            out["values"] = self.values
        if self.repaired is not None:
            out["repaired"] = self.repaired
        if self.removed is not None:
            out["removed"] = self.removed
        return out

    @staticmethod
    def from_json(data: dict[str, Any]) -> TableResult:
        """A result kept by `as_json` (a resumed verification's tables compared before)."""

        def keys(kind: str) -> list[Key]:
            return [tuple(key) for key in data.get(kind, [])]

        return TableResult(
            data["table"],
            data["target"],
            data.get("source_rows", 0),
            data.get("sink_rows", 0),
            data.get("buckets", 0),
            data.get("buckets_different", 0),
            keys("missing"),
            keys("extra"),
            keys("different"),
            keys("unsettled"),
            seconds=data.get("seconds", 0.0),
            repaired=data.get("repaired"),
            removed=data.get("removed"),
            incomplete=keys("incomplete"),
        )


Progress = Callable[[str], None]
State = dict[str, Any]


class Checkpoint:
    """Where one table's bucket pass has got to (`State`: the table, its buckets, the phase
    "source" or "sink", the key range read up to, each side's sums so far). This one keeps
    nothing; `job.Kept` keeps it in the state database."""

    def load(self, table: str) -> State | None:
        """The state a cut-short pass over `table` left, if any."""
        return None

    def save(self, state: State, force: bool = False) -> None:
        """The pass has got to `state` (kept at times, or now when `force`)."""


@dataclass
class Verification:
    """One table's comparison (`run`): sides, position, and how hard to look."""

    source: Side
    sink: Side
    position: Position
    rechecks: int = 3
    values: bool = False
    #: Tables estimated at most this many rows are compared row by row at once.
    direct_rows: int = 50_000
    progress: Progress = lambda _: None
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    #: Of the rows of both sides (Arrow tables) of a re-check, the keys whose rows differ
    #: only by what the sink cannot hold (a topic's unchanged TOASTed values): equal.
    equivalent: Callable[[list[Any], list[Any]], set[Key]] | None = None

    def run(self, table: str, target: str, estimate: int | None) -> TableResult:
        t0 = time.monotonic()
        shape = self.source.shape
        state = self.checkpoint.load(table)
        if state is not None and state.get("hashing", "duckdb") != self._hashing():
            state = None  # begun another way: its sums are not this one's
        direct = state is None and estimate is not None and estimate <= self.direct_rows
        buckets = 0 if direct else state["buckets"] if state else buckets_for(estimate)
        result = TableResult(table, target, buckets=buckets)
        hasher = Hasher(shape.key, shape.names, max(result.buckets, 1), json_columns(shape))
        try:
            if direct:
                # a small table: the keys and hashes of all its rows fit in a few MB, and
                # comparing them at once spares one wait for the sink's pipeline
                self._settle(hasher, self._rows(hasher, None, result), result)
            else:
                src, snk = self._passes(hasher, result, state)
                result.source_rows, result.sink_rows = src.rows, snk.rows
                differing = src.different(snk)
                result.buckets_different = len(differing)
                if differing:
                    self._settle(hasher, self._rows(hasher, differing, result), result)
        finally:
            hasher.close()
        result.seconds = time.monotonic() - t0
        return result

    def _passes(
        self, hasher: Hasher, result: TableResult, state: State | None
    ) -> tuple[Sums, Sums]:
        """Each side's bucket sums: the source's, then the sink's once it caught up with the
        source; a pass cut short goes on from `state`."""
        table = result.table
        base: State = {"table": table, "buckets": result.buckets, "hashing": self._hashing()}
        if state is not None and state["phase"] == "sink":
            src = Sums.from_json(state["source"])
        else:
            src = self._sums(hasher, self.source, base | {"phase": "source"}, state, None)
            state = None
            self.checkpoint.save(
                base | {"phase": "sink", "after": None, "source": src.as_json(), "sink": None},
                force=True,
            )
        self.progress(f"{table}: waiting for the sink to apply the source up to now")
        self.position.reach()
        snk = self._sums(hasher, self.sink, base | {"phase": "sink"}, state, src)
        return src, snk

    def _sums(
        self, hasher: Hasher, side: Side, at: State, state: State | None, src: Sums | None
    ) -> Sums:
        """One side's pass (`at`: the table and phase), from where `state` left it."""
        phase = at["phase"]
        sums, after = Sums(), None
        if state is not None and state.get(phase) is not None:
            sums, after = Sums.from_json(state[phase]), state["after"]
            self.progress(f"{at['table']}: {side.name}: resuming after {sums.rows:,} rows")
        items: Iterator[Any]
        if isinstance(side, PostgresTable) and self._hashing() == "postgres":
            items = side.sums(at["buckets"], after)
        else:
            batches = read_ahead(side.batches(after))
            items = (b if isinstance(b, Boundary) else hasher.sums(b) for b in batches)
        for item in items:
            if isinstance(item, Boundary):
                done = {"after": list(item.upto), phase: sums.as_json()}
                other = {"source": src.as_json() if src is not None else None, "sink": None}
                self.checkpoint.save(at | other | done)
                continue
            sums.add(item)
            self.progress(f"{at['table']}: {side.name}: {sums.rows:,} rows hashed")
        return sums

    def _hashing(self) -> str:
        """Who sums a side's rows: "postgres" when both sides are Postgres tables (each
        server hashes its rows' text, `PostgresTable.sums`: nothing but the sums crosses
        the network), else "duckdb" over the rows in the sink's types (`Hasher`)."""
        both = isinstance(self.source, PostgresTable) and isinstance(self.sink, PostgresTable)
        return "postgres" if both else "duckdb"

    def _keyed(self, hasher: Hasher, batches: Iterator[Any], buckets: set[int] | None) -> Any:
        import pyarrow as pa

        parts = [
            hasher.keyed(b, buckets) for b in read_ahead(batches) if not isinstance(b, Boundary)
        ]
        if not parts:
            return _empty(hasher, self.source.shape)
        return pa.concat_tables(parts)

    def _rows(self, hasher: Hasher, buckets: set[int] | None, result: TableResult) -> Differences:
        """The keys whose rows differ, of `buckets` (None: of the whole table, whose row
        counts go into `result`), the sink read once it has caught up with the source."""
        what = "every row" if buckets is None else f"the rows of {len(buckets):,} bucket(s)"
        self.progress(f"{result.table}: comparing {what}")

        def rows(side: Side) -> Any:
            if buckets is not None and self._hashing() == "postgres":
                assert isinstance(side, PostgresTable)
                return self._keyed(hasher, side.batches_of(result.buckets, buckets), None)
            return self._keyed(hasher, side.batches(), buckets)

        source = rows(self.source)
        self.position.reach()
        sink = rows(self.sink)
        if buckets is None:
            result.source_rows, result.sink_rows = source.num_rows, sink.num_rows
        return compare(source, sink, hasher.key)

    def _settle(self, hasher: Hasher, found: Differences, result: TableResult) -> None:
        """Look the differing keys up again until each differed twice with neither side's
        row changed in between (reported) or `rechecks` rounds passed (unsettled).

        Both sides, not the source alone: the sink is read after the source, and a sink
        that applied a later change than the source read (a topic read to its end while
        writes flow) differs from it for a moment. When the source row is the same at two
        reads, it was so at the sink's read between them, which came after the sink had
        applied the first (`Position.reach`): the sink's row then is wrong, and it is
        reported only when the sink still has it at the second look."""
        shape = self.source.shape
        pending = found
        incomplete: set[Key] = set()
        for n in range(self.rechecks):
            if not len(pending):
                break
            self.progress(f"{result.table}: re-checking {len(pending):,} key(s) (round {n + 1})")
            keys = _keys_table(pending.keys(), shape)
            source_rows = list(self.source.rows(keys))
            self.position.reach()
            sink_rows = list(self.sink.rows(keys))
            source = self._keyed(hasher, iter(source_rows), None)
            sink = self._keyed(hasher, iter(sink_rows), None)
            again = compare(source, sink, hasher.key)
            if self.equivalent is not None:  # equal but for what the sink cannot have
                alike = self.equivalent(source_rows, sink_rows) & again.different.keys()
                incomplete.update(alike)
                for k in alike:
                    del again.different[k]
            moving: dict[str, dict[Key, Any]] = {"missing": {}, "extra": {}, "different": {}}
            for kind in ("missing", "extra", "different"):
                for k, h in getattr(again, kind).items():
                    if pending.state(k) == again.state(k):
                        getattr(result, kind).append(k)
                    else:
                        moving[kind][k] = h
            pending = Differences(moving["missing"], moving["extra"], moving["different"])
        result.unsettled = pending.keys()
        reported = {*result.missing, *result.extra, *result.different, *result.unsettled}
        result.incomplete = sorted(incomplete - reported, key=repr)
        for kind in ("missing", "extra", "different"):
            getattr(result, kind).sort(key=repr)
        if self.values and not result.equal:
            result.values = self._values(result)

    def differing(self, keys: list[Key]) -> set[Key]:
        """Of `keys`, those whose rows differ once the sink has applied the source up to now
        (after a repair)."""
        shape = self.source.shape
        hasher = Hasher(shape.key, shape.names, 1, json_columns(shape))
        try:
            table = _keys_table(keys, shape)
            source = self._keyed(hasher, self.source.rows(table), None)
            self.position.reach()
            sink = self._keyed(hasher, self.sink.rows(table), None)
            return set(compare(source, sink, hasher.key).keys())
        finally:
            hasher.close()

    def _values(self, result: TableResult) -> dict[str, dict[str, Any]]:
        """The source's and the sink's row of each differing key (only asked for: PII)."""
        shape = self.source.shape
        keys = _keys_table([*result.missing, *result.extra, *result.different], shape)
        out: dict[str, dict[str, Any]] = {}
        for side, name in ((self.source, "source"), (self.sink, "sink")):
            if side is self.sink:
                self.position.reach()
            for batch in side.rows(keys):
                for row in batch.to_pylist():
                    k = json.dumps([row[c] for c in shape.key], default=str)
                    out.setdefault(k, {"source": None, "sink": None})[name] = {
                        c: _plain(v) for c, v in row.items()
                    }
        return out


def json_columns(shape: Any) -> list[str]:
    """The columns holding JSON text (compared as JSON, see `hashing._hash`)."""
    return [c for c in shape.names if shape.pg_types.get(c) in ("json", "jsonb")]


def _plain(v: Any) -> Any:
    return v if isinstance(v, (int, float, str, bool, type(None), list)) else str(v)


def _keys_table(keys: list[Key], shape: Any) -> Any:
    import pyarrow as pa

    schema = shape.arrow_schema()
    columns: list[Any] = list(zip(*keys, strict=True)) if keys else [[] for _ in shape.key]
    return pa.table(
        {
            k: pa.array(list(col), schema.field(k).type)
            for k, col in zip(shape.key, columns, strict=True)
        }
    )


def _empty(hasher: Hasher, shape: Any) -> Any:
    import pyarrow as pa

    schema = shape.arrow_schema()
    return pa.table(
        {k: pa.array([], schema.field(k).type) for k in hasher.key}
        | {"_h": pa.array([], pa.uint64())}
    )
