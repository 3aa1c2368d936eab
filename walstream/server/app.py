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

from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response

from walstream.errors import WalstreamError
from walstream.server.access import Access
from walstream.server.event_routes import event_routes
from walstream.server.management import backfill_routes, dead_letter_routes, sink_routes
from walstream.server.stream_reader import StreamProblem

if TYPE_CHECKING:
    from walstream.server.metrics import Metrics
    from walstream.server.monitor import Monitor
    from walstream.server.status import Control


def create_app(control: Control, monitor: Monitor, metrics: Metrics) -> FastAPI:
    """The app: the guard, the open routes (health, metrics, the console) and a router per
    resource (sinks, dead letters, backfills, events, streams)."""
    from walstream.server.guard import Guard
    from walstream.server.streams import stream_routes
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

    @app.exception_handler(WalstreamError)
    async def _walstream_error(request: Request, exc: WalstreamError) -> JSONResponse:
        return JSONResponse({"detail": {"problem": exc.problem, "fix": exc.fix}}, status_code=400)

    @app.exception_handler(StreamProblem)
    async def _stream_problem(request: Request, exc: StreamProblem) -> JSONResponse:
        detail = {"problem": exc.problem, "fix": exc.fix} if exc.fix else {"problem": exc.problem}
        return JSONResponse({"detail": detail}, status_code=exc.status)

    @app.get(
        "/health",
        tags=["health"],
        summary="Status of every source and sink, and why (errors by kind only)",
    )
    def health() -> JSONResponse:
        snap = monitor.snapshot()
        code = 503 if snap.status == "error" else 200
        return JSONResponse(snap.as_json(detail=False), status_code=code)

    @app.get("/metrics", tags=["health"], summary="Prometheus metrics", response_class=Response)
    def prometheus() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    access = Access(control)
    for router in (
        sink_routes(access, monitor),
        dead_letter_routes(access),
        backfill_routes(access),
        event_routes(control),
        stream_routes(control, metrics),
    ):
        app.include_router(router)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def console() -> HTMLResponse:
        from walstream.server.console import PAGE

        return HTMLResponse(PAGE)

    return app
