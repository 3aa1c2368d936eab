"""What a Spark task carries and how an executor turns it into Arrow record batches.

A partition holds raw pgoutput messages as compact blobs (one per transaction
piece, with message end offsets) plus the context to decode them: the
relations and the transaction's position. It travels to the executor with all
its messages in one compressed buffer. Decoding and type casting happen
here, on executors, in parallel.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pyspark.sql.datasource import InputPartition

from walstream.capture.wal_buffer import TxnSlice
from walstream.change import PG_EPOCH_UNIX_US, ChangeRow, arrow_schema
from walstream.decode.decoder import ChangeDecoder, RelationInfo, TxnContext
from walstream.decode.types import PgType, TypeRegistry
from walstream.nopandas import no_pandas

ARROW_BATCH_ROWS = 8192


@dataclass(frozen=True)
class PackedSlice:
    lsn: int
    xid: int
    commit_ts: int
    seq: int
    annotations: str | None
    relations: tuple[RelationInfo, ...]
    blob: bytes
    ends: bytes  # array('I') of message end offsets, from `offset`
    at: bytes  # array('Q') of each message's WAL position (a change's own LSN)
    last_commit_lsn: int | None = None  # the end of the commit before this transaction
    delivered_through: int | None = None  # its changes up to here were delivered (TxnSlice)
    offset: int = 0  # where the messages begin in `blob` (an unpickled partition's share one)

    @classmethod
    def pack(cls, piece: TxnSlice) -> PackedSlice:
        ends = array("I")
        pos = 0
        for m in piece.msgs:
            pos += len(m)
            ends.append(pos)
        return cls(
            piece.lsn,
            piece.xid,
            piece.commit_ts,
            piece.seq,
            piece.annotations,
            piece.relations,
            b"".join(piece.msgs),
            ends.tobytes(),
            array("Q", piece.at).tobytes(),
            piece.last_commit_lsn,
            piece.delivered_through,
        )

    @property
    def nbytes(self) -> int:
        """The bytes of this piece's messages."""
        return int.from_bytes(self.ends[-4:], sys.byteorder) if self.ends else 0

    def region(self) -> bytes | memoryview:
        """This piece's messages, back to back."""
        if self.offset == 0 and len(self.blob) == self.nbytes:
            return self.blob
        return memoryview(self.blob)[self.offset : self.offset + self.nbytes]

    def messages(self) -> Iterator[bytes]:
        ends = array("I")
        ends.frombytes(self.ends)
        blob = self.blob
        start = offset = self.offset
        for end in ends:
            end += offset
            yield blob[start:end]
            start = end

    def positions(self) -> array[int]:
        """Each message's WAL position, in the order of `messages`."""
        at = array("Q")
        at.frombytes(self.at)
        return at


#: A partition's messages travel compressed (zstd, its fastest level): Spark holds a task's
#: bytes several times over in the driver JVM (the partition, the serialized task) and the
#: streaming source and the reading worker each hold them once more. Measured: a batch of
#: 200,000 changes a task of ~1.6 MB instead of 10-22 MB, the driver JVM's peak ~200 MB
#: lower, no latency cost (docs/performance-log.md, "a batch's task compressed").
CODEC, CODEC_LEVEL = "zstd", 1


class ChangePartition(InputPartition):
    """The changes of one Spark task: a few MB of raw messages and their context."""

    def __init__(
        self,
        source: str,
        pieces: Sequence[PackedSlice],
        types: Sequence[PgType],
        primary_keys: Mapping[tuple[str, str], Sequence[str]],
    ) -> None:
        super().__init__(None)
        self.source = source
        self.pieces = list(pieces)
        self.types = list(types)
        self.primary_keys = dict(primary_keys)

    def __reduce__(self) -> tuple[Any, ...]:
        # The messages of every piece as one compressed buffer; the pieces as plain tuples:
        # Spark pickles partitions with cloudpickle, whose Python hook runs for every object
        # of a class (a 200k-change batch has thousands of pieces), while tuples take the
        # pickler's C path (about a third less time).
        import pyarrow as pa

        joined = b"".join(p.region() for p in self.pieces)
        packed = pa.Codec(CODEC, CODEC_LEVEL).compress(joined, asbytes=True)
        pieces = [
            (
                p.lsn,
                p.xid,
                p.commit_ts,
                p.seq,
                p.annotations,
                p.relations,
                p.ends,
                p.at,
                p.last_commit_lsn,
                p.delivered_through,
            )
            for p in self.pieces
        ]
        return (
            _unpickled,
            (self.source, pieces, packed, len(joined), self.types, self.primary_keys),
        )

    def __repr__(self) -> str:
        n = sum(p.nbytes for p in self.pieces)
        return f"ChangePartition({self.source}, {len(self.pieces)} pieces, {n} bytes)"


def _unpickled(
    source: str,
    pieces: list[tuple[Any, ...]],
    packed: bytes,
    size: int,
    types: list[PgType],
    primary_keys: dict[tuple[str, str], Sequence[str]],
) -> ChangePartition:
    import pyarrow as pa

    blob = pa.Codec(CODEC).decompress(packed, decompressed_size=size, asbytes=True)
    out, offset = [], 0
    for lsn, xid, commit_ts, seq, notes, relations, ends, at, last, through in pieces:
        piece = PackedSlice(
            lsn, xid, commit_ts, seq, notes, relations, blob, ends, at, last, through, offset
        )
        out.append(piece)
        offset += piece.nbytes
    return ChangePartition(source, out, types, primary_keys)


def group_slices(pieces: Sequence[TxnSlice], target_bytes: int) -> list[list[TxnSlice]]:
    """Cut a batch into partitions of about `target_bytes`, splitting big pieces."""
    groups: list[list[TxnSlice]] = []
    current: list[TxnSlice] = []
    size = 0
    for piece in pieces:
        for part in _split(piece, target_bytes):
            if current and size + part.nbytes > target_bytes:
                groups.append(current)
                current, size = [], 0
            current.append(part)
            size += part.nbytes
    if current:
        groups.append(current)
    return groups


def _split(piece: TxnSlice, target_bytes: int) -> Iterator[TxnSlice]:
    """A piece larger than the target becomes several, each with its starting seq."""
    if piece.nbytes <= target_bytes:
        yield piece
        return
    from walstream.capture.wal_buffer import context_after, row_count

    def part(
        start_seq: int, context: tuple[Any, Any], msgs: list[bytes], size: int, at: list[int]
    ) -> TxnSlice:
        relations, annotations = context
        return replace(
            piece,
            seq=start_seq,
            relations=relations,
            annotations=annotations,
            msgs=msgs,
            nbytes=size,
            at=at,
        )

    msgs: list[bytes] = []
    at: list[int] = []
    size = 0
    seq = start_seq = piece.seq
    context = (piece.relations, piece.annotations)
    for m, lsn in zip(piece.msgs, piece.at, strict=True):
        if msgs and size + len(m) > target_bytes:
            yield part(start_seq, context, msgs, size, at)
            context = context_after(msgs, *context)
            msgs, at, size, start_seq = [], [], 0, seq
        msgs.append(m)
        at.append(lsn)
        size += len(m)
        seq += row_count(m)
    if msgs:
        yield part(start_seq, context, msgs, size, at)


def partition_batches(partition: ChangePartition, size: int = ARROW_BATCH_ROWS) -> Iterator[Any]:
    """A source task's work: the partition's messages decoded into Arrow record batches."""
    return arrow_batches(_decoded(partition), size)


def _decoded(partition: ChangePartition) -> Iterator[list[ChangeRow]]:
    """The rows of each message of the partition (most lists hold one row, some none)."""
    decoder = ChangeDecoder(partition.source, TypeRegistry(partition.types), partition.primary_keys)
    for piece in partition.pieces:
        decoder.set_relations(piece.relations)
        decoder.txn = TxnContext(
            piece.lsn,
            piece.xid,
            piece.commit_ts + PG_EPOCH_UNIX_US,
            piece.seq,
            piece.annotations,
            piece.last_commit_lsn,
        )
        through = piece.delivered_through
        for raw, at in zip(piece.messages(), piece.positions(), strict=True):
            rows = decoder.decode(raw, at)  # decoded all the same: the seq counts them
            if through is None or at > through or not rows:
                yield rows


def arrow_batches(
    row_lists: Iterable[list[ChangeRow]], size: int = ARROW_BATCH_ROWS
) -> Iterator[Any]:
    """Canonical rows, in lists as the decoder returns them, as PyArrow record batches of
    the canonical schema: a batch closes once it holds `size` rows or more (a list is
    never split), with no Python step per row."""
    import pyarrow as pa

    schema = arrow_schema()
    buf: list[ChangeRow] = []
    for rows in row_lists:
        if rows:
            buf += rows
            if len(buf) >= size:
                yield _to_batch(buf, schema, pa)
                buf = []
    if buf:
        yield _to_batch(buf, schema, pa)


def _to_batch(rows: list[ChangeRow], schema: Any, pa: Any) -> Any:
    cols = list(zip(*rows, strict=True))[: len(schema)]  # not `backfill`: always None here
    with no_pandas():
        arrays = [pa.array(col, type=field.type) for col, field in zip(cols, schema, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
