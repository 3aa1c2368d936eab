"""Change rows for the message-format tests (Python, Spark SQL and Arrow formats)."""

from __future__ import annotations

import re
from typing import Any

from walstream.change import ChangeRow

#: A commit time (µs since the Unix epoch).
TS = 1_763_884_850_561_930

#: The Debezium envelope's own `ts_ms`: the time the message was made, not the change's.
TS_MS = re.compile(r',"ts_ms":(\d+)}$')


def row(
    action: str, record: str | None = '{"id":1}', old: str | None = None, **kw: Any
) -> ChangeRow:
    """A change row of `public.orders` from source `app`; `kw` sets any other field."""
    base: dict[str, Any] = dict(
        source="app", lsn=26441264, seq=3, xid=741, committed_at_us=TS, action=action,
        schema="public", table="orders", pk=["1"], record=record, old=old,
        annotations=None, unchanged_toast=None, backfill=None,
    )  # fmt: skip
    base.update(kw)
    return ChangeRow(**base)
