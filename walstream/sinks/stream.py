"""Pull subscriptions' sink: messages kept in the state database for consumers to pull.

Each chunk is written in one transaction (`ON CONFLICT DO NOTHING`: a replayed batch
writes nothing twice). Like the file sink it replaces batches: no ledger, no parking —
a failure fails the batch, which Spark replays. After every partition of a batch has
written, the driver makes the batch's messages visible to readers
(`batch_delivered`), so readers never see a later message of a source before an
earlier one. See walstream/streams/store.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import psycopg
from pydantic import Field, PrivateAttr, SecretStr

from walstream.errors import ConnectionFailed, SinkError
from walstream.fields import Duration, Size, token_from
from walstream.sinks.base import (
    BatchSink,
    Capabilities,
    DestinationSettings,
    Kind,
    Message,
    SinkContext,
)
from walstream.sinks.registry import register
from walstream.state.streams import Row, StreamTables


class StreamDestination(DestinationSettings):
    """Messages kept in the state database for pull consumers (`GET /v1/streams/{stream}`).

    Several sinks, each of another source, may feed one stream: consumers read one merged
    stream whose progress markers carry every source's position. Messages are kept for
    `retention` and while the stream holds at most `max_bytes`; a consumer behind by more
    than `catch_up_threshold` messages may ask for coalesced changes.
    """

    type: Literal["stream"]
    stream: str = Field(pattern=r"^[a-z][a-z0-9_-]{0,62}$")
    retention: Duration = 3600.0
    max_bytes: Size = 1 << 30
    catch_up_threshold: int = Field(10_000, ge=1)
    #: Consumers' bearer token. Unset: `WALSTREAM_STREAMS_TOKEN`; neither: the stream's
    #: read API is off (403).
    token: SecretStr | None = None
    # Set by the config's plan (`resolved`): the sink's source, where the state database is.
    _source: str = PrivateAttr("")
    _dsn: str = PrivateAttr("")
    _schema: str = PrivateAttr("walstream")

    def consumer_token(self) -> str | None:
        return token_from(self.token, "WALSTREAM_STREAMS_TOKEN")

    def pull_stream(self) -> str:
        return self.stream

    @classmethod
    def check_sinks(cls, sinks: Sequence[tuple[int, Any]]) -> None:
        """The sinks feeding one stream come from different sources and agree on its settings."""
        seen: dict[str, tuple[int, Any]] = {}
        for i, sink in sinks:
            dest = sink.destination
            stream = dest.stream
            if stream not in seen:
                seen[stream] = (i, sink)
                continue
            j, first = seen[stream]
            if first.source == sink.source:
                raise ValueError(
                    f"sinks[{i}].destination.stream: sinks[{j}] ({first.name}) already feeds "
                    f"stream {stream!r} from source {sink.source!r}; one sink per source "
                    "and stream (merge their tables and filters into one sink)"
                )
            for key in ("retention", "max_bytes", "catch_up_threshold", "token"):
                if getattr(dest, key) != getattr(first.destination, key):
                    raise ValueError(
                        f"sinks[{i}].destination.{key}: differs from sinks[{j}] ({first.name}), "
                        f"which feeds the same stream {stream!r}; give both the same {key}"
                    )

    def resolved(self, context: SinkContext) -> StreamDestination:
        """A copy that knows the sink's source and the state database it writes to."""
        copy = self.model_copy()
        copy._source, copy._dsn = context.source, context.state_dsn
        copy._schema = context.state_schema
        return copy


@register
class StreamSink(BatchSink):
    settings_model = StreamDestination
    capabilities = Capabilities(Kind.BATCHES, columns=True)

    def __init__(self, config: StreamDestination) -> None:
        super().__init__(config)
        self.store = StreamTables(config._dsn, config._schema)
        self.stream, self.source = config.stream, config._source

    def deliver(self, messages: Sequence[Message]) -> None:
        rows: list[Row] = []
        for m in messages:
            value = m.value.decode() if m.value is not None else None
            key = m.key.decode() if m.key else None  # no key (truncate, no primary key): NULL
            rows.append(
                (
                    self.stream,
                    self.source,
                    m.lsn,
                    m.seq,
                    m.table,
                    m.action,
                    key,
                    m.idempotency_key,
                    value,
                    len(m.value or b""),
                )
            )
        self._write(rows)

    def deliver_columns(self, batch: Any) -> None:
        col = dict(zip(batch.schema.names, batch.columns, strict=True))
        n = batch.num_rows
        stream, source = [self.stream] * n, [self.source] * n
        tables = [
            f"{s}.{t}"
            for s, t in zip(col["schema"].to_pylist(), col["table"].to_pylist(), strict=True)
        ]
        keys = [k or None for k in col["_key"].to_pylist()]
        values = col["_message"].to_pylist()
        sizes = [len(v.encode()) for v in values]
        self._write(
            list(
                zip(
                    stream,
                    source,
                    col["lsn"].to_pylist(),
                    col["seq"].to_pylist(),
                    tables,
                    col["action"].to_pylist(),
                    keys,
                    col["_ikey"].to_pylist(),
                    values,
                    sizes,
                    strict=True,
                )
            )
        )

    def _write(self, rows: list[Row]) -> None:
        try:
            self.store.write(rows)
        except ConnectionFailed as exc:  # the state database is down: the batch waits
            raise SinkError(
                f"stream {self.stream}: {exc.problem}", exc.fix, retryable=True
            ) from exc
        except psycopg.Error as exc:
            raise SinkError(
                f"stream {self.stream}: cannot keep messages in the state database: "
                f"{str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}",
                "check that the state database (state.dsn) is up and has room",
                retryable=isinstance(exc, psycopg.OperationalError),
            ) from exc

    def batch_delivered(self, sink: str, batch_id: int, last: tuple[int, int] | None) -> None:
        if last is not None:
            self.store.make_visible(self.stream, self.source, last)

    def test_connection(self) -> None:
        try:
            self.store.ensure()
        except Exception as exc:
            raise SinkError(
                f"stream {self.stream}: the state database is not reachable or writable: {exc}",
                "check state.dsn (default: the first source's dsn) and its permissions",
                retryable=True,
            ) from exc
