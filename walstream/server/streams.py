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

from fastapi import APIRouter, Depends, Header, HTTPException, Path, Query, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, Field

from walstream.fields import parse_duration
from walstream.server.answers import check_bearer, problem
from walstream.server.connections import Connections
from walstream.sinks.stream import StreamDestination
from walstream.state.streams import version
from walstream.streams import markers
from walstream.streams.coalesce import coalesce, rewrite
from walstream.streams.markers import BadMarker, Cursor
from walstream.streams.store import Ahead, Expired, Page

if TYPE_CHECKING:
    from walstream.config import SinkConfig
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
    streams = control.config.streams()
    server = control.config.server
    connections = Connections(server.max_stream_connections, server.max_client_connections)

    def client(request: Request) -> str:
        return request.client.host if request.client is not None else "?"

    def feeding(name: str) -> list[SinkConfig]:
        if name not in streams:
            raise problem(
                404, f"no stream named {name!r}",
                f"streams are: {', '.join(streams) or 'none (add a sink with type: stream)'}",
            )  # fmt: skip
        return streams[name]

    def sources(name: str) -> set[str]:
        return {s.source for s in feeding(name)}

    def settings(name: str) -> StreamDestination:
        dest = feeding(name)[0].destination
        assert isinstance(dest, StreamDestination)
        return dest

    def consumer(request: Request, name: StreamName) -> None:
        token = settings(name).consumer_token()
        if token is None:
            raise problem(
                403, f"stream {name} has no consumer token: its read API is off",
                "set destination.token of its sinks (or WALSTREAM_STREAMS_TOKEN) and restart",
            )  # fmt: skip
        check_bearer(request, token, "consumer token")

    Consumer = Depends(consumer)

    def store() -> Any:
        if control.streams is None:
            raise problem(503, "walstream is starting", "try again in a moment")
        return control.streams

    def head(name: str) -> dict[str, Cursor]:
        return {s: p.visible for s, p in store().positions(name).items()}

    def start(name: str, after: str | None) -> dict[str, Cursor]:
        """Where a read starts: a marker's positions, a group's checkpoint, or now."""
        if not after:
            return head(name)
        if after.startswith("group:"):
            group = after.removeprefix("group:")
            if not group or len(group) > 200:
                raise problem(400, "after=group:<name> needs a group name (1-200 characters)")
            return store().group(name, group, head(name))
        try:
            return markers.decode(name, after, sources(name))
        except BadMarker as exc:
            raise problem(
                400, f"after: {exc}", "pass a `progress` value this stream returned"
            ) from None

    def gone(name: str, exc: Expired | Ahead) -> HTTPException:
        metrics.stream_gaps.labels(name).inc()
        if isinstance(exc, Expired):
            return problem(
                410,
                f"the consumer has a gap: messages of source {exc.source} after its position "
                f"{exc.at[0]}:{exc.at[1]} were deleted by the stream's retention (through "
                f"{exc.expired[0]}:{exc.expired[1]})",
                "rebuild the consumer's state from the source (e.g. a backfill to this stream), "
                "then read from now (no after)",
            )
        return problem(
            410,
            f"the position {exc.at[0]}:{exc.at[1]} of source {exc.source} is past what the "
            f"stream holds ({exc.visible[0]}:{exc.visible[1]}): the stream was reset or the "
            "marker is from another deployment",
            "rebuild the consumer's state, then read from now (no after)",
        )

    def fetch(name: str, at: dict[str, Cursor], limit: int, coalescing: bool) -> tuple[bytes, int]:
        """The response body for messages after `at`, and how many messages it holds."""
        sinks = feeding(name)
        dest = settings(name)
        formats = {s.source: (s.format if s.transform is None else "custom") for s in sinks}
        threshold = dest.catch_up_threshold
        try:
            page: Page = store().read(
                name, [s.source for s in sinks], at, limit,
                count_up_to=threshold + 1 if coalescing else None,
            )  # fmt: skip
        except (Expired, Ahead) as exc:
            raise gone(name, exc) from None
        positions = dict(at)
        progress = []
        for m in page.messages:
            positions[m.source] = m.cursor
            progress.append(markers.encode(name, positions))
        final = markers.encode(name, positions)
        collapse = coalescing and page.behind is not None and page.behind > threshold
        parts = []
        if collapse:
            for e in coalesce(page.messages):
                m = page.messages[e.last]
                value = m.value
                if value is not None and e.action != m.action:
                    value = rewrite(value, formats.get(m.source, "custom"), e.action, m.action)
                parts.append(_message(m, e.action, value, progress[e.last], e.count))
        else:
            parts = [
                _message(m, m.action, m.value, p, None)
                for m, p in zip(page.messages, progress, strict=True)
            ]
        metrics.stream_served.labels(name).inc(len(parts))
        body = (
            '{"messages":[' + ",".join(parts) + f'],"progress":{json.dumps(final)},'
            f'"coalesced":{json.dumps(collapse)},"behind":{json.dumps(page.behind)}}}'
        )
        return body.encode(), len(parts)

    # -- listing ---------------------------------------------------------------------------
    def describe(name: str) -> dict[str, Any]:
        dest = settings(name)
        count, size, oldest = store().stats(name)
        positions = store().positions(name)
        return {
            "name": name,
            "sources": [s.source for s in feeding(name)],
            "sinks": [s.name for s in feeding(name)],
            "retention_seconds": dest.retention, "max_bytes": dest.max_bytes,
            "catch_up_threshold": dest.catch_up_threshold,
            "messages": count, "bytes": size,
            "oldest_age_seconds": round(time.time() - oldest, 3) if oldest else None,
            "head": markers.encode(name, {s: p.visible for s, p in positions.items()}),
            "positions": {
                s: {"visible": list(p.visible), "expired": list(p.expired)}
                for s, p in positions.items()
            },
            "reads_enabled": dest.consumer_token() is not None,
        }  # fmt: skip

    @router.get("", summary="Streams with their sources and what they keep")
    def list_streams() -> list[dict[str, Any]]:
        return [describe(n) for n in streams]

    @router.get("/{name}", summary="One stream: sources, kept messages, head marker")
    def get_stream(name: StreamName) -> dict[str, Any]:
        feeding(name)
        return describe(name)

    # -- reading -----------------------------------------------------------------------------
    @router.get(
        "/{name}/messages", dependencies=[Consumer],
        summary="Messages after a progress marker (long-poll with wait)",
        responses={410: {"description": "The consumer has a gap: its position was deleted."}},
    )  # fmt: skip
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
            at = await anyio.to_thread.run_sync(start, name, after)
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
        "/{name}/subscribe", dependencies=[Consumer], response_class=StreamingResponse,
        summary="Server-Sent Events: every message after a marker, then new ones as they come",
    )  # fmt: skip
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
            at = await anyio.to_thread.run_sync(start, name, last_event_id or after)
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
            events(), media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            background=BackgroundTask(release),  # also when the events never started
        )  # fmt: skip

    # -- consumer groups -----------------------------------------------------------------
    @router.get("/{name}/groups/{group}", dependencies=[Consumer],
                summary="A consumer group's checkpoint (a new group starts now)")  # fmt: skip
    def get_group(name: StreamName, group: GroupName) -> dict[str, Any]:
        at = store().group(name, group, head(name))
        return {"stream": name, "group": group, "progress": markers.encode(name, at)}

    @router.post("/{name}/groups/{group}/ack", dependencies=[Consumer],
                 summary="Store a consumer group's progress (per source it never goes back)")  # fmt: skip
    def ack(name: StreamName, group: GroupName, body: Ack) -> dict[str, Any]:
        try:
            at = markers.decode(name, body.progress, sources(name))
        except BadMarker as exc:
            raise problem(
                400, f"progress: {exc}", "pass a `progress` value this stream returned"
            ) from None
        visible = head(name)
        for source, cursor in sorted(at.items()):
            if cursor > visible.get(source, markers.START):
                shown = visible.get(source, markers.START)
                raise problem(
                    400,
                    f"progress: the position {cursor[0]}:{cursor[1]} of source {source} is past "
                    f"what the stream has made visible ({shown[0]}:{shown[1]})",
                    "ack only a `progress` value this stream returned",
                )
        stored = store().ack(name, group, at)
        return {"stream": name, "group": group, "progress": markers.encode(name, stored)}

    return router


def _message(m: Any, action: str, value: str | None, progress: str, count: int | None) -> str:
    head = {
        "source": m.source, "table": m.table, "action": action, "key": m.key,
        "lsn": m.lsn, "seq": m.seq, "idempotency_key": m.idempotency_key, "progress": progress,
    }  # fmt: skip
    if count is not None:
        head["coalesced"] = count
    text = json.dumps(head, ensure_ascii=False, separators=(",", ":"))
    return text[:-1] + f',"message":{value if value is not None else "null"}}}'


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
