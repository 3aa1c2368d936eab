"""A compacted Kafka topic as `walstream verify` compares it (docs/verify.md, "Kafka").

What a consumer of a compacted topic ends up with is, per message key, the latest message:
compaction keeps nothing else, and a delete (or a tombstone) removes the key. `Latest`
reads the topic from its start to the end it has when asked, and later only what was
added, and keeps that per key. For a table, the sink's side is then each key's latest
`record` whose message is of that table, verbatim; the source's side is each row's
`record` as a backfill reads it (the decoder's codecs over the column texts: the bytes the
stream sends for the same values), keyed as the sink keys its messages (the key values
joined by `,`). Both are compared by the comparison of any other sink (`run.py`), over the
columns `_key` and `record` of a `TableShape` of their own.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import orjson

from walstream.backfill.chunks import Key, Table, chunk_query, plan
from walstream.backfill.predicate import Predicate
from walstream.decode.table_shape import Column, TableShape
from walstream.errors import ConfigError, WalstreamError
from walstream.postgres.replication import connect
from walstream.verify.sides import Boundary, Side

#: The client settings of a sink's `producer:` a consumer of its topic needs too.
CLIENT_PREFIXES = ("security.", "sasl.", "ssl.", "socket.", "broker.", "client.")
_RECORD_AT = len('{"record":')
#: Seconds a producer's clock may be ahead of this one: a message with a timestamp later
#: than this after a read began was sent after it (`Latest._read`).
CLOCK_SKEW = 2.0


def keyed_shape(schema: str, table: str) -> TableShape:
    """The two columns a topic's table is compared over: message key and record JSON."""
    columns = (Column("_key", "STRING", False), Column("record", "STRING"))
    return TableShape(schema, table, columns, ("_key",))


def consumer_settings(dest: Any) -> dict[str, Any]:
    settings = {k: v for k, v in dest.producer.items() if k.startswith(CLIENT_PREFIXES)}
    return {"bootstrap.servers": dest.bootstrap_servers, **settings}


def check_compacted(settings: dict[str, Any], topic: str, sink: str) -> None:
    """A ConfigError unless the topic's cleanup.policy compacts it."""
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

    admin = AdminClient(settings)
    try:
        (future,) = admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)]).values()
        found = future.result(30)
    except Exception as exc:
        raise WalstreamError(
            f"cannot read the settings of topic {topic} of sink {sink}: {exc}",
            "check that the broker is up, the topic exists and these credentials may describe it",
        ) from None
    entry = found.get("cleanup.policy")
    policy = entry.value if entry is not None and entry.value else "delete"
    if "compact" not in policy:
        raise ConfigError(
            f"sink {sink} cannot be verified: its topic {topic} is not compacted "
            f"(cleanup.policy={policy}), so a key whose last change is older than the "
            "topic's retention is gone from it while its row is not",
            f"compact the topic (kafka-configs --alter --entity-type topics --entity-name "
            f"{topic} --add-config cleanup.policy=compact), or verify a mirror",
        )


class Latest:
    """Per message key, the latest message of a topic: (schema, table, record) or None
    (a delete or a tombstone). `catch_up()` reads what was added since the last call.
    Keys are what they mean (`_key`): a Debezium key written in other bytes (its fields
    spaced or ordered otherwise) is the same key, as a consumer applying the records
    takes it."""

    def __init__(self, settings: dict[str, Any], topic: str, fmt: str, table: tuple[str, str]):
        self.settings, self.topic, self.fmt = settings, topic, fmt
        self.table = table  # a `record` message does not say its table: the sink's only one
        self.latest: dict[str, tuple[str, str, str] | None] = {}
        self.next: dict[int, int] = {}  # partition -> the offset to read from

    def catch_up(self) -> None:
        from confluent_kafka import Consumer, TopicPartition

        # a fetch at a partition's end is answered when data comes or this passed: the
        # end (which stops the read) is then known at once, not after librdkafka's 500 ms
        reading = {
            "group.id": "walstream-verify",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 10,
        }
        consumer = Consumer(self.settings | reading | {"enable.partition.eof": True})
        try:
            meta = consumer.list_topics(self.topic, timeout=30).topics.get(self.topic)
            if meta is None or meta.error is not None:
                raise WalstreamError(
                    f"cannot read topic {self.topic}: {getattr(meta, 'error', 'no such topic')}",
                    "check that it exists (the sink creates it with create_topics: true)",
                )
            asked = time.time()
            starts = {}
            for p in meta.partitions:
                low, _ = consumer.get_watermark_offsets(TopicPartition(self.topic, p), 30)
                starts[p] = max(self.next.get(p, low), low)
            self._read(consumer, starts, int((asked + CLOCK_SKEW) * 1000))
        finally:
            consumer.close()

    def _read(self, consumer: Any, starts: dict[int, int], until: int) -> None:
        """Each partition's messages from `starts` on, until the broker says a fetch reached
        its end or a message is newer than `until` (ms since the epoch): every message sent
        before the read began is then read, and a read while writes flow does not chase the
        moving end (an end reached comes only when nothing was added since the fetch; the
        end offsets tansu lists are not the end: they point into its last batch)."""
        from confluent_kafka import KafkaError, TopicPartition

        consumer.assign([TopicPartition(self.topic, p, at) for p, at in starts.items()])
        self.next.update(starts)
        left, heard = set(starts), time.monotonic()
        while left:
            # consume() returns once it has its count or its timeout passed: a topic's last
            # few hundred messages (and the end) would each cost the whole wait
            got = consumer.consume(1_000, timeout=0.1)
            if not got and time.monotonic() - heard > 30:
                raise WalstreamError(
                    f"reading topic {self.topic}: partition(s) {sorted(left)} did not reach "
                    f"their end in 30s (at offsets {[self.next[p] for p in sorted(left)]})",
                    "check the broker, and verify again",
                )
            heard = time.monotonic() if got else heard
            for msg in got:
                p, error = msg.partition(), msg.error()
                if error is not None and error.code() == KafkaError._PARTITION_EOF:
                    left.discard(p)
                elif error is not None:
                    raise WalstreamError(f"reading topic {self.topic}: {error}", "verify again")
                elif msg.offset() >= self.next.get(p, 0):
                    self.next[p] = msg.offset() + 1
                    self.add(msg.key(), msg.value())
                    if msg.timestamp()[1] > until:
                        left.discard(p)
        consumer.unassign()

    def add(self, key: bytes | None, value: bytes | None) -> None:
        """One message, read after those before it."""
        self.latest[self._key(key or b"")] = self._entry(value)

    def _entry(self, value: bytes | None) -> tuple[str, str, str] | None:
        if value is None:
            return None  # a tombstone
        if self.fmt == "debezium":
            payload = _payload(orjson.loads(value))
            after = payload.get("after")
            if payload.get("op") == "d" or after is None:
                return None  # a delete (or a truncate, which has no key)
            source = payload["source"]
            return source["schema"], source["table"], orjson.dumps(after).decode()
        text = value.decode()
        if self.fmt == "record":
            return (*self.table, text)
        message = json.loads(text)
        if message.get("action") == "delete":
            return None
        meta = message["metadata"]
        _, end = json.JSONDecoder().raw_decode(text, _RECORD_AT)
        return meta["table_schema"], meta["table_name"], text[_RECORD_AT:end]

    def of(self, schema: str, table: str) -> dict[str, str]:
        """The table's rows a consumer has: message key -> record."""
        return {
            k: e[2]
            for k, e in self.latest.items()
            if e is not None and e[0] == schema and e[1] == table
        }

    def _key(self, raw: bytes) -> str:
        """A message key as the report lists it: as it is, or a Debezium key's JSON (its
        payload without the schema, fields in name order: `key_json`). A key that is not
        what the format writes stays as it is (it is then a key the source lacks)."""
        if self.fmt == "debezium":
            try:
                return key_json(_payload(orjson.loads(raw)))
            except orjson.JSONDecodeError:
                pass
        return raw.decode(errors="backslashreplace")


def key_json(payload: Any) -> str:
    """A Debezium key's payload as one text per key: compact JSON, fields in name order."""
    return orjson.dumps(payload, option=orjson.OPT_SORT_KEYS).decode()


def _payload(message: Any) -> Any:
    """A Kafka Connect JSON record's payload: with schemas on, `{"schema", "payload"}`."""
    if isinstance(message, dict) and message.keys() == {"schema", "payload"}:
        return message["payload"]
    return message


class TopicTable(Side):
    """One table's rows in a compacted topic (`Latest`, caught up at each read)."""

    def __init__(self, latest: Latest, schema: str, table: str) -> None:
        super().__init__("sink", keyed_shape(schema, table))
        self.latest, self.schema, self.table = latest, schema, table

    def _table(self, keep: Any = None) -> Any:
        import pyarrow as pa

        self.latest.catch_up()
        rows = self.latest.of(self.schema, self.table)
        keys = [k for k in rows if keep is None or k in keep]
        return pa.table(
            {"_key": pa.array(keys, pa.string()), "record": pa.array([rows[k] for k in keys])},
            schema=self.shape.arrow_schema(),
        )

    def batches(self, after: Key | None = None) -> Iterator[Any]:
        assert after is None, "a topic is read whole"
        yield self._table()

    def rows(self, keys: Any) -> Iterator[Any]:
        yield self._table(set(keys.column("_key").to_pylist()))


class SourceRecords(Side):
    """A source table's rows as a sink's messages carry them: message key and `record`
    (`values.columns.records`, as a backfill reads a chunk), in key ranges."""

    def __init__(
        self,
        dsn: str,
        prepared: Any,
        chunk_size: int,
        where: Predicate | None = None,
        debezium: DebeziumRows | None = None,
    ) -> None:
        table: Table = prepared.table
        super().__init__("source", keyed_shape(table.schema, table.name), where)
        self.dsn, self.prepared, self.chunk_size = dsn, prepared, chunk_size
        self.debezium = debezium  # format debezium: each row as its record's key and after

    def _codecs(self) -> list[Any]:
        from walstream.decode.types import TypeRegistry

        registry = TypeRegistry(self.prepared.types)
        return [registry.codec(o) for o in self.prepared.type_oids]

    def _keyed(self, reader: Any, query: str) -> Iterator[Any]:
        import pyarrow as pa

        from walstream.backfill.adbc import fetch_batches
        from walstream.formats.keys import message_keys
        from walstream.values.columns import json_nulls, records

        t = self.prepared.table
        codecs = self._codecs()
        for batch in fetch_batches(reader, query):
            record, pk = records(batch.columns, t.columns, codecs, self.prepared.key_idx)
            if self.debezium is None:
                yield pa.table({"_key": message_keys(pk), "record": record})
            else:
                nulls = json_nulls(batch.columns, t.columns, codecs)
                yield self.debezium.table(record, nulls)

    def _select(self) -> list[Any]:
        from walstream.values.columns import select_texts

        t = self.prepared.table
        return select_texts(t.columns, self._codecs(), self.prepared.type_oids)

    def batches(self, after: Key | None = None) -> Iterator[Any]:
        import psycopg

        from walstream.backfill import adbc

        t = self.prepared.table
        with connect(self.dsn, autocommit=True) as conn:
            reader = adbc.connect(self.dsn)
            try:
                for r in plan(conn, t, self.chunk_size, self.where, after):
                    query, params = chunk_query(t, r, self.where, self._select())
                    yield from self._keyed(
                        reader, psycopg.ClientCursor(conn).mogrify(query, params)
                    )
                    if r.upto is not None:
                        yield Boundary(r.upto)
            finally:
                reader.close()

    def rows(self, keys: Any) -> Iterator[Any]:
        """The rows whose message key is among `keys` (a scan of the key columns' texts:
        a key of several columns joined by `,` cannot always be split back)."""
        import psycopg
        from psycopg import sql

        from walstream.backfill import adbc

        t = self.prepared.table
        wanted = keys.column("_key").to_pylist()
        if not wanted:
            return
        if self.debezium is not None:
            wanted = [self.debezium.joined(k) for k in wanted]
        joined = sql.SQL("concat_ws(',', {})").format(
            sql.SQL(", ").join(sql.SQL("{}::text").format(sql.Identifier(k)) for k in t.pk)
        )
        query = sql.SQL("SELECT {} FROM {} WHERE {} = ANY(%s)").format(
            sql.SQL(", ").join(self._select()), t.ident, joined
        )
        with connect(self.dsn, autocommit=True) as conn:
            text = psycopg.ClientCursor(conn).mogrify(query, (wanted,))
            reader = adbc.connect(self.dsn)
            try:
                yield from self._keyed(reader, text)
            finally:
                reader.close()


def equivalent(
    source: list[Any], sink: list[Any], placeholders: dict[str, Any] | None = None
) -> set[tuple[str]]:
    """Of the rows of both sides, the keys whose sink record equals the source's on every
    column it has, leaving some out: an update's record without its unchanged TOASTed
    values, which the key's earlier messages had (compaction removed them). With
    `placeholders` (format debezium: per column, the value it sends for one left out),
    the record has every column, those left out holding their placeholder."""

    def records(tables: list[Any]) -> dict[str, str]:
        out: dict[str, str] = {}
        for t in tables:
            out.update(
                zip(t.column("_key").to_pylist(), t.column("record").to_pylist(), strict=True)
            )
        return out

    want, have = records(source), records(sink)
    alike = set()
    for key, text in have.items():
        if key in want and text is not None and want[key] is not None:
            full, part = json.loads(want[key]), json.loads(text)
            if placeholders is not None:  # the columns left out, and the rest as the source's
                out = {c for c, v in part.items() if c in placeholders and v == placeholders[c]}
                part = {c: v for c, v in part.items() if c not in out or full.get(c) == v}
            if set(part) < set(full) and all(full[c] == v for c, v in part.items()):
                alike.add((key,))
    return alike


#: Key column types whose value in a Debezium key is the column's text (as JSON): what
#: verify maps a key back to its row by.
TEXT_KEYS = frozenset({"int2", "int4", "int8", "text", "varchar", "uuid", "bool"})


class DebeziumRows:
    """A table's rows as format debezium's records carry them: the key's payload and the
    value's `after` (`TableMessages.row` over the record a backfill reads), compact JSON."""

    def __init__(self, maker: Any, pk: list[str]) -> None:
        self.maker, self.pk = maker, pk
        #: Per column Debezium sends, its value for an unchanged TOASTed one left out.
        self.placeholders = maker.placeholders()

    def table(self, record: Any, nulls: Any) -> Any:
        import pyarrow as pa

        keys, rows = [], []
        for text, null in zip(record.to_pylist(), nulls.to_pylist(), strict=True):
            row = self.maker.row(text, null or ())
            keys.append(key_json(self.maker.key_of(row)))
            rows.append(orjson.dumps(row).decode())
        return pa.table(
            {"_key": pa.array(keys, pa.string()), "record": pa.array(rows, pa.string())}
        )

    def joined(self, key: str) -> str:
        """A report key (the key's JSON) as the key columns' texts joined by `,`."""
        values = orjson.loads(key)
        return ",".join(_text(values[c]) for c in self.pk)

    def equivalent(self, source: list[Any], sink: list[Any]) -> set[tuple[str]]:
        return equivalent(source, sink, self.placeholders)


def _text(v: Any) -> str:
    return ("true" if v else "false") if isinstance(v, bool) else str(v)


def debezium_rows(sink: Any, dsn: str, table: Table) -> tuple[DebeziumRows, str]:
    """A format debezium sink's records of `table`, and the topic they go to; a ConfigError
    for a table whose key verify cannot map back to its rows."""
    from walstream.formats.debezium import topic
    from walstream.formats.debezium_types import load_columns, load_key

    settings = sink.debezium_settings()
    prefix = settings.prefix or sink.source
    with connect(dsn, autocommit=True) as conn:
        columns, key = load_columns(conn, table.oid), load_key(conn, table.oid)
    types = {c.name: c for c in columns}
    odd = [k for k in key if types[k].array or types[k].type not in TEXT_KEYS]
    if not key or odd:
        why = (
            "has no primary key (Debezium's records of it have no key)"
            if not key
            else f"has key column {odd[0]} of type {types[odd[0]].type}, which Debezium's "
            "key holds in a form verify does not map back to a row yet"
        )
        raise ConfigError(
            f"sink {sink.name} cannot be verified: table {table.qualified} {why}",
            "leave the table out (--table names the others), or verify a mirror of it",
        )
    maker = settings.messages(prefix, "", table.schema, table.name, columns, key)
    dest = sink.destination.unwrapped()
    return DebeziumRows(maker, list(table.pk)), dest.topic or topic(
        prefix, table.schema, table.name
    )
