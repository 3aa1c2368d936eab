"""A source partition survives the trip to an executor (Spark pickles it with cloudpickle)."""

from __future__ import annotations

import json
import struct

from pyspark import cloudpickle

from walstream.capture.wal_buffer import TxnSlice
from walstream.decode import pgoutput as po
from walstream.decode.relations import RelationInfo
from walstream.source.partition import (
    ChangePartition,
    PackedSlice,
    group_slices,
    partition_batches,
)

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
        TxnSlice(1000, 7, 5_000_000, 0, None, (REL,), [insert(16384, b"1", b"a")], 0, [990]),
        TxnSlice(
            2000, 8, 6_000_000, 3, '{"by":"me"}', (REL,),
            [insert(16384, b"2", b"b"), insert(16384, b"3", b"c'\xc3\xa9")], 0,
            [1900, 1 << 40],
        ),
    ]  # fmt: skip
    partition = ChangePartition("app", [PackedSlice.pack(p) for p in pieces], [], {})
    back = cloudpickle.loads(cloudpickle.dumps(partition))

    assert isinstance(back, ChangePartition)
    assert (back.source, back.types, back.primary_keys) == ("app", [], {})
    assert [(p.lsn, p.xid, p.commit_ts, p.seq, p.annotations, p.relations, list(p.messages()))
            for p in back.pieces] == [
        (p.lsn, p.xid, p.commit_ts, p.seq, p.annotations, p.relations, list(p.msgs))
        for p in pieces
    ]  # fmt: skip
    rows = [r for b in partition_batches(back) for r in b.to_pylist()]
    assert [
        (r["lsn"], r["seq"], r["xid"], r["pk"], r["record"], r["annotations"], r["change_lsn"])
        for r in rows
    ] == [
        (1000, 0, 7, ["1"], '{"id":1,"note":"a"}', None, 990),
        (2000, 3, 8, ["2"], '{"id":2,"note":"b"}', '{"by":"me"}', 1900),
        (2000, 4, 8, ["3"], '{"id":3,"note":"c\'é"}', '{"by":"me"}', 1 << 40),
    ]
    assert rows == [r for b in partition_batches(partition) for r in b.to_pylist()]


def test_a_partition_travels_compressed_and_pickles_again_the_same():
    rows = [insert(16384, str(i).encode(), b"note %d " % i * 5) for i in range(2000)]
    pieces = [TxnSlice(1000 + i, i, 5_000_000, 0, None, (REL,), rows[i * 100 : i * 100 + 100], 0,
                       list(range(i * 100, i * 100 + 100))) for i in range(20)]  # fmt: skip
    partition = ChangePartition("app", [PackedSlice.pack(p) for p in pieces], [], {})
    raw = sum(len(m) for m in rows)
    sent = cloudpickle.dumps(partition)
    assert len(sent) < raw / 2, (len(sent), raw)  # the messages went compressed
    back = cloudpickle.loads(sent)
    assert [list(p.messages()) for p in back.pieces] == [p.msgs for p in pieces]
    assert repr(back) == repr(partition) == f"ChangePartition(app, 20 pieces, {raw} bytes)"
    again = cloudpickle.loads(cloudpickle.dumps(back))  # pieces that share one buffer
    assert [list(p.messages()) for p in again.pieces] == [p.msgs for p in pieces]
    rows_of = [r for b in partition_batches(again) for r in b.to_pylist()]
    assert [r["record"] for r in rows_of] == [
        json.dumps({"id": i, "note": f"note {i} " * 5}, separators=(",", ":")) for i in range(2000)
    ]
    assert [r["change_lsn"] for r in rows_of] == list(range(2000))  # each its own position


def test_a_piece_cut_in_parts_keeps_each_messages_position():
    rows = [insert(16384, str(i).encode(), b"x" * 40) for i in range(50)]
    piece = TxnSlice(1000, 1, 5_000_000, 0, None, (REL,), rows, sum(map(len, rows)),
                     [500 + 3 * i for i in range(50)])  # fmt: skip
    groups = group_slices([piece], 400)
    parts = [p for g in groups for p in g]
    assert len(parts) > 5
    assert [m for p in parts for m in p.msgs] == rows
    assert [a for p in parts for a in p.at] == piece.at
    assert all(len(p.at) == len(p.msgs) for p in parts)


def test_changes_another_tool_delivered_are_decoded_but_not_sent():
    """A handover's transaction: its changes at or before `delivered_through` count for the
    seq (the cursor stays the WAL's) but are not rows of the batch."""
    rows = [insert(16384, str(i).encode(), b"x") for i in range(5)]
    piece = TxnSlice(1000, 1, 5_000_000, 0, None, (REL,), rows, sum(map(len, rows)),
                     [900, 910, 920, 930, 940], delivered_through=920)  # fmt: skip
    partition = ChangePartition("app", [PackedSlice.pack(piece)], [], {})
    back = cloudpickle.loads(cloudpickle.dumps(partition))
    got = [
        (r["seq"], r["pk"], r["change_lsn"]) for b in partition_batches(back) for r in b.to_pylist()
    ]
    assert got == [(3, ["3"], 930), (4, ["4"], 940)]
