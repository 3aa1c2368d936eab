"""`POST /v1/events`: an event stored in the outbox, for the subscriptions of its type
(docs/events.md). Producers call it with the token of `events.token`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Depends, Header, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from walstream.server.answers import check_bearer, problem
from walstream.server.management import NO_NUL

if TYPE_CHECKING:
    from walstream.server.status import Control


class EventIn(BaseModel):
    event_type: str = Field(min_length=1, max_length=200, pattern=NO_NUL)
    payload: dict[str, Any] = Field(description="A JSON object.")
    ordering_key: str | None = Field(
        None,
        min_length=1,
        max_length=500,
        pattern=NO_NUL,
        description="Events with the same key are delivered in order.",
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


def event_routes(control: Control) -> APIRouter:
    api = APIRouter()

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

    @api.post(
        "/v1/events",
        tags=["events"],
        status_code=202,
        dependencies=[Depends(producer)],
        summary="Ingest an event: stored in the outbox, delivered to the subscriptions of its type",
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": EventIn.model_json_schema()}},
            }
        },
    )
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

    return api
