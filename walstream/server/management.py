"""The management API's routes: sources and sinks (status, pause, resume), parked messages
and dead letters (list, show, retry, discard), backfills (list, show, start, cancel).
Each resource is a router; `Access` says who may call it."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Body, Path, Query
from pydantic import BaseModel, Field

from walstream.delivery.parking import DEAD, PARKED, Parked
from walstream.secrets import scrub_json
from walstream.server.access import Access
from walstream.server.answers import backfill_json, parked_json, problem

if TYPE_CHECKING:
    from walstream.server.monitor import Monitor

log = logging.getLogger("walstream.server.app")  # the API's log, whichever router writes it

MAX_ID = 2**63 - 1
NO_NUL = r"^[^\x00]*$"  # Postgres text holds no NUL character
SinkName = Annotated[
    str, Path(min_length=1, max_length=200, pattern=NO_NUL, description="A sink's name.")
]
MessageId = Annotated[int, Path(ge=1, le=MAX_ID, description="A dead letter's id.")]
BackfillId = Annotated[int, Path(ge=1, le=MAX_ID, description="A backfill's id.")]
Limit = Annotated[int, Query(ge=1, le=1000, description="At most this many.")]
Filter = Annotated[str | None, Query(max_length=500, pattern=NO_NUL)]


class PauseRequest(BaseModel):
    reason: str | None = Field(
        None, max_length=500, pattern=NO_NUL, description="Shown while the sink is paused."
    )


class BackfillRequest(BaseModel):
    sink: str = Field(
        min_length=1, max_length=200, pattern=NO_NUL, description="The sink that gets the rows."
    )
    tables: list[Annotated[str, Field(min_length=1, max_length=300, pattern=NO_NUL)]] = Field(
        default_factory=list,
        max_length=100,
        description="schema.table names; empty: every table the sink selects.",
    )
    where: str | None = Field(
        None, max_length=2000, pattern=NO_NUL, description="A SQL predicate on the rows."
    )
    chunk_size: int | None = Field(None, ge=1, le=1_000_000, description="First chunk's rows.")
    target_seconds: float | None = Field(
        None, ge=0, le=3600, description="Seconds per chunk to adapt toward (0: fixed size)."
    )


def sink_routes(access: Access, monitor: Monitor) -> APIRouter:
    """`/api/sources` and `/api/sinks`: status with whole error texts; pause and resume."""
    api = APIRouter()

    @api.get(
        "/api/sources",
        tags=["sources"],
        dependencies=[access.read],
        summary="Sources with their status and whole error texts",
    )
    def list_sources() -> list[dict[str, Any]]:
        return monitor.snapshot().source_list(detail=True)

    @api.get(
        "/api/sinks",
        tags=["sinks"],
        dependencies=[access.read],
        summary="Sinks with their status and whole error texts",
    )
    def list_sinks() -> list[dict[str, Any]]:
        return monitor.snapshot().sink_list(detail=True)

    @api.get(
        "/api/sinks/{name}", tags=["sinks"], dependencies=[access.read], summary="One sink's status"
    )
    def get_sink(name: SinkName) -> dict[str, Any]:
        access.known_sink(name)
        return next(s for s in monitor.snapshot().sink_list(detail=True) if s["name"] == name)

    @api.post(
        "/api/sinks/{name}/pause",
        tags=["sinks"],
        dependencies=[access.write],
        summary="Pause a sink (its source's batches wait, nothing is lost)",
    )
    def pause(
        name: SinkName, body: Annotated[PauseRequest | None, Body()] = None
    ) -> dict[str, Any]:
        access.known_sink(name)
        access.lot().set_paused(name, True, body.reason if body else None)
        log.warning("sink %s paused through the API", name)
        return {"sink": name, "paused": True}

    @api.post(
        "/api/sinks/{name}/resume",
        tags=["sinks"],
        dependencies=[access.write],
        summary="Resume a paused sink",
    )
    def resume(name: SinkName) -> dict[str, Any]:
        access.known_sink(name)
        access.lot().set_paused(name, False)
        log.warning("sink %s resumed through the API", name)
        return {"sink": name, "paused": False}

    return api


def dead_letter_routes(access: Access) -> APIRouter:
    """`/api/parked` and `/api/dead-letters`: list, show (with the sink's settings then,
    scrubbed), retry, discard."""
    api = APIRouter()
    secrets = access.control.secrets

    def listing(status: str, sink: str | None, group: str | None, limit: int) -> dict[str, Any]:
        if sink is not None:
            access.known_sink(sink)
        rows = access.lot().list(status, sink, group, limit)
        counts = access.lot().counts()
        total = sum(c.get(status, 0) for s, c in counts.items() if sink is None or s == sink)
        return {"total": total, "items": [parked_json(p, secrets) for p in rows]}

    @api.get(
        "/api/dead-letters",
        tags=["dead letters"],
        dependencies=[access.read],
        summary="Dead letters, oldest first",
    )
    def dead_letters(
        sink: Filter = None, group: Filter = None, limit: Limit = 100
    ) -> dict[str, Any]:
        return listing(DEAD, sink, group, limit)

    @api.get(
        "/api/parked",
        tags=["dead letters"],
        dependencies=[access.read],
        summary="Parked messages, oldest first",
    )
    def parked(sink: Filter = None, group: Filter = None, limit: Limit = 100) -> dict[str, Any]:
        return listing(PARKED, sink, group, limit)

    def one(id_: int, dead: bool = False) -> Parked:
        p = access.lot().get(id_)
        if p is None:
            raise problem(404, f"no parked message or dead letter with id {id_}")
        if dead and p.status != DEAD:
            raise problem(409, f"message {id_} is {p.status}, not a dead letter")
        return p

    @api.get(
        "/api/dead-letters/{id}",
        tags=["dead letters"],
        dependencies=[access.read],
        summary="One dead letter or parked message, with its message and errors",
    )
    def dead_letter(id: MessageId) -> dict[str, Any]:
        p = one(id)
        config = scrub_json(access.lot().sink_config(id), secrets)  # stored before a fix, too
        return {**parked_json(p, secrets, full=True), "sink_config": config}

    @api.post(
        "/api/dead-letters/{id}/retry",
        tags=["dead letters"],
        dependencies=[access.write],
        summary="Park a dead letter again, due now: the retrier delivers it",
    )
    def retry(id: MessageId) -> dict[str, Any]:
        p = one(id, dead=True)
        n = access.lot().retry_dead([id])
        log.warning("dead letter %d of sink %s retried through the API", id, p.sink)
        return {"id": id, "retried": n == 1}

    @api.post(
        "/api/dead-letters/{id}/discard",
        tags=["dead letters"],
        dependencies=[access.write],
        summary="Delete a dead letter for good",
    )
    def discard(id: MessageId) -> dict[str, Any]:
        p = one(id, dead=True)
        n = access.lot().discard_dead([id])
        log.warning("dead letter %d of sink %s discarded through the API", id, p.sink)
        return {"id": id, "discarded": n == 1}

    return api


def backfill_routes(access: Access) -> APIRouter:
    """`/api/backfills`: list, show, start (through the same checks as the CLI), cancel."""
    api = APIRouter()
    secrets = access.control.secrets

    def found(id_: int) -> Any:
        b = access.store().get(id_)
        if b is None:
            raise problem(404, f"no backfill {id_}")
        return b

    @api.get(
        "/api/backfills",
        tags=["backfills"],
        dependencies=[access.read],
        summary="Backfills, newest first",
    )
    def backfills(sink: Filter = None, active: bool = False) -> list[dict[str, Any]]:
        return [
            backfill_json(b, secrets) for b in access.store().find(sink=sink, active_only=active)
        ]

    @api.get(
        "/api/backfills/{id}",
        tags=["backfills"],
        dependencies=[access.read],
        summary="One backfill's progress",
    )
    def backfill(id: BackfillId) -> dict[str, Any]:
        return backfill_json(found(id), secrets)

    @api.post(
        "/api/backfills",
        tags=["backfills"],
        dependencies=[access.write],
        status_code=201,
        summary="Start backfills of a sink's tables",
    )
    def start_backfill(body: BackfillRequest) -> list[dict[str, Any]]:
        from walstream.backfill.predicate import BadPredicate
        from walstream.backfill.requests import request

        access.known_sink(body.sink)
        try:
            created = request(
                access.control.config,
                access.store(),
                body.sink,
                body.tables,
                body.where,
                body.chunk_size,
                body.target_seconds,
            )
        except BadPredicate as exc:
            raise problem(422, exc.problem, exc.fix) from None
        for b in created:
            log.warning(
                "backfill %d of %s to sink %s started through the API", b.id, b.qualified, b.sink
            )
        return [backfill_json(b, secrets) for b in created]

    @api.post(
        "/api/backfills/{id}/cancel",
        tags=["backfills"],
        dependencies=[access.write],
        summary="Cancel a backfill (rows delivered stay delivered)",
    )
    def cancel_backfill(id: BackfillId) -> dict[str, Any]:
        b = found(id)
        if not access.store().cancel([id]):
            raise problem(409, f"backfill {id} is {b.status} already")
        log.warning(
            "backfill %d of %s to sink %s cancelled through the API", id, b.qualified, b.sink
        )
        return {"id": id, "cancelled": True}

    return api
