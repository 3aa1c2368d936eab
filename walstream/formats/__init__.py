"""Message formats: how a change row becomes the bytes a sink sends.

One module per format (`sequin`, `record`; `mirror`, the Postgres mirror's own), each
holding every rendering of it side by side, byte for byte alike (tests/unit/formats/,
tests/integration/test_formats_sql.py):

- `python(sink=, db=)`: a function of one `ChangeRow` (the reference; any row);
- `sql(sink=, db=, backfill=)`: a Spark SQL expression, NULL for a row only Python
  can make (a batch with backfill rows is formatted in the JVM);
- `arrow(columns, sink=, db=)`: a batch's messages in a few Arrow kernels (a
  streaming batch is formatted by the delivery worker), NULL where only Python can.

`debezium` is made by the delivery task alone, as records (`RECORD_FORMATS`): a change can
be several, each with its own key, their values by the table's column types
(`debezium.py`; its values `debezium_types.py`, its records `debezium_message.py`).
`template.py` derives a fourth rendering from `python` for a backfill chunk's rows,
`keys.py` holds the idempotency, message and group keys in each rendering, and
`text.py` the pieces all formats write. `record`, `old` and `annotations` arrive as
JSON text from the decoder and are spliced in as they are, never parsed and
re-encoded (but for the `changes` of a sequin update).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from walstream.formats import debezium, mirror, record, sequin
from walstream.formats.base import Formatter

#: The formats a sink's `format` may name.
FORMATS = ("sequin", "debezium", "record")
#: The formats made over Arrow columns (the mirror's is made in Python).
ARROW_FORMATS = ("sequin", "record")
#: The formats the delivery task makes as records of its own (`debezium.Records`): no
#: `python`/`sql`/`arrow` rendering of one message per change.
RECORD_FORMATS = ("debezium",)
_MODULES: dict[str, ModuleType] = {
    "sequin": sequin,
    "debezium": debezium,
    "record": record,
    "mirror": mirror,
}


def _module(name: str) -> ModuleType:
    found = _MODULES.get(name)
    if found is None:
        raise ValueError(f"unknown format {name!r}; choose one of {', '.join(FORMATS)}")
    return found


def formatter(name: str, *, sink: str, db: str) -> Formatter | None:
    """Format `name` in Python: a function of one change row; None for a format made as
    records (`RECORD_FORMATS`)."""
    module = _module(name)
    if name in RECORD_FORMATS:
        return None
    made: Formatter = module.python(sink=sink, db=db)
    return made


def sql_format(name: str, *, sink: str, db: str, backfill: bool) -> str | None:
    """A Spark SQL expression equal to `formatter(name, ...)` of the row, or NULL where
    only Python can format it; None when the format has no SQL form (`mirror`)."""
    module = _module(name)
    if not hasattr(module, "sql"):
        return None
    made: str = module.sql(sink=sink, db=db, backfill=backfill)
    return made


def batch_messages(fmt: str, batch: Any, *, sink: str, db: str) -> Any:
    """Each row's message in format `fmt` as a string array, for a RecordBatch of change
    columns with `_ikey` (its idempotency keys). Rows with a `backfill` are not
    expected here: their batches are formatted by Spark SQL."""
    if fmt not in ARROW_FORMATS:
        raise ValueError(f"format {fmt!r} is not made in Arrow; choose one of {ARROW_FORMATS}")
    columns = dict(zip(batch.schema.names, batch.columns, strict=True))
    return _module(fmt).arrow(columns, sink=sink, db=db)


__all__ = [
    "ARROW_FORMATS",
    "FORMATS",
    "RECORD_FORMATS",
    "Formatter",
    "batch_messages",
    "formatter",
    "sql_format",
]
