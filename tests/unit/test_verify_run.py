"""The re-check rule of `walstream verify` (`verify/run.py`): a key is reported only when it
differed twice with its source row unchanged; rows in flight are not; a row that never stops
changing is unsettled. The sides are Arrow tables a fake position changes at each wait."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pytest

from walstream.decode.table_shape import Column, TableShape
from walstream.verify.run import Verification
from walstream.verify.sides import Side

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

    def batches(self) -> Iterator[Any]:
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


def test_an_equal_table_costs_one_pass_and_one_wait():
    base = {f"k{i}": i for i in range(5_000)}
    reads = {"source": 0, "sink": 0}

    class Counted(Rows):
        def batches(self) -> Iterator[Any]:
            reads[self.name] += 1
            yield from super().batches()

    waits = Waits(lambda n: None)
    check = Verification(Counted("source", dict(base)), Counted("sink", dict(base)), waits)  # type: ignore[arg-type]
    result = check.run("public.t", "t", 100_000)  # estimated large: bucket sums
    assert result.equal and result.buckets == 100 and result.buckets_different == 0
    assert (reads, waits.n) == ({"source": 1, "sink": 1}, 1)
