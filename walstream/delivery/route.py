"""How a batch reaches a sink: the one place a delivery route is picked.

| route            | when                                               | executor                      |
|------------------|----------------------------------------------------|-------------------------------|
| `TABLES`         | a table sink                                       | `lake/writer.write_tables`    |
| `COLUMNS`        | a batch sink taking columns; messages made in SQL  | `columns.deliver_columns`     |
|                  | or Arrow (no tombstones, no Python transform)      |                               |
| `LEDGER_COLUMNS` | the same for a message sink, on a fresh batch      | `columns.deliver_ledger_columns` |
|                  | with nothing parked                                |                               |
| `ROWS`           | everything else                                    | `deliver.deliver_partition`   |
| `STAGED_CHUNKS`  | backfill read rows of a batch sink taking columns, | `pipeline/reads.deliver_direct` |
|                  | messages as the format makes them                  |                               |

Read rows not `STAGED_CHUNKS` join the changes in Spark and take their route; the
batch's data can still rule `STAGED_CHUNKS` out (`pipeline/reads.plan_direct`). A
retried task attempt of `LEDGER_COLUMNS` goes row by row (`deliver_ledger_columns`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

from walstream.sinks.base import Capabilities, Kind


class Route(StrEnum):
    TABLES = "tables"
    COLUMNS = "columns"
    LEDGER_COLUMNS = "ledger columns"
    ROWS = "rows"
    STAGED_CHUNKS = "staged chunks"


@dataclass(frozen=True)
class Batch:
    """What a batch is, for one sink, as far as the route cares."""

    #: The sink's steps make each message in SQL or Arrow (`_message`): no Python step.
    messages_made: bool = False
    #: The sink adds a tombstone after each delete (a Python step per delete).
    tombstones: bool = False
    #: The sink has a Python transform (a Python step per message).
    transform: bool = False
    #: The ledger holds nothing of this batch (not a replay).
    fresh: bool = True
    #: The sink has nothing parked (no group is blocked).
    unblocked: bool = True
    #: Backfill read rows join the batch.
    reads: bool = False
    #: The sink's messages are its format's as they are: default key and grouping, no
    #: route expression, filter, event types or transform, and it takes read rows.
    plain: bool = False


class Routes(NamedTuple):
    changes: Route
    reads: Route | None  # None: the batch has no read rows


def route(caps: Capabilities, batch: Batch) -> Routes:
    """The route of a batch's changes and of its backfill read rows (the module's table)."""
    if caps.kind is Kind.TABLES:
        return Routes(Route.TABLES, Route.TABLES if batch.reads else None)
    columns = caps.columns and batch.messages_made and not batch.tombstones and not batch.transform
    if columns and caps.kind is Kind.BATCHES:
        changes = Route.COLUMNS
    elif columns and batch.fresh and batch.unblocked:
        changes = Route.LEDGER_COLUMNS
    else:
        changes = Route.ROWS
    if not batch.reads:
        return Routes(changes, None)
    staged = caps.kind is Kind.BATCHES and caps.columns and batch.plain and not batch.tombstones
    return Routes(changes, Route.STAGED_CHUNKS if staged else changes)
