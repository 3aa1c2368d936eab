"""The re-check rule of `walstream verify` (`verify/run.py`): a key is reported only when it
differed twice with neither side's row changed in between; rows in flight are not; a row
that never stops changing is unsettled. The sides are Arrow tables a fake position changes at each wait."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pytest

from walstream.decode.table_shape import Column, TableShape
from walstream.verify.run import Checkpoint, Verification
from walstream.verify.sides import Boundary, Side

SHAPE = TableShape("public", "t", (Column("k", "STRING", False), Column("v", "INT")), ("k",))


class Rows(Side):
    def __init__(self, name: str, rows: dict[str, int]) -> None:
        super().__init__(name, SHAPE)
        self.data = rows

    def _table(self, keep: Callable[[str], bool]) -> Any:
        kept = {k: v for k, v in self.data.items() if keep(k)}
        return pa.table(
            {"k": pa.array(list(kept), pa.string()), "v": pa.array(list(kept.values()), pa.int32())}
        )

    def batches(self, after: Any = None) -> Iterator[Any]:
        assert after is None
        yield self._table(lambda _: True)

    def rows_of(self, keys: Any) -> Any:
        wanted = set(keys.column("k").to_pylist())
        return self._table(lambda k: k in wanted)

    def rows(self, keys: Any) -> Iterator[Any]:
        yield self.rows_of(keys)


class Waits:
    """The sink's pipeline: at each wait, `step(n)` changes the sides."""

    def __init__(self, step: Callable[[int], None]) -> None:
        self.step, self.n = step, 0

    def reach(self) -> int:
        self.n += 1
        self.step(self.n)
        return self.n


@pytest.mark.parametrize("direct_rows", [0, 1_000_000], ids=["buckets", "row by row"])
def test_only_lasting_differences_are_reported(direct_rows):
    base = {f"k{i}": i for i in range(200)}
    source, sink = Rows("source", dict(base)), Rows("sink", dict(base))
    sink.data.pop("k1")  # lost in the sink: missing
    sink.data["k2"] = -2  # changed in the sink: different
    sink.data["zz"] = 0  # only in the sink: extra
    source.data["k3"] = 33  # in flight: the sink applies it at the first wait

    def step(n: int) -> None:
        if n == 1:
            sink.data["k3"] = 33
        # written at every wait, and applied by the sink before it is read: the sink is
        # always one version ahead of the source's read
        source.data["k4"] = sink.data["k4"] = 1000 + n

    check = Verification(source, sink, Waits(step), direct_rows=direct_rows)  # type: ignore[arg-type]
    result = check.run("public.t", "t", len(base))
    assert (result.missing, result.different, result.extra) == ([("k1",)], [("k2",)], [("zz",)])
    assert result.unsettled == [("k4",)]
    assert not result.equal


@pytest.mark.parametrize("direct_rows", [0, 1_000_000], ids=["buckets", "row by row"])
def test_a_sink_read_past_the_source_read_is_not_a_difference(direct_rows):
    """The sink is read after the source, and may have applied a change the source read did
    not see (a topic read to its end while writes flow). Here k5's first sink row differs
    only by what the sink cannot hold (`equivalent`: a negated value), and before the
    re-check reads the sink, k5 is deleted at the source and the sink applies it: the
    source row was the same at both its reads, the sink's was not — k5 is checked again
    (then equal), not reported as missing."""
    base = {f"k{i}": i for i in range(200)}
    source, sink = Rows("source", dict(base)), Rows("sink", dict(base))
    sink.data["k5"] = -5
    first_recheck = 2 if direct_rows else 3  # the waits before it: the sink's pass(es)

    def step(n: int) -> None:
        if n == first_recheck:
            del source.data["k5"], sink.data["k5"]

    def equivalent(src: list[Any], snk: list[Any]) -> set[Any]:
        want = {r["k"]: r["v"] for t in src for r in t.to_pylist()}
        have = {r["k"]: r["v"] for t in snk for r in t.to_pylist()}
        return {(k,) for k, v in have.items() if k in want and v == -want[k]}

    waits = Waits(step)
    check = Verification(source, sink, waits, direct_rows=direct_rows, equivalent=equivalent)  # type: ignore[arg-type]
    result = check.run("public.t", "t", len(base))
    assert result.equal and not result.unsettled, result
    assert waits.n == first_recheck + 1  # k5 was looked up a second time


def test_an_equal_table_costs_one_pass_and_one_wait():
    base = {f"k{i}": i for i in range(5_000)}
    reads = {"source": 0, "sink": 0}

    class Counted(Rows):
        def batches(self, after: Any = None) -> Iterator[Any]:
            reads[self.name] += 1
            yield from super().batches(after)

    waits = Waits(lambda n: None)
    check = Verification(Counted("source", dict(base)), Counted("sink", dict(base)), waits)  # type: ignore[arg-type]
    result = check.run("public.t", "t", 100_000)  # estimated large: bucket sums
    assert result.equal and result.buckets == 100 and result.buckets_different == 0
    assert (reads, waits.n) == ({"source": 1, "sink": 1}, 1)


class Ranges(Rows):
    """A side read in key ranges of 50 keys, as a Postgres table is: a `Boundary` after
    each, and `after` goes on from one; `read` counts the rows each pass read."""

    def __init__(self, name: str, rows: dict[str, int]) -> None:
        super().__init__(name, rows)
        self.read: list[int] = []

    def batches(self, after: Any = None) -> Iterator[Any]:
        keys = sorted(k for k in self.data if after is None or k > after[0])
        self.read.append(0)
        for i in range(0, len(keys), 50):
            part = set(keys[i : i + 50])
            self.read[-1] += len(part)
            yield self._table(lambda k, part=part: k in part)  # type: ignore[misc]
            yield Boundary((max(part),))


class Kept(Checkpoint):
    """A checkpoint in memory that stops the pass (as a kill would) at its `stop_at`th save."""

    def __init__(self, stop_at: int | None) -> None:
        self.state: dict[str, Any] | None = None
        self.saves, self.stop_at = 0, stop_at

    def load(self, table: str) -> Any:
        return self.state

    def save(self, state: dict[str, Any], force: bool = False) -> None:
        self.state = state
        self.saves += 1
        if self.saves == self.stop_at:
            raise KeyboardInterrupt


@pytest.mark.parametrize(
    "stop_at", [3, 11, 13], ids=["in the source pass", "before the sink's", "in the sink pass"]
)
def test_a_pass_cut_short_resumes_after_its_last_key_range(stop_at):
    base = {f"k{i:04}": i for i in range(500)}  # 10 ranges: saves 1-10, 11 (sink's), 12-21
    sink_rows = dict(base)
    sink_rows.pop("k0007")
    sink_rows["k0300"] = -1
    source, sink = Ranges("source", base), Ranges("sink", sink_rows)
    kept = Kept(stop_at)
    with pytest.raises(KeyboardInterrupt):
        Verification(source, sink, Waits(lambda n: None), checkpoint=kept).run(
            "public.t", "t", 10**6
        )
    assert kept.state is not None
    kept.stop_at = None
    source.read, sink.read = [], []  # what the resumed run reads
    result = Verification(source, sink, Waits(lambda n: None), checkpoint=kept).run(
        "public.t", "t", 10**6
    )
    assert (result.missing, result.different, result.extra) == ([("k0007",)], [("k0300",)], [])
    assert (result.source_rows, result.sink_rows) == (500, 499)
    assert result.buckets == 1000  # the cut-short run's
    # the first pass of each side went on after the last range saved (the second read
    # is the rows of the differing buckets)
    source_first, sink_first = {3: (350, 499), 11: (None, 499), 13: (None, 399)}[stop_at]
    assert sink.read[0] == sink_first
    if source_first is None:  # the source pass was done: only the differing buckets read
        assert len(source.read) == 1
    else:
        assert source.read[0] == source_first
