"""A source partition survives the trip to an executor (Spark pickles it with cloudpickle)."""

from __future__ import annotations

import struct

from pyspark import cloudpickle

from walstream.postgres import pgoutput as po
from walstream.postgres.relations import RelationInfo
from walstream.postgres.wal_buffer import TxnSlice
from walstream.spark.partition import ChangePartition, PackedSlice, partition_batches

REL = RelationInfo(
    16384, "public", "orders", "d",
    (po.Column("id", 20, -1, True), po.Column("note", 25, -1, False)), ("id",),
)  # fmt: skip


def insert(oid: int, *values: bytes) -> bytes:
    out = b"I" + struct.pack("!I", oid) + b"N" + struct.pack("!h", len(values))
    for v in values:
        out += b"t" + struct.pack("!i", len(v)) + v
    return out


def test_a_pickled_partition_decodes_to_the_same_rows():
    pieces = [
        TxnSlice(1000, 7, 5_000_000, 0, None, (REL,), [insert(16384, b"1", b"a")], 0),
        TxnSlice(
            2000, 8, 6_000_000, 3, '{"by":"me"}', (REL,),
            [insert(16384, b"2", b"b"), insert(16384, b"3", b"c'\xc3\xa9")], 0,
        ),
    ]  # fmt: skip
    partition = ChangePartition("app", [PackedSlice.pack(p) for p in pieces], [], {})
    back = cloudpickle.loads(cloudpickle.dumps(partition))

    assert isinstance(back, ChangePartition)
    assert (back.source, back.pieces, back.types, back.primary_keys) == (
        "app", partition.pieces, [], {},
    )  # fmt: skip
    rows = [r for b in partition_batches(back) for r in b.to_pylist()]
    assert [
        (r["lsn"], r["seq"], r["xid"], r["pk"], r["record"], r["annotations"]) for r in rows
    ] == [
        (1000, 0, 7, ["1"], '{"id":1,"note":"a"}', None),
        (2000, 3, 8, ["2"], '{"id":2,"note":"b"}', '{"by":"me"}'),
        (2000, 4, 8, ["3"], '{"id":3,"note":"c\'é"}', '{"by":"me"}'),
    ]
    assert rows == [r for b in partition_batches(partition) for r in b.to_pylist()]
