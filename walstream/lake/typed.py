"""Typed rows: a batch's change rows, and a backfill's staged chunks, as lake columns.

The stream's rows are typed on the executors with one `from_json` of `record` (and
`old`) per table (`typed_rows`), collected as Arrow (`to_batch`). A value that does
not fit its column type (numeric NaN into a decimal, an infinite date, a
multi-dimensional array) must not become NULL: columns of those types are parsed as
text and then `try_cast`, and a value present as text but NULL once cast stops the
batch with an error naming the table, column and change (the sink pauses).

A table whose columns pyarrow's JSON reader types exactly as that (integers, doubles,
decimals, booleans, text, timestamps, dates; arrays of integers, doubles, decimals,
booleans and text) is typed on the driver instead, from its change rows collected as
they are (`batch_rows`, `arrow_typed`): the same columns for a fraction of the cost.
pyarrow refuses what it cannot type, and then the JVM's typing takes the batch, so a
value lost is named as above.

A lake sink's backfill rows arrive typed already (`backfill/typed.py`): `place` finds
the keys that changed in the windows of a batch's chunks; `Placed.rows` reads the staged
chunks, drops those keys' rows and gives the rest their places in the batch, or, when
nothing is dropped, `Placed.files` lets the sink commit the staged files as they are.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from walstream.backfill.dblog import keep_typed
from walstream.backfill.typed import TypedChunk, TypedReads
from walstream.decode.table_shape import RENAMED_FIX, TableShape
from walstream.engine.frames import column_seq
from walstream.errors import SinkError

log = logging.getLogger(__name__)

#: Column types a JSON value may fail to fit (NaN, infinity, BC dates, nested arrays):
#: parsed as text first, then cast, so a failure is seen instead of becoming NULL.
_FALLIBLE = ("DECIMAL", "DATE", "TIMESTAMP", "ARRAY")


def _typed(
    parsed: Any, shape: TableShape, json_from: tuple[str, str | None] | None = None
) -> tuple[Any, list[Any]]:
    """(the row as a struct of the shape's types, the columns whose value was lost) from
    `parsed`: the JSON parsed with fallible columns as text. `json_from`: (the change
    column `parsed` came from, the column listing its JSON nulls) to give json/jsonb
    columns their JSON text (`_json_text`); without it they are Spark's text of the value."""
    from pyspark.sql import functions as F

    fields, lost = [], []
    for c in shape.columns:
        raw = parsed[c.name]
        if json_from is not None and shape.pg_types.get(c.name) in ("json", "jsonb"):
            fields.append(_json_text(raw, c.name, *json_from).alias(c.name))
            continue
        if not c.type.startswith(_FALLIBLE):
            fields.append(raw.alias(c.name))
            continue
        if c.type.startswith("ARRAY"):
            typed = F.from_json(raw, c.type)
            texts = F.from_json(raw, "ARRAY<STRING>")
            count = lambda a: F.size(F.array_compact(a))  # noqa: E731
            failed = raw.isNotNull() & (typed.isNull() | (count(texts) != count(typed)))
        else:
            typed = raw.try_cast(c.type.lower())  # NULL, not an error, when it does not fit
            failed = raw.isNotNull() & typed.isNull()
        fields.append(typed.alias(c.name))
        lost.append(F.when(failed, F.lit(c.name)))
    return F.struct(*fields), lost


def _json_text(text: Any, name: str, source: str, nulls: str | None) -> Any:
    """A json/jsonb column's value as its JSON text. `text` is Spark's text of it: a JSON
    string unquoted (`"123"` and `123` alike), the JSON null as NULL. Parsed once more as a
    VARIANT, a scalar is its JSON (a string quoted, a number as written up to 38 digits);
    an object or array keeps Spark's text (a variant would fail on duplicate keys); the
    JSON null is `null` when `nulls` lists the column (the decoder's `json_nulls`), else
    NULL: in `record` and `old` it reads like SQL NULL."""
    from pyspark.sql import functions as F

    value = F.from_json(F.col(source), f"`{name.replace('`', '``')}` VARIANT")[name]
    kind = F.schema_of_variant(value)
    scalar = value.isNotNull() & ~kind.startswith("OBJECT") & ~kind.startswith("ARRAY")
    out = F.when(scalar & (kind != "VOID"), F.to_json(value)).otherwise(text)
    if nulls is None:
        return out
    listed = F.array_contains(F.col(nulls), name)  # NULL (no list): not listed
    return F.when(listed, F.lit("null")).otherwise(out)


def _parses(parse: str, *sources: str) -> tuple[list[Any], list[Any]]:
    """(the columns that parse each of `sources`, JSON text columns, once, as struct
    columns of their own; those struct columns), to select in a projection below the one
    that takes them apart. Fields taken from `from_json(...)` itself are each rewritten by
    Spark's optimizer into a parse of their own (`OptimizeJsonExprs`): the whole `record`
    parsed once a column (85 µs a change of eight columns, against 12 µs)."""
    from pyspark.sql import functions as F

    names = [f"_parsed_{s}" for s in sources]
    parsed = [F.from_json(F.col(s), parse).alias(n) for s, n in zip(sources, names, strict=True)]
    return parsed, [F.col(n) for n in names]


def _fallible(shape: TableShape) -> list[str]:
    """The columns `_typed` checks, in its order."""
    return [c.name for c in shape.columns if c.type.startswith(_FALLIBLE)]


#: Marks a `_lost` entry that names another table's change (see `typed_rows`' `only`).
OTHER_TABLE = "\x1ftable "


def typed_rows(df: Any, shape: TableShape, only: bool = False, whole_before: bool = False) -> Any:
    """The table's rows of `df` as the TableBatch columns, plus `_lost` (see module doc).
    `_before` is `old` typed: mirror and history read a key change's old key from it.
    `whole_before`: every value of `_before` must fit (a changelog table keeps it); else
    only its key's. `only`: `df` should hold this table's changes only (the publication
    has no other): a change of another name (a table renamed or dropped since) stops the
    batch instead of being left out."""
    from pyspark.sql import DataFrame

    parses, same, columns = _projection(df.sparkSession, shape, only, whole_before)
    jdf = df._jdf.select(parses)
    if not only:
        jdf = jdf.filter(same)
    return DataFrame(jdf.select(columns), df.sparkSession)


#: `_projection`'s columns by table shape and options, in the Spark application they were
#: made in: building them is some 300 Py4J calls, a quarter of a second a batch.
_PROJECTIONS: dict[tuple[Any, ...], tuple[Any, Any, Any]] = {}


def _projection(
    spark: Any, shape: TableShape, only: bool, whole_before: bool
) -> tuple[Any, Any, Any]:
    """(the JVM's columns that add the parses of `record` and `old` to a change row's, its
    test that a change is of the shape's table, the columns of `typed_rows`), made once
    per shape and options, as `SinkSteps` keeps a message sink's."""
    from pyspark.sql import functions as F

    key = (
        spark.sparkContext.applicationId,
        shape,
        tuple(sorted(shape.pg_types.items())),
        only,
        whole_before,
    )
    made = _PROJECTIONS.get(key)
    if made is None:
        if len(_PROJECTIONS) >= 256:  # shapes of tables since changed or gone
            _PROJECTIONS.clear()
        parses, same, columns = _make_projection(shape, only, whole_before)
        made = _PROJECTIONS[key] = (
            column_seq(spark, [F.col("*"), *parses]),
            same._jc,
            column_seq(spark, columns),
        )
    return made


def _make_projection(
    shape: TableShape, only: bool, whole_before: bool
) -> tuple[list[Any], Any, list[Any]]:
    """`_projection`'s parts as Python columns."""
    from pyspark.sql import functions as F

    parses, (record, before) = _parses(shape.ddl(as_text=_FALLIBLE), "record", "old")
    row, lost = _typed(record, shape, ("record", "json_nulls"))
    # `_before`'s json text is written only by a changelog: no second parse of `old` else
    old, lost_old = _typed(before, shape, ("old", None) if whole_before else None)
    if not whole_before:
        lost_old = [x for x, c in zip(lost_old, _fallible(shape), strict=True) if c in shape.key]
    lost += [F.when(x.isNotNull(), F.concat(F.lit("old "), x)) for x in lost_old]
    same = (F.col("schema") == shape.schema) & (F.col("table") == shape.table)
    if only:
        lost.append(
            F.when(~same, F.concat(F.lit(OTHER_TABLE), F.col("schema"), F.lit("."), F.col("table")))
        )
    # array_compact, not filter(..., x -> x IS NOT NULL): a lambda is interpreted row by row
    # (a third of the typing's time on an 8-column table)
    checks = F.array_compact(F.array(*lost)) if lost else F.array()
    return (
        parses,
        same,
        [
            F.col("action").alias("_op"),
            F.col("lsn").alias("_lsn"),
            F.col("seq").alias("_seq"),
            F.col("committed_at").alias("_committed_at"),
            F.col("unchanged_toast").alias("_toast"),
            row.alias("_row"),
            old.alias("_before"),
            checks.cast("array<string>").alias("_lost"),
        ],
    )


def batch_rows(
    df: Any,
    shape: TableShape,
    only: bool = False,
    whole_before: bool = False,
    raw: Any = None,
) -> Any:
    """`typed_rows` of `df`, collected as Arrow. A table whose every column pyarrow types
    as Spark would (`arrow_typable`) has its change rows collected as they are and typed
    on the driver (`arrow_typed`): the JVM's typing cost 21 µs of its CPU a change, more
    than all the rest of a mirror's batch. A value pyarrow refuses sends the batch to the
    JVM's typing, which keeps it or names what its column cannot hold. `raw`: `df`'s rows
    collected already (`RAW_COLUMNS`, every table's), where this table's are taken from."""
    if arrow_typable(shape):
        from pyspark.sql import functions as F

        if raw is not None:
            rows = raw.filter(_of_table(raw, shape))
        elif only:
            rows = df.select(*RAW_COLUMNS).toArrow()
        else:
            same = (F.col("schema") == shape.schema) & (F.col("table") == shape.table)
            rows = df.where(same).select(*RAW_COLUMNS).toArrow()
        typed = arrow_typed(rows, shape, only)
        if typed is not None:
            return typed
    return typed_rows(df, shape, only, whole_before).toArrow()


#: The change row's columns `arrow_typed` reads.
RAW_COLUMNS = (
    "action",
    "lsn",
    "seq",
    "committed_at",
    "unchanged_toast",
    "record",
    "old",
    "schema",
    "table",
)
#: Lake types pyarrow's JSON reader gives as Spark's `from_json` does, refusing (never
#: nulling) a value it cannot type: a number where a string belongs, NaN, infinity, a
#: year past 9999, a nested array. DATE is read as text and cast.
_ARROW_TYPES = frozenset(
    ("INT", "BIGINT", "DOUBLE", "BOOLEAN", "STRING", "TIMESTAMP", "TIMESTAMP_NTZ", "DATE")
)
_ARROW_ELEMENTS = frozenset(("INT", "BIGINT", "DOUBLE", "BOOLEAN", "STRING"))


def arrow_typable(shape: TableShape) -> bool:
    """Every column of the shape is typed by pyarrow as by Spark (json/jsonb are not: their
    text is made from the parsed value, see `_json_text`). A DECIMAL too, alone or in an
    array: pyarrow reads the decoder's exact digits and refuses digits past the column's
    scale or precision, where Spark's cast would round or fail."""
    for c in shape.columns:
        element = c.type[6:-1] if c.type.startswith("ARRAY<") else None
        if (element or c.type).startswith("DECIMAL("):
            continue
        if element is not None and element not in _ARROW_ELEMENTS:
            return False
        if element is None and c.type not in _ARROW_TYPES:
            return False
        if shape.pg_types.get(c.name) in ("json", "jsonb"):
            return False
    return True


def _arrow_field(name: str, ddl: str) -> Any:
    """A column's field as Spark's `toArrow` gives it (a list's element is `element`)."""
    import pyarrow as pa

    from walstream.decode.table_shape import arrow_type

    if ddl.startswith("ARRAY<"):
        return pa.field(name, pa.list_(pa.field("element", arrow_type(ddl[6:-1]))))
    return pa.field(name, arrow_type(ddl))


def arrow_typed(raw: Any, shape: TableShape, only: bool) -> Any | None:
    """`typed_rows`' columns from the collected change rows `raw` (`RAW_COLUMNS`), typed by
    pyarrow; None when a value of `record` or `old` does not parse as its column type
    (every value of `old`, where `typed_rows` checks its key's unless `whole_before`).
    `only`: a change of another table is marked in `_lost` as `typed_rows` marks it."""
    import pyarrow as pa
    import pyarrow.compute as pc

    fields = [_arrow_field(c.name, c.type) for c in shape.columns]
    try:
        row = _parsed(raw["record"], fields)
        before = _parsed(raw["old"], fields)
    except pa.ArrowException as exc:  # the JVM types the batch, and names a value lost
        log.debug("%s.%s: typed by the JVM: %s", shape.schema, shape.table, exc)
        return None
    none: Any = pa.scalar([], pa.list_(pa.string()))
    lost = pa.repeat(none, raw.num_rows) if raw.num_rows else pa.array([], none.type)
    if only:
        other = pc.invert(_of_table(raw, shape))
        if pc.any(other).as_py():
            names = pc.binary_join_element_wise(OTHER_TABLE, raw["schema"], ".", raw["table"], "")
            lost = pa.array(
                [
                    [n] if o else []
                    for o, n in zip(other.to_pylist(), names.to_pylist(), strict=True)
                ],
                pa.list_(pa.string()),
            )
    return pa.table(
        {
            "_op": raw["action"],
            "_lsn": raw["lsn"],
            "_seq": raw["seq"],
            "_committed_at": raw["committed_at"],
            "_toast": raw["unchanged_toast"],
            "_row": row,
            "_before": before,
            "_lost": lost,
        }
    )


def _of_table(raw: Any, shape: TableShape) -> Any:
    """Which of the collected change rows `raw` are changes of the shape's table."""
    import pyarrow.compute as pc

    return pc.and_(pc.equal(raw["schema"], shape.schema), pc.equal(raw["table"], shape.table))


def _parsed(texts: Any, fields: list[Any]) -> Any:
    """A column of JSON objects as a struct of `fields` (a NULL's fields NULL, as Spark's
    `struct` of them gives), read by pyarrow's JSON reader in one pass over their text
    (each object on a line of its own: JSON text has no raw newline); ArrowInvalid for a
    value that does not parse as its field's type. DATE fields are read as text and cast."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as pj

    texts = texts.combine_chunks() if isinstance(texts, pa.ChunkedArray) else texts
    n = len(texts)
    as_read = [pa.field(f.name, pa.string()) if f.type == pa.date32() else f for f in fields]
    if n == 0 or texts.null_count == n:
        return pa.StructArray.from_arrays([pa.nulls(n, f.type) for f in fields], fields=fields)
    lines = pc.binary_join_element_wise(pc.fill_null(texts, "{}"), "", "\n")
    wide = pa.types.is_large_string(lines.type)
    offsets = pa.Array.from_buffers(
        pa.int64() if wide else pa.int32(), n + 1, [None, lines.buffers()[1]], offset=lines.offset
    )
    start, end = offsets[0].as_py(), offsets[n].as_py()
    read = pj.read_json(
        pa.BufferReader(lines.buffers()[2][start:end]),
        read_options=pj.ReadOptions(block_size=max(1 << 20, (end - start) // 4 + 1)),
        parse_options=pj.ParseOptions(
            explicit_schema=pa.schema(as_read), unexpected_field_behavior="ignore"
        ),
    )
    if read.num_rows != n:  # not one object a line: let the JVM read them
        raise pa.ArrowInvalid(f"{read.num_rows} JSON objects for {n} rows")
    columns = [
        read[f.name].combine_chunks()
        if f.type != pa.date32()
        else pc.cast(read[f.name].combine_chunks(), pa.date32())
        for f in fields
    ]
    return pa.StructArray.from_arrays(columns, fields=fields)


def to_batch(arrow: Any, shape: TableShape) -> Any:
    """The collected Arrow of `typed_rows` as a TableBatch's rows, in WAL order; a value
    lost to its column type stops here."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if arrow.num_rows and pc.any(pc.greater(pc.list_value_length(arrow["_lost"]), 0)).as_py():
        at = pc.index(pc.greater(pc.list_value_length(arrow["_lost"]), 0), True).as_py()
        row = arrow.slice(at, 1).to_pylist()[0]
        other = next((x for x in row["_lost"] if x.startswith(OTHER_TABLE)), None)
        if other is not None:
            raise SinkError(
                f"lake: the batch has a change of {other[len(OTHER_TABLE) :]} "
                f"({row['_lsn']}:{row['_seq']}), a table the source's publication no longer "
                f"has under that name (renamed or dropped since), beside "
                f"{shape.schema}.{shape.table}: it is not left out, so the sink stops here",
                RENAMED_FIX,
                retryable=False,
            )
        cols = ", ".join(
            f"{c} (Postgres {shape.pg_types.get(c.split()[-1], '?')})" for c in row["_lost"]
        )
        raise SinkError(
            f"lake: {shape.schema}.{shape.table} change {row['_lsn']}:{row['_seq']} has a value "
            f"its lake column cannot hold: {cols}; it is not written as NULL",
            "leave the column out of the sink (columns: exclude: [...]), or change the value "
            "(numeric NaN, infinite dates and multi-dimensional arrays have no typed column)",
            retryable=False,
        )
    arrow = arrow.sort_by([("_lsn", "ascending"), ("_seq", "ascending")])
    row = arrow["_row"].combine_chunks()
    columns = dict(zip(shape.names, row.flatten(), strict=True))
    out = {n: arrow[n] for n in ("_op", "_lsn", "_seq", "_committed_at", "_toast")}
    out.update(columns)
    out["_before"] = arrow["_before"]
    return pa.table(out)


@dataclass
class Placed:
    """The backfill chunks a batch places in one table, and what their windows drop."""

    shape: TableShape
    chunks: list[TypedChunk]
    truncated: set[tuple[int, int]]  # chunks whose window has a truncate: all rows go
    changed: dict[tuple[int, int], Any]  # chunk -> the keys changed in its window

    @property
    def whole(self) -> bool:
        """Every staged row goes into the table as it is (nothing changed in the windows)."""
        return not self.truncated and not self.changed

    def files(self) -> tuple[tuple[str, str], ...]:
        """(staged file, a name unique to the chunk attempt) of each chunk."""
        return tuple(
            (c.path, f"walstream-backfill-{c.backfill}-{c.chunk}-{c.attempt}.parquet")
            for c in self.chunks
        )

    @property
    def newest_us(self) -> int:
        return max(c.committed_us for c in self.chunks)

    def rows(self) -> Any:
        """The rows as a TableBatch's rows (WAL order), without those whose key changed in
        their chunk's window or all of a chunk whose window has a truncate (the DBLog
        rule, `backfill/dblog.py`); None when none are left."""
        import pyarrow as pa
        import pyarrow.compute as pc

        schema = self.shape.arrow_schema()
        parts = []
        for c in self.chunks:
            if (c.backfill, c.chunk) in self.truncated:
                continue
            data = _conform(_read_staged(c.path), schema, c)
            n = data.num_rows
            data = data.append_column("_ord", pa.array(range(n), pa.int32()))
            data = keep_typed(data, self.changed.get((c.backfill, c.chunk)), list(self.shape.key))
            n = data.num_rows
            if n == 0:
                continue
            at = pa.scalar(c.committed_us, pa.timestamp("us", "UTC"))
            meta = {
                "_op": pa.array(["read"] * n, pa.string()),
                "_lsn": pa.repeat(pa.scalar(c.lsn, pa.int64()), n),
                "_seq": pc.add(data["_ord"], pa.scalar(c.seq + 1, pa.int32())),
                "_committed_at": pa.repeat(at, n),
                "_toast": pa.nulls(n, pa.list_(pa.string())),
            }
            columns = {f.name: data[f.name] for f in schema}
            before = {"_before": pa.nulls(n, pa.struct(list(schema)))}
            parts.append(pa.table({**meta, **columns, **before}))
        return pa.concat_tables(parts) if parts else None


def place(reads: TypedReads, shape: TableShape, skip_before: int | None = None) -> Placed | None:
    """The chunks of `reads` for the shape's table (None when none), with their windows'
    changed keys (one small Spark job)."""
    chunks = [
        c
        for c in reads.chunks
        if (c.schema, c.table) == (shape.schema, shape.table)
        and (skip_before is None or c.lsn >= skip_before)
    ]
    if not chunks:
        return None
    truncated, changed = _window_keys(reads, shape, chunks, shape.arrow_schema())
    return Placed(shape, chunks, truncated, changed)


def _window_keys(
    reads: TypedReads, shape: TableShape, chunks: list[TypedChunk], schema: Any
) -> tuple[set[tuple[int, int]], dict[tuple[int, int], Any]]:
    """(chunks whose window has a truncate, {chunk: the keys changed in its window}): the
    stream's changes typed like its rows are (one small job), keys from `record` (a
    delete's too) and, for an update that moved the key, `old`."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyspark.sql import functions as F

    if reads.inside is None:  # the windows' batches had no change at all
        return set(), {}
    key = list(shape.key)
    key_shape = shape.select(key, None)
    inside = reads.inside.where(
        (F.col("schema") == shape.schema)
        & (F.col("table") == shape.table)
        & F.col("backfill").isin(sorted({c.backfill for c in chunks}))
    )
    parses, (record, before) = _parses(key_shape.ddl(as_text=_FALLIBLE), "record", "old")
    inside = inside.select("*", *parses)
    new, _ = _typed(record, key_shape)
    old, _ = _typed(before, key_shape)
    found = inside.select(
        "backfill", "chunk", "action", new.alias("_new"), old.alias("_old")
    ).toArrow()
    if found.num_rows == 0:
        return set(), {}
    truncate = pc.equal(found["action"], "truncate")
    truncated = {
        (r["backfill"], r["chunk"])
        for r in found.filter(truncate).select(["backfill", "chunk"]).to_pylist()
    }
    rest = found.filter(pc.invert(truncate))
    parts = []
    for side in ("_new", "_old"):
        valid = rest.filter(pc.is_valid(rest[side]))
        if valid.num_rows:
            values = valid[side].combine_chunks().flatten()
            cols = {"_b": valid["backfill"], "_c": valid["chunk"]}
            for k, v in zip(key, values, strict=True):
                cols[k] = v.cast(schema.field(k).type)
            parts.append(pa.table(cols))
    changed = {}
    if parts:
        both = pa.concat_tables(parts)
        for b, c in {(r["_b"], r["_c"]) for r in both.select(["_b", "_c"]).to_pylist()}:
            mine = pc.and_(pc.equal(both["_b"], b), pc.equal(both["_c"], c))
            changed[(b, c)] = both.filter(mine).select(key)
    return truncated, changed


def _read_staged(path: str) -> Any:
    import pyarrow.parquet as pq
    from pyarrow import fs as pafs

    filesystem, where = pafs.FileSystem.from_uri(path)
    return pq.read_table(where, filesystem=filesystem)


def _conform(data: Any, schema: Any, chunk: TypedChunk) -> Any:
    """Staged rows in the table's columns now: a column added since read is NULL (the
    row was read before it existed), one dropped since is left out, types cast (a type
    that changed since into one the values do not fit fails the batch, saying so)."""
    import pyarrow as pa

    out = {}
    for f in schema:
        if f.name not in data.column_names:
            out[f.name] = pa.nulls(data.num_rows, f.type)
            continue
        try:
            out[f.name] = data[f.name].cast(f.type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise SinkError(
                f"lake: backfill {chunk.backfill} of {chunk.schema}.{chunk.table} read column "
                f"{f.name} as {data.schema.field(f.name).type}, and it is {f.type} now: {exc}",
                f"cancel the backfill (`walstream backfill cancel {chunk.backfill}`): the batch "
                "is then replayed without its rows; request the backfill again afterwards",
                retryable=True,  # the query restarts, replaying the batch until then
            ) from exc
    return pa.table(out)
