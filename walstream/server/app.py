"""The HTTP API of `walstream run` (FastAPI): health, metrics, management, the console.

Who may call what:

- open: `/health` and `/metrics` (statuses, counts and error kinds, never row values),
  the console page, `GET /v1/streams[/{name}]` (no messages);
- a read token (`server.read_token` / `WALSTREAM_API_READ_TOKEN`) or the management
  token: every read that may show row values or keys — `/api/sources`, `/api/sinks`
  (whole error texts), dead letters, parked messages, backfills (predicates, errors);
- the management token (`server.token` / `WALSTREAM_API_TOKEN`): pause, resume,
  dead-letter retry/discard, backfill start/cancel;
- the producers' token of `events.token`: `POST /v1/events`; a stream's consumer
  token: its messages (see `streams`).

Without a configured token its calls are disabled (403). Tokens are compared in
constant time and never logged. Before any of that, `guard` refuses a Host header not
in `server.allowed_hosts` (DNS rebinding) and a body over `server.max_body_bytes`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Body, Depends, FastAPI, Header, HTTPException, Path, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, Field

from walstream.delivery.parking import DEAD, PARKED, Parked
from walstream.errors import WalstreamError
from walstream.secrets import scrub_json
from walstream.server.answers import backfill_json, check_bearer, parked_json, problem
from walstream.server.stream_reader import StreamProblem

if TYPE_CHECKING:
    from walstream.server.metrics import Metrics
    from walstream.server.monitor import Monitor
    from walstream.server.status import Control

log = logging.getLogger(__name__)

MAX_ID = 2**63 - 1
SinkName = Annotated[
    str, Path(min_length=1, max_length=200, pattern=r"^[^\x00]*$", description="A sink's name.")
]
MessageId = Annotated[int, Path(ge=1, le=MAX_ID, description="A dead letter's id.")]
BackfillId = Annotated[int, Path(ge=1, le=MAX_ID, description="A backfill's id.")]
Limit = Annotated[int, Query(ge=1, le=1000, description="At most this many.")]
NO_NUL = r"^[^\x00]*$"  # Postgres text holds no NUL character
Filter = Annotated[str | None, Query(max_length=500, pattern=NO_NUL)]


class PauseRequest(BaseModel):
    reason: str | None = Field(
        None, max_length=500, pattern=NO_NUL, description="Shown while the sink is paused."
    )


class EventIn(BaseModel):
    event_type: str = Field(min_length=1, max_length=200, pattern=NO_NUL)
    payload: dict[str, Any] = Field(description="A JSON object.")
    ordering_key: str | None = Field(
        None, min_length=1, max_length=500, pattern=NO_NUL,
        description="Events with the same key are delivered in order.",
    )  # fmt: skip


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


def _has_nul(value: Any) -> bool:
    """A NUL character anywhere in a JSON value (Postgres jsonb cannot store it)."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return False


def create_app(control: Control, monitor: Monitor, metrics: Metrics) -> FastAPI:
    from walstream.server.guard import Guard
    from walstream.version import __version__

    app = FastAPI(
        title="walstream",
        version=__version__,
        description=(
            "Health, metrics and management of a running `walstream run`. Reads that may show "
            "row values need `Authorization: Bearer <server.read_token or server.token>`; write "
            "calls need `server.token`. Without a configured token those calls are disabled."
        ),
    )
    server = control.config.server
    events = control.config.events
    app.add_middleware(
        Guard,
        hosts=server.hosts(),
        max_body=max(server.max_body_bytes, events.max_bytes if events is not None else 0),
    )
    sinks = {s.name: s for s in control.config.sinks}

    def reader(request: Request) -> None:
        tokens = control.config.server.reader_tokens()
        if not tokens:
            raise problem(
                403,
                "reads that may show row values are disabled: no token is configured",
                "set server.read_token (or server.token) in walstream.yaml, or "
                "WALSTREAM_API_READ_TOKEN, then restart",
            )
        check_bearer(request, tokens, "read token")

    Read = Depends(reader)

    def writer(request: Request) -> None:
        token = control.config.server.api_token()
        if token is None:
            raise problem(
                403,
                "write calls are disabled: no API token is configured",
                "set server.token in walstream.yaml or WALSTREAM_API_TOKEN, then restart",
            )
        check_bearer(request, token, "bearer token")

    Write = Depends(writer)

    def known_sink(name: str) -> None:
        if name not in sinks:
            raise problem(404, f"no sink named {name!r}", f"sinks are: {', '.join(sinks)}")

    def lot() -> Any:
        if control.parking is None:
            raise problem(503, "walstream is starting", "try again in a moment")
        return control.parking

    def store() -> Any:
        if control.backfills is None:
            raise problem(503, "walstream is starting", "try again in a moment")
        return control.backfills

    @app.exception_handler(WalstreamError)
    async def _walstream_error(request: Request, exc: WalstreamError) -> JSONResponse:
        return JSONResponse({"detail": {"problem": exc.problem, "fix": exc.fix}}, status_code=400)

    @app.exception_handler(StreamProblem)
    async def _stream_problem(request: Request, exc: StreamProblem) -> JSONResponse:
        detail = {"problem": exc.problem, "fix": exc.fix} if exc.fix else {"problem": exc.problem}
        return JSONResponse({"detail": detail}, status_code=exc.status)

    # -- health and metrics ---------------------------------------------------------------
    @app.get("/health", tags=["health"],
             summary="Status of every source and sink, and why (errors by kind only)")  # fmt: skip
    def health() -> JSONResponse:
        snap = monitor.snapshot()
        code = 503 if snap.status == "error" else 200
        return JSONResponse(snap.as_json(detail=False), status_code=code)

    @app.get("/metrics", tags=["health"], summary="Prometheus metrics", response_class=Response)
    def prometheus() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    # -- sources and sinks ----------------------------------------------------------------
    @app.get("/api/sources", tags=["sources"], dependencies=[Read],
             summary="Sources with their status and whole error texts")  # fmt: skip
    def list_sources() -> list[dict[str, Any]]:
        return monitor.snapshot().source_list(detail=True)

    @app.get("/api/sinks", tags=["sinks"], dependencies=[Read],
             summary="Sinks with their status and whole error texts")  # fmt: skip
    def list_sinks() -> list[dict[str, Any]]:
        return monitor.snapshot().sink_list(detail=True)

    @app.get("/api/sinks/{name}", tags=["sinks"], dependencies=[Read],
             summary="One sink's status")  # fmt: skip
    def get_sink(name: SinkName) -> dict[str, Any]:
        known_sink(name)
        return next(s for s in monitor.snapshot().sink_list(detail=True) if s["name"] == name)

    @app.post("/api/sinks/{name}/pause", tags=["sinks"], dependencies=[Write],
              summary="Pause a sink (its source's batches wait, nothing is lost)")  # fmt: skip
    def pause(
        name: SinkName, body: Annotated[PauseRequest | None, Body()] = None
    ) -> dict[str, Any]:
        known_sink(name)
        lot().set_paused(name, True, body.reason if body else None)
        log.warning("sink %s paused through the API", name)
        return {"sink": name, "paused": True}

    @app.post("/api/sinks/{name}/resume", tags=["sinks"], dependencies=[Write],
              summary="Resume a paused sink")  # fmt: skip
    def resume(name: SinkName) -> dict[str, Any]:
        known_sink(name)
        lot().set_paused(name, False)
        log.warning("sink %s resumed through the API", name)
        return {"sink": name, "paused": False}

    # -- parked messages and dead letters ---------------------------------------------------
    def listing(status: str, sink: str | None, group: str | None, limit: int) -> dict[str, Any]:
        if sink is not None:
            known_sink(sink)
        rows = lot().list(status, sink, group, limit)
        counts = lot().counts()
        total = sum(c.get(status, 0) for s, c in counts.items() if sink is None or s == sink)
        return {"total": total, "items": [parked_json(p, control.secrets) for p in rows]}

    @app.get("/api/dead-letters", tags=["dead letters"], dependencies=[Read],
             summary="Dead letters, oldest first")  # fmt: skip
    def dead_letters(
        sink: Filter = None, group: Filter = None, limit: Limit = 100
    ) -> dict[str, Any]:
        return listing(DEAD, sink, group, limit)

    @app.get("/api/parked", tags=["dead letters"], dependencies=[Read],
             summary="Parked messages, oldest first")  # fmt: skip
    def parked(sink: Filter = None, group: Filter = None, limit: Limit = 100) -> dict[str, Any]:
        return listing(PARKED, sink, group, limit)

    def one(id_: int) -> Parked:
        p = lot().get(id_)
        if p is None:
            raise problem(404, f"no parked message or dead letter with id {id_}")
        return p

    @app.get("/api/dead-letters/{id}", tags=["dead letters"], dependencies=[Read],
             summary="One dead letter or parked message, with its message and errors")  # fmt: skip
    def dead_letter(id: MessageId) -> dict[str, Any]:
        p = one(id)
        config = scrub_json(lot().sink_config(id), control.secrets)  # stored before a fix, too
        return {**parked_json(p, control.secrets, full=True), "sink_config": config}

    @app.post("/api/dead-letters/{id}/retry", tags=["dead letters"], dependencies=[Write],
              summary="Park a dead letter again, due now: the retrier delivers it")  # fmt: skip
    def retry(id: MessageId) -> dict[str, Any]:
        p = one(id)
        if p.status != DEAD:
            raise problem(409, f"message {id} is {p.status}, not a dead letter")
        n = lot().retry_dead([id])
        log.warning("dead letter %d of sink %s retried through the API", id, p.sink)
        return {"id": id, "retried": n == 1}

    @app.post("/api/dead-letters/{id}/discard", tags=["dead letters"], dependencies=[Write],
              summary="Delete a dead letter for good")  # fmt: skip
    def discard(id: MessageId) -> dict[str, Any]:
        p = one(id)
        if p.status != DEAD:
            raise problem(409, f"message {id} is {p.status}, not a dead letter")
        n = lot().discard_dead([id])
        log.warning("dead letter %d of sink %s discarded through the API", id, p.sink)
        return {"id": id, "discarded": n == 1}

    # -- backfills --------------------------------------------------------------------------
    @app.get("/api/backfills", tags=["backfills"], dependencies=[Read],
             summary="Backfills, newest first")  # fmt: skip
    def backfills(sink: Filter = None, active: bool = False) -> list[dict[str, Any]]:
        return [
            backfill_json(b, control.secrets) for b in store().find(sink=sink, active_only=active)
        ]

    @app.get("/api/backfills/{id}", tags=["backfills"], dependencies=[Read],
             summary="One backfill's progress")  # fmt: skip
    def backfill(id: BackfillId) -> dict[str, Any]:
        b = store().get(id)
        if b is None:
            raise problem(404, f"no backfill {id}")
        return backfill_json(b, control.secrets)

    @app.post("/api/backfills", tags=["backfills"], dependencies=[Write], status_code=201,
              summary="Start backfills of a sink's tables")  # fmt: skip
    def start_backfill(body: BackfillRequest) -> list[dict[str, Any]]:
        from walstream.backfill.requests import request
        from walstream.postgres.predicate import BadPredicate

        known_sink(body.sink)
        try:
            created = request(
                control.config, store(), body.sink, body.tables, body.where, body.chunk_size,
                body.target_seconds,
            )  # fmt: skip
        except BadPredicate as exc:
            raise problem(422, exc.problem, exc.fix) from None
        for b in created:
            log.warning(
                "backfill %d of %s to sink %s started through the API", b.id, b.qualified, b.sink
            )
        return [backfill_json(b, control.secrets) for b in created]

    @app.post("/api/backfills/{id}/cancel", tags=["backfills"], dependencies=[Write],
              summary="Cancel a backfill (rows delivered stay delivered)")  # fmt: skip
    def cancel_backfill(id: BackfillId) -> dict[str, Any]:
        b = store().get(id)
        if b is None:
            raise problem(404, f"no backfill {id}")
        done = store().cancel([id])
        if not done:
            raise problem(409, f"backfill {id} is {b.status} already")
        log.warning(
            "backfill %d of %s to sink %s cancelled through the API", id, b.qualified, b.sink
        )
        return {"id": id, "cancelled": True}

    # -- event ingestion ----------------------------------------------------------------------
    def producer(request: Request) -> None:
        ev = control.config.events
        token = ev.producer_token() if ev is not None else None
        if ev is None or token is None:
            raise problem(
                403,
                "event ingestion is off" if ev is None else "event ingestion has no producer token",
                "add an events: section with a token (or WALSTREAM_EVENTS_TOKEN) to walstream.yaml",
            )
        check_bearer(request, token, "producer token")

    @app.post(
        "/v1/events", tags=["events"], status_code=202, dependencies=[Depends(producer)],
        summary="Ingest an event: stored in the outbox, delivered to the subscriptions of its type",
        openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
            "schema": EventIn.model_json_schema()}}}},
    )  # fmt: skip
    async def ingest(
        request: Request,
        idempotency_key: Annotated[
            str | None,
            Header(alias="Idempotency-Key", min_length=1, max_length=500, pattern=NO_NUL),
        ] = None,
    ) -> JSONResponse:
        import anyio
        from pydantic import ValidationError

        ev = control.config.events
        assert ev is not None
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > ev.max_bytes:
            raise problem(413, f"the event is over {ev.max_bytes:,} bytes", "send smaller events")
        raw = await request.body()
        if len(raw) > ev.max_bytes:
            raise problem(413, f"the event is over {ev.max_bytes:,} bytes", "send smaller events")
        try:
            event = EventIn.model_validate_json(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "body"
            raise HTTPException(
                422,
                {
                    "problem": f"{where}: {first['msg']}",
                    "fix": 'send {"event_type": "...", "payload": {...}, "ordering_key": "..."}',
                },
            ) from None
        if _has_nul(event.payload):
            raise problem(422, "payload: a NUL character (\\u0000) cannot be stored", "remove it")
        outbox = control.outbox
        if outbox is None:
            raise problem(503, "walstream is starting", "try again in a moment")
        accepted = await anyio.to_thread.run_sync(
            outbox.publish, event.event_type, event.payload, event.ordering_key, idempotency_key
        )
        return JSONResponse({"id": accepted.id, "duplicate": accepted.duplicate}, status_code=202)

    from walstream.server.streams import stream_routes

    app.include_router(stream_routes(control, metrics))

    # -- the console --------------------------------------------------------------------------
    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def console() -> HTMLResponse:
        from walstream.server.console import PAGE

        return HTMLResponse(PAGE)

    return app
