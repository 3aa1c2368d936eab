"""The `record` format: the row only, after the change (or what is known of it before a
delete). Python, Spark SQL and Arrow make the same bytes."""

from __future__ import annotations

from typing import Any

from walstream.change import ChangeRow
from walstream.formats.base import Formatter


def python(*, sink: str, db: str) -> Formatter:
    def fmt(c: ChangeRow) -> str:
        return c.record or "null"

    return fmt


def sql(*, sink: str, db: str, backfill: bool) -> str:
    return "coalesce(record, 'null')"


def arrow(batch: dict[str, Any], *, sink: str, db: str) -> Any:
    import pyarrow as pa
    import pyarrow.compute as pc

    return pc.coalesce(batch["record"], pa.scalar("null"))
