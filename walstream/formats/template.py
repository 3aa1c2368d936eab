"""The template rendering of every format: a staged chunk's rows as a sink's messages,
built in Arrow (no Spark SQL) from the format's own Python rendering.

A read row's message differs from the chunk's other rows in three places only: its
`record`, its `seq` and its idempotency key. The rest (source, table, commit time,
LSN, the sink's name) is the chunk's. `ReadTemplate` formats one row with the format's
own Python function with a marker in each of those places and cuts the
text there. Joining the pieces with each row's values gives the bytes that function
gives, with one Arrow kernel per piece.

The idempotency key is `base64("read:<backfill>:<pk as JSON>")` (`keys.py`): the pk's
JSON is built in Arrow, then base64 runs once per row in C (`binascii`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from walstream.change import ChangeRow, read_idempotency_key
from walstream.formats import formatter
from walstream.formats.keys import idempotency_keys, message_keys

#: Markers no real row holds: a record's text is JSON, a seq fits in 32 bits.
_RECORD = "\x00walstream-record\x00"
_SEQ = 98765432109876543
_PK = "\x00walstream-pk\x00"

#: The columns `Sink.deliver_columns` reads, as `read_batch` makes them.
COLUMNS = ("lsn", "seq", "committed_at", "schema", "table", "action", "_key", "_ikey", "_message")


@dataclass(frozen=True)
class ReadTemplate:
    """The message of one chunk's read rows, cut where the rows differ."""

    #: (text before, which value: "record" | "seq" | "ikey"), in order; then `tail`.
    parts: tuple[tuple[str, str], ...]
    tail: str
    backfill: int

    @classmethod
    def of(
        cls,
        fmt: str,
        *,
        sink: str,
        db: str,
        source: str,
        schema: str,
        table: str,
        backfill: int,
        lsn: int,
        committed_us: int,
    ) -> ReadTemplate | None:
        """The template, or None when the format does not hold each value once as it is
        (then Spark formats the rows)."""
        row = ChangeRow(
            source,
            lsn,
            _SEQ,
            None,
            committed_us,
            "read",
            schema,
            table,
            [_PK],
            _RECORD,
            None,
            None,
            None,
            backfill=backfill,
        )
        made = formatter(fmt, sink=sink, db=db)
        if made is None:  # a format made as records (debezium)
            return None
        text = made(row)
        markers = {
            "record": _RECORD,
            "seq": str(_SEQ),
            "ikey": read_idempotency_key(backfill, [_PK]),
        }
        found = []
        for kind, marker in markers.items():
            n = text.count(marker)
            if n > 1:
                return None
            if n == 1:
                found.append((text.index(marker), kind, marker))
        if not any(kind == "record" for _, kind, _ in found):
            return None
        parts, at = [], 0
        for pos, kind, marker in sorted(found):
            parts.append((text[at:pos], kind))
            at = pos + len(marker)
        return cls(tuple(parts), text[at:], backfill)

    def messages(self, record: Any, seq: Any, ikey: Any) -> Any:
        """The rows' messages: `record` (JSON text), `seq` (int32) and `ikey` (their
        idempotency keys) are Arrow arrays of one length."""
        import pyarrow as pa
        import pyarrow.compute as pc

        values = {"record": record, "seq": seq.cast(pa.string()), "ikey": ikey}
        pieces: list[Any] = []
        for before, kind in self.parts:
            pieces += [before, values[kind]]
        return pc.binary_join_element_wise(*pieces, self.tail, "")


def read_batch(
    template: ReadTemplate,
    rows: Any,
    *,
    schema: str,
    table: str,
    lsn: int,
    high_seq: int,
    committed_us: int,
) -> Any:
    """Staged rows (`pk`, `record`, `ord`) as a RecordBatch of `COLUMNS`: each at the high
    watermark's place (lsn; seq = the watermark's seq + 1 + the row's ordinal)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = rows.num_rows
    seq = pc.add(rows["ord"].cast(pa.int32()), pa.scalar(high_seq + 1, pa.int32()))
    pk, record = rows["pk"], rows["record"]
    ikey = idempotency_keys(template.backfill, pk)
    return pa.RecordBatch.from_arrays(
        [
            pa.repeat(pa.scalar(lsn, pa.int64()), n),
            seq.combine_chunks() if isinstance(seq, pa.ChunkedArray) else seq,
            pa.repeat(pa.scalar(committed_us, pa.timestamp("us", tz="UTC")), n),
            pa.repeat(pa.scalar(schema), n),
            pa.repeat(pa.scalar(table), n),
            pa.repeat(pa.scalar("read"), n),
            _array(message_keys(pk)),
            ikey,
            _array(template.messages(record, seq, ikey)),
        ],
        names=list(COLUMNS),
    )


def _array(values: Any) -> Any:
    import pyarrow as pa

    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
