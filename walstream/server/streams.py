"""The pull API of `type: stream` sinks: `/v1/streams/...` (long-poll, SSE, consumer groups).

Reads need `Authorization: Bearer <token>` with the stream's consumer token
(`destination.token`, else `WALSTREAM_STREAMS_TOKEN`); without one the stream's API is
off (403). `GET /v1/streams` and `/v1/streams/{name}` (no messages) are open like
`/health`. Open long-polls and SSE subscriptions are bounded per stream and per client
address (`server.max_stream_connections`, `server.max_client_connections`): one more
is refused with 429 and Retry-After.

A response's messages each carry `progress`: the marker to pass as `after` to resume
right after that message. The response's own `progress` is where the next request
starts when every message of it was processed (with coalescing it may be past the last
message: a window can collapse to nothing).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Depends, Header, Path, Query, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, Field

from walstream.fields import parse_duration
from walstream.server.answers import check_bearer, problem
from walstream.server.connections import Connections
from walstream.server.stream_reader import Delivered, StreamReader
from walstream.state.streams import version
from walstream.streams import markers
from walstream.streams.markers import Cursor

if TYPE_CHECKING:
    from walstream.server.metrics import Metrics
    from walstream.server.status import Control

StreamName = Annotated[
    str, Path(min_length=1, max_length=63, pattern=r"^[a-z][a-z0-9_-]*$", description="A stream.")
]
GroupName = Annotated[
    str,
    Path(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.:-]+$", description="A group."),
]
After = Annotated[
    str | None,
    Query(
        max_length=20_000,
        pattern=r"^[A-Za-z0-9_:.=-]*$",
        description="A progress marker, or `group:<name>`; empty: from now.",
    ),
]
#: Longest long-poll and SSE keep-alive interval.
MAX_WAIT = 300.0
KEEPALIVE = 15.0


class Ack(BaseModel):
    progress: str = Field(min_length=1, max_length=20_000, description="A progress marker.")


def stream_routes(control: Control, metrics: Metrics) -> APIRouter:

    router = APIRouter(prefix="/v1/streams", tags=["streams"])
    reader = StreamReader(control, metrics)
    streams = reader.streams
    server = control.config.server
    connections = Connections(server.max_stream_connections, server.max_client_connections)

    def client(request: Request) -> str:
        return request.client.host if request.client is not None else "?"

    def consumer(request: Request, name: StreamName) -> None:
        check_bearer(request, reader.token(name), "consumer token")

    Consumer = Depends(consumer)

    def fetch(name: str, at: dict[str, Cursor], limit: int, coalescing: bool) -> tuple[bytes, int]:
        """The response body for messages after `at`, and how many messages it holds."""
        page = reader.read(name, at, limit, coalescing)
        parts = [_message(m) for m in page.messages]
        body = (
            '{"messages":[' + ",".join(parts) + f'],"progress":{json.dumps(page.progress)},'
            f'"coalesced":{json.dumps(page.coalesced)},"behind":{json.dumps(page.behind)}}}'
        )
        return body.encode(), len(parts)

    # -- listing ---------------------------------------------------------------------------
    @router.get("", summary="Streams with their sources and what they keep")
    def list_streams() -> list[dict[str, Any]]:
        return [reader.describe(n) for n in streams]

    @router.get("/{name}", summary="One stream: sources, kept messages, head marker")
    def get_stream(name: StreamName) -> dict[str, Any]:
        return reader.describe(name)

    # -- reading -----------------------------------------------------------------------------
    @router.get(
        "/{name}/messages",
        dependencies=[Consumer],
        summary="Messages after a progress marker (long-poll with wait)",
        responses={410: {"description": "The consumer has a gap: its position was deleted."}},
    )
    async def messages(
        request: Request,
        name: StreamName,
        after: After = None,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
        wait: Annotated[
            str, Query(max_length=20, description="Wait this long for a first message: 30s, 500ms.")
        ] = "0",
        coalesce: Annotated[
            bool, Query(description="Collapse changes per row while far behind.")
        ] = False,
    ) -> Response:
        import anyio

        seconds = _wait_seconds(wait)
        release = connections.open(name, client(request))
        try:
            at = await anyio.to_thread.run_sync(reader.start, name, after)
            deadline = time.monotonic() + seconds
            while True:
                seen = version()
                body, n = await anyio.to_thread.run_sync(fetch, name, at, limit, coalesce)
                if n or time.monotonic() >= deadline or await request.is_disconnected():
                    return Response(body, media_type="application/json")
                await _changes(seen, min(deadline, time.monotonic() + 1.0))
        finally:
            release()

    @router.get(
        "/{name}/subscribe",
        dependencies=[Consumer],
        response_class=StreamingResponse,
        summary="Server-Sent Events: every message after a marker, then new ones as they come",
    )
    async def subscribe(
        request: Request,
        name: StreamName,
        after: After = None,
        coalesce: Annotated[bool, Query()] = False,
        last_event_id: Annotated[
            str | None, Header(alias="Last-Event-ID", max_length=20_000)
        ] = None,
    ) -> StreamingResponse:
        import anyio
        from starlette.background import BackgroundTask

        release = connections.open(name, client(request))
        try:
            at = await anyio.to_thread.run_sync(reader.start, name, last_event_id or after)
            # A position the stream no longer holds is an HTTP error before the events start.
            await anyio.to_thread.run_sync(fetch, name, at, 1, False)
        except BaseException:
            release()
            raise

        async def events() -> AsyncIterator[bytes]:
            try:
                async for chunk in subscription(at):
                    yield chunk
            finally:
                release()

        async def subscription(at: dict[str, Cursor]) -> AsyncIterator[bytes]:
            position = at
            keepalive = time.monotonic() + KEEPALIVE
            while not await request.is_disconnected():
                seen = version()
                body, n = await anyio.to_thread.run_sync(fetch, name, position, 500, coalesce)
                page = json.loads(body)
                for m in page["messages"]:
                    data = json.dumps(m, ensure_ascii=False, separators=(",", ":"))
                    yield f"id: {m['progress']}\nevent: message\ndata: {data}\n\n".encode()
                if page["progress"] != markers.encode(name, position):
                    position = markers.decode(name, page["progress"])
                    if not page["messages"]:  # a window that collapsed to nothing
                        yield f"id: {page['progress']}\nevent: progress\ndata: {{}}\n\n".encode()
                if n:
                    keepalive = time.monotonic() + KEEPALIVE
                    continue
                if time.monotonic() >= keepalive:
                    yield b": keep-alive\n\n"
                    keepalive = time.monotonic() + KEEPALIVE
                await _changes(seen, time.monotonic() + 1.0)

        return StreamingResponse(
            events(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            background=BackgroundTask(release),  # also when the events never started
        )

    # -- consumer groups -----------------------------------------------------------------
    @router.get(
        "/{name}/groups/{group}",
        dependencies=[Consumer],
        summary="A consumer group's checkpoint (a new group starts now)",
    )
    def get_group(name: StreamName, group: GroupName) -> dict[str, Any]:
        at = reader.start(name, None, group)
        return {"stream": name, "group": group, "progress": markers.encode(name, at)}

    @router.post(
        "/{name}/groups/{group}/ack",
        dependencies=[Consumer],
        summary="Store a consumer group's progress (per source it never goes back)",
    )
    def ack(name: StreamName, group: GroupName, body: Ack) -> dict[str, Any]:
        stored = reader.ack(name, group, body.progress)
        return {"stream": name, "group": group, "progress": markers.encode(name, stored)}

    return router


def _message(m: Delivered) -> str:
    head = {
        "source": m.source,
        "table": m.table,
        "action": m.action,
        "key": m.key,
        "lsn": m.lsn,
        "seq": m.seq,
        "idempotency_key": m.idempotency_key,
        "progress": m.progress,
    }
    if m.coalesced is not None:
        head["coalesced"] = m.coalesced
    text = json.dumps(head, ensure_ascii=False, separators=(",", ":"))
    return text[:-1] + f',"message":{m.value if m.value is not None else "null"}}}'


def _wait_seconds(wait: str) -> float:

    try:
        seconds = float(parse_duration(wait))
    except ValueError:
        raise problem(
            422, f"wait: {wait!r} is not a duration", "write e.g. 30s, 500ms or 10"
        ) from None
    if not 0 <= seconds <= MAX_WAIT:
        raise problem(422, f"wait: at most {MAX_WAIT:g}s", f"pass wait <= {MAX_WAIT:g}s")
    return seconds


async def _changes(seen: int, until: float) -> None:
    """Sleep until this process's streams got new messages, or `until` (monotonic)."""
    while version() == seen and time.monotonic() < until:
        await asyncio.sleep(0.05)
