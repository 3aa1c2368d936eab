"""A lake table's columns against the source's now (`LakeTable.check_schema`): what widens,
what is added by the write, and what stops the sink."""

from __future__ import annotations

import pyarrow as pa
import pytest

from walstream.errors import SinkError
from walstream.lake.delta import DeltaDestination
from walstream.lake.tables import LakeTable


def lake() -> LakeTable:
    dest = DeltaDestination.model_validate(
        {"type": "delta", "mode": "changelog", "path": "/tmp/x/{table}"}
    )
    return LakeTable(dest, "public", "t")


def before(*fields: tuple[str, pa.DataType]) -> pa.Schema:
    return pa.schema([("id", pa.int32()), ("_before", pa.struct(list(fields)))])


def test_fields_added_to_before_need_no_rewrite_and_a_widened_one_does():
    table = before(("id", pa.int32()), ("a", pa.int32()), ("d", pa.string()))
    # a column added at the source, one dropped: the write adds the field, keeps the other
    assert lake().check_schema(table, before(("id", pa.int32()), ("a", pa.int32()),
                                             ("e", pa.string()))) == {}  # fmt: skip
    # `a` widened to bigint: `_before` is rewritten, its dropped field kept, the new added
    widened = lake().check_schema(table, before(("id", pa.int32()), ("a", pa.int64()),
                                                ("e", pa.string())))  # fmt: skip
    assert widened == {"_before": pa.struct([("id", pa.int32()), ("a", pa.int64()),
                                             ("d", pa.string()), ("e", pa.string())])}  # fmt: skip


def test_a_field_of_before_that_narrows_stops_the_sink():
    table = before(("id", pa.int32()), ("a", pa.int64()))
    with pytest.raises(SinkError) as e:
        lake().check_schema(table, before(("id", pa.int32()), ("a", pa.int32())))
    assert "_before" in e.value.problem and not e.value.retryable
