"""The delivery route of a batch, picked from the sink's capabilities in one place."""

from __future__ import annotations

import pytest

from walstream.delivery.route import Batch, Route, Routes, route
from walstream.sinks.base import Capabilities, Kind
from walstream.sinks.registry import sink_types

KAFKA = Capabilities(Kind.MESSAGES, columns=True, tombstones=True)
WEBHOOK = Capabilities(Kind.MESSAGES)
FILE = Capabilities(Kind.BATCHES, columns=True)
DELTA = Capabilities(Kind.TABLES)
MADE = Batch(messages_made=True)


def test_the_registered_sinks_declare_the_capabilities_the_routes_assume() -> None:
    types = sink_types()
    assert types["kafka"].capabilities == KAFKA
    assert types["webhook"].capabilities == WEBHOOK
    assert types["file"].capabilities == types["stream"].capabilities == FILE
    assert types["delta"].capabilities == types["iceberg"].capabilities == DELTA


@pytest.mark.parametrize(
    ("caps", "batch", "expected"),
    [
        (DELTA, Batch(), Routes(Route.TABLES, None)),
        (DELTA, Batch(reads=True), Routes(Route.TABLES, Route.TABLES)),
        (FILE, MADE, Routes(Route.COLUMNS, None)),
        (FILE, Batch(messages_made=False), Routes(Route.ROWS, None)),  # a Python format step
        (FILE, Batch(messages_made=True, transform=True), Routes(Route.ROWS, None)),
        (FILE, Batch(messages_made=True, fresh=False, unblocked=False), Routes(Route.COLUMNS, None)),
        (KAFKA, MADE, Routes(Route.LEDGER_COLUMNS, None)),
        (KAFKA, Batch(messages_made=True, fresh=False), Routes(Route.ROWS, None)),  # a replay
        (KAFKA, Batch(messages_made=True, unblocked=False), Routes(Route.ROWS, None)),  # parked
        (KAFKA, Batch(messages_made=True, tombstones=True), Routes(Route.ROWS, None)),
        (KAFKA, Batch(messages_made=True, transform=True), Routes(Route.ROWS, None)),
        (WEBHOOK, MADE, Routes(Route.ROWS, None)),  # takes no columns
        (FILE, Batch(messages_made=True, reads=True, plain=True),
         Routes(Route.COLUMNS, Route.STAGED_CHUNKS)),
        (FILE, Batch(messages_made=True, reads=True), Routes(Route.COLUMNS, Route.COLUMNS)),
        (FILE, Batch(reads=True, plain=True), Routes(Route.ROWS, Route.STAGED_CHUNKS)),
        (KAFKA, Batch(messages_made=True, reads=True, plain=True),  # read rows need the ledger
         Routes(Route.LEDGER_COLUMNS, Route.LEDGER_COLUMNS)),
        (WEBHOOK, Batch(reads=True, plain=True), Routes(Route.ROWS, Route.ROWS)),
    ],
)  # fmt: skip
def test_route(caps: Capabilities, batch: Batch, expected: Routes) -> None:
    assert route(caps, batch) == expected
