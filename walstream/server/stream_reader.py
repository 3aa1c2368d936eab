"""Reading a `type: stream` sink's messages for a consumer: where a read starts (a
progress marker, a consumer group's checkpoint, or now), a page of messages each with
the marker to resume after it, and coalescing while far behind. The HTTP/SSE API
(`streams.py`) and the gRPC PullerService (`puller/`) both read
through it, so their markers, tokens and gaps are one and the same.

Problems are `StreamProblem`s carrying an HTTP status; gRPC maps it to its own codes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from walstream.errors import WalstreamError
from walstream.sinks.base import PullStreamSettings
from walstream.streams import markers
from walstream.streams.coalesce import coalesce, rewrite
from walstream.streams.markers import BadMarker, Cursor
from walstream.streams.store import Ahead, Expired, Page

if TYPE_CHECKING:
    from walstream.config import SinkConfig
    from walstream.server.metrics import Metrics
    from walstream.server.status import Control


class StreamProblem(WalstreamError):
    """A request a stream cannot answer: `status` is the HTTP status that says why."""

    def __init__(self, status: int, problem: str, fix: str | None = None) -> None:
        self.status = status
        super().__init__(problem, fix)


@dataclass(frozen=True)
class Delivered:
    """One message as a consumer gets it: its metadata, value (JSON text) and marker."""

    source: str
    table: str
    action: str
    key: Any
    lsn: int
    seq: int
    idempotency_key: str
    progress: str
    value: str | None
    coalesced: int | None  # how many changes of the row it stands for, when coalesced


@dataclass(frozen=True)
class Read:
    messages: list[Delivered]
    progress: str  # where the next read starts once every message was processed
    coalesced: bool
    behind: int | None


class StreamReader:
    """The streams of one running walstream, as consumers read them."""

    def __init__(self, control: Control, metrics: Metrics) -> None:
        self.control = control
        self.metrics = metrics
        self.streams = control.config.streams()

    def feeding(self, name: str) -> list[SinkConfig]:
        if name not in self.streams:
            raise StreamProblem(
                404,
                f"no stream named {name!r}",
                f"streams are: {', '.join(self.streams) or 'none (add a sink with type: stream)'}",
            )
        return self.streams[name]

    def sources(self, name: str) -> set[str]:
        return {s.source for s in self.feeding(name)}

    def settings(self, name: str) -> PullStreamSettings:
        dest = self.feeding(name)[0].destination
        assert dest.pull_stream() == name
        return dest  # type: ignore[return-value]

    def token(self, name: str) -> str:
        """The stream's consumer token; a StreamProblem (403) when it has none."""
        token = self.settings(name).consumer_token()
        if token is None:
            raise StreamProblem(
                403,
                f"stream {name} has no consumer token: its read API is off",
                "set destination.token of its sinks (or WALSTREAM_STREAMS_TOKEN) and restart",
            )
        return token

    def store(self) -> Any:
        if self.control.streams is None:
            raise StreamProblem(503, "walstream is starting", "try again in a moment")
        return self.control.streams

    def head(self, name: str) -> dict[str, Cursor]:
        return {s: p.visible for s, p in self.store().positions(name).items()}

    def start(self, name: str, after: str | None, group: str | None = None) -> dict[str, Cursor]:
        """Where a read starts: a marker's positions (`after`, or `group:<name>` for a
        consumer group's checkpoint), else the group's checkpoint, else now."""
        if after and after.startswith("group:"):
            group, after = after.removeprefix("group:"), None
            if not group or len(group) > 200:
                raise StreamProblem(400, "after=group:<name> needs a group name (1-200 characters)")
        if not after:
            return self.store().group(name, group, self.head(name)) if group else self.head(name)
        try:
            return markers.decode(name, after, self.sources(name))
        except BadMarker as exc:
            raise StreamProblem(
                400, f"after: {exc}", "pass a `progress` value this stream returned"
            ) from None

    def read(self, name: str, at: dict[str, Cursor], limit: int, coalescing: bool) -> Read:
        """The messages after `at` (at most `limit`), collapsed per row while the reader is
        more than the stream's `catch_up_threshold` behind and `coalescing` is asked for."""
        sinks = self.feeding(name)
        threshold = self.settings(name).catch_up_threshold
        formats = {s.source: (s.format if s.transform is None else "custom") for s in sinks}
        try:
            page: Page = self.store().read(
                name,
                [s.source for s in sinks],
                at,
                limit,
                count_up_to=threshold + 1 if coalescing else None,
            )
        except (Expired, Ahead) as exc:
            raise self._gap(name, exc) from None
        positions = dict(at)
        progress = []
        for m in page.messages:
            positions[m.source] = m.cursor
            progress.append(markers.encode(name, positions))
        collapse = coalescing and page.behind is not None and page.behind > threshold
        out = []
        if collapse:
            for e in coalesce(page.messages):
                m = page.messages[e.last]
                value = m.value
                if value is not None and e.action != m.action:
                    value = rewrite(value, formats.get(m.source, "custom"), e.action, m.action)
                out.append(_delivered(m, e.action, value, progress[e.last], e.count))
        else:
            out = [
                _delivered(m, m.action, m.value, p, None)
                for m, p in zip(page.messages, progress, strict=True)
            ]
        self.metrics.stream_served.labels(name).inc(len(out))
        return Read(out, markers.encode(name, positions), collapse, page.behind)

    def ack(self, name: str, group: str, progress: str) -> dict[str, Cursor]:
        """Store a consumer group's progress (per source it never goes back)."""
        try:
            at = markers.decode(name, progress, self.sources(name))
        except BadMarker as exc:
            raise StreamProblem(
                400, f"progress: {exc}", "pass a `progress` value this stream returned"
            ) from None
        visible = self.head(name)
        for source, cursor in sorted(at.items()):
            if cursor > visible.get(source, markers.START):
                shown = visible.get(source, markers.START)
                raise StreamProblem(
                    400,
                    f"progress: the position {cursor[0]}:{cursor[1]} of source {source} is past "
                    f"what the stream has made visible ({shown[0]}:{shown[1]})",
                    "ack only a `progress` value this stream returned",
                )
        return dict(self.store().ack(name, group, at))

    def describe(self, name: str) -> dict[str, Any]:
        dest = self.settings(name)
        count, size, oldest = self.store().stats(name)
        positions = self.store().positions(name)
        return {
            "name": name,
            "sources": [s.source for s in self.feeding(name)],
            "sinks": [s.name for s in self.feeding(name)],
            "retention_seconds": dest.retention,
            "max_bytes": dest.max_bytes,
            "catch_up_threshold": dest.catch_up_threshold,
            "messages": count,
            "bytes": size,
            "oldest_age_seconds": round(time.time() - oldest, 3) if oldest else None,
            "head": markers.encode(name, {s: p.visible for s, p in positions.items()}),
            "positions": {
                s: {"visible": list(p.visible), "expired": list(p.expired)}
                for s, p in positions.items()
            },
            "reads_enabled": dest.consumer_token() is not None,
        }

    def _gap(self, name: str, exc: Expired | Ahead) -> StreamProblem:
        self.metrics.stream_gaps.labels(name).inc()
        if isinstance(exc, Expired):
            return StreamProblem(
                410,
                f"the consumer has a gap: messages of source {exc.source} after its position "
                f"{exc.at[0]}:{exc.at[1]} were deleted by the stream's retention (through "
                f"{exc.expired[0]}:{exc.expired[1]})",
                "rebuild the consumer's state from the source (e.g. a backfill to this stream), "
                "then read from now (no after)",
            )
        return StreamProblem(
            410,
            f"the position {exc.at[0]}:{exc.at[1]} of source {exc.source} is past what the "
            f"stream holds ({exc.visible[0]}:{exc.visible[1]}): the stream was reset or the "
            "marker is from another deployment",
            "rebuild the consumer's state, then read from now (no after)",
        )


def _delivered(
    m: Any, action: str, value: str | None, progress: str, count: int | None
) -> Delivered:
    return Delivered(
        m.source, m.table, action, m.key, m.lsn, m.seq, m.idempotency_key, progress, value, count
    )
