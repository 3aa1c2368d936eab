"""The Postgres mirror sink: `sink.py` (settings, applying changes in order), `sql.py`
(values and statements), `definitions.py` (the source's tables), `book.py` (its
bookkeeping in the target), `rename.py` (renames), `targets.py` (its preflight)."""

from walstream.sinks.postgres.sink import PostgresDestination, PostgresSink

__all__ = ["PostgresDestination", "PostgresSink"]
