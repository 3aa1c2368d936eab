"""Row hashes and bucket sums: what `walstream verify` compares, computed the same way on both
sides (docs/verify.md, "How rows are compared").

A row is hashed over the sink's representation of its columns: Arrow, in the types the sink
holds (`TableShape.arrow_schema`), by DuckDB's `hash` of the columns in order. Its key alone
picks one of `buckets` buckets. A pass over one side sums, per bucket, its rows and their
hashes: a sum does not depend on the order rows are read in, so each side is read the way
it reads fastest. Equal sums: the bucket's rows are equal (but for a 2^-64 chance per
bucket); different: that bucket's rows are compared key by key (`Hasher.keyed`, `compare`).
Two Postgres tables (a Postgres mirror) are summed by Postgres instead, the same way on both
(`sides.PostgresTable.sums`); their differing buckets' rows are compared here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any


def _duckdb() -> Any:
    import duckdb

    return duckdb


def quoted(name: str) -> str:
    """A column name as a DuckDB identifier."""
    return '"' + name.replace('"', '""') + '"'


def _hash(columns: Sequence[str], json_columns: frozenset[str] = frozenset()) -> str:
    """DuckDB's hash of the columns; JSON text as DuckDB prints it parsed (a lake's stream
    path keeps JSON as Spark prints it, `{"a":1}`, where Postgres prints `{"a": 1}`)."""

    def value(c: str) -> str:
        if c not in json_columns:
            return quoted(c)
        i = quoted(c)
        return f"CASE WHEN json_valid({i}) THEN CAST(json({i}) AS VARCHAR) ELSE {i} END"

    return "hash(" + ", ".join(value(c) for c in columns) + ")"


class Hasher:
    """One DuckDB connection hashing Arrow batches of one table (`key`, `columns`)."""

    def __init__(
        self,
        key: Sequence[str],
        columns: Sequence[str],
        buckets: int,
        json_columns: Iterable[str] = (),
    ) -> None:
        self.key, self.columns, self.buckets = list(key), list(columns), int(buckets)
        self.con = _duckdb().connect()
        self._bucket = f"{_hash(self.key)} % {self.buckets}"
        self._row = _hash(self.columns, frozenset(json_columns))

    def close(self) -> None:
        self.con.close()

    def sums(self, batch: Any) -> list[tuple[int, int, int]]:
        """(bucket, rows, sum of row hashes) of each bucket `batch` has rows in."""
        self.con.register("_batch", batch)
        try:
            return [
                (int(b), int(n), int(h))
                for b, n, h in self.con.execute(
                    f"SELECT {self._bucket}, count(*), sum({self._row}) FROM _batch GROUP BY 1"
                ).fetchall()
            ]
        finally:
            self.con.unregister("_batch")

    def keyed(self, batch: Any, buckets: Iterable[int] | None = None) -> Any:
        """The key columns and `_h` (the row's hash) of `batch`'s rows, of `buckets` only
        when given: a pyarrow Table."""
        import pyarrow as pa

        self.con.register("_batch", batch)
        where = ""
        if buckets is not None:
            wanted = sorted({int(b) for b in buckets})
            where = f" WHERE {self._bucket} IN ({', '.join(map(str, wanted or [-1]))})"
        try:
            keys = ", ".join(quoted(k) for k in self.key)
            return pa.table(
                self.con.execute(f"SELECT {keys}, {self._row} AS _h FROM _batch{where}").arrow()
            )
        finally:
            self.con.unregister("_batch")


@dataclass
class Sums:
    """One side's rows and hash sum per bucket."""

    buckets: dict[int, list[int]] = field(default_factory=dict)
    rows: int = 0

    def add(self, parts: list[tuple[int, int, int]]) -> None:
        for bucket, n, h in parts:
            got = self.buckets.setdefault(bucket, [0, 0])
            got[0] += n
            got[1] += h
            self.rows += n

    def as_json(self) -> dict[str, Any]:
        return {"rows": self.rows, "buckets": {str(b): v for b, v in self.buckets.items()}}

    @staticmethod
    def from_json(data: dict[str, Any]) -> Sums:
        return Sums(
            {int(b): [int(n), int(h)] for b, (n, h) in data["buckets"].items()}, data["rows"]
        )

    def different(self, other: Sums) -> set[int]:
        """The buckets whose rows or sums differ between the two sides."""
        both = self.buckets.keys() | other.buckets.keys()
        return {b for b in both if self.buckets.get(b) != other.buckets.get(b)}


Key = tuple[Any, ...]


@dataclass(frozen=True)
class Differences:
    """Keys the two sides disagree on, with the row hashes each side had: a re-check tells
    a row that moved between the reads from a wrong one (`state`)."""

    missing: dict[Key, int]  # in the source, not in the sink: the source's hash
    extra: dict[Key, int]  # in the sink, not in the source: the sink's hash
    different: dict[Key, tuple[int, int]]  # in both, with other values: (source, sink)

    def keys(self) -> list[Key]:
        return [*self.missing, *self.extra, *self.different]

    def state(self, key: Key) -> tuple[int | None, int | None]:
        """The key's row hashes (source, sink) as read; None: that side has no row."""
        if key in self.different:
            return self.different[key]
        return self.missing.get(key), self.extra.get(key)

    def __len__(self) -> int:
        return len(self.missing) + len(self.extra) + len(self.different)


def compare(source: Any, sink: Any, key: Sequence[str]) -> Differences:
    """The keys whose rows differ between two `Hasher.keyed` tables."""
    s = _by_key(source, key)
    t = _by_key(sink, key)
    return Differences(
        missing={k: h for k, h in s.items() if k not in t},
        extra={k: h for k, h in t.items() if k not in s},
        different={k: (h, t[k]) for k, h in s.items() if k in t and t[k] != h},
    )


#: The "hash" of a key a side has more than one row of: equal to no row's hash (a sink
#: with two current versions of a row differs from its source).
SEVERAL = -1


def _by_key(table: Any, key: Sequence[str]) -> dict[Key, int]:
    columns = [table.column(k).to_pylist() for k in key]
    hashes = table.column("_h").to_pylist()
    out: dict[Key, int] = {}
    for k, h in zip(zip(*columns, strict=True), hashes, strict=True):
        out[k] = SEVERAL if k in out else h
    return out
