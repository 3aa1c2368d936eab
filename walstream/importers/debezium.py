"""A Debezium PostgreSQL connector's configuration as walstream.yaml.

Reads a Kafka Connect connector (JSON: `{"name", "config": {...}}` or the config alone, or
a `.properties` file) or Debezium Server's `application.properties` (`debezium.source.*`,
`debezium.sink.*`, `debezium.format.*`). The source keeps Debezium's slot and
publication, the sink sends Debezium's records (`format: debezium` with the connector's
value settings and topic prefix). Given Debezium's offset (`offsets`: its offset file, or
the offset's JSON from the Connect offsets topic), the source starts where Debezium left
the slot (`handover`): with Debezium stopped, nothing it sent is sent again and nothing
after it is missed (docs/from-debezium.md, "Switching").
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from walstream.change import format_lsn
from walstream.engine.sql import quote
from walstream.errors import ConfigError
from walstream.formats.debezium import PROPERTIES
from walstream.importers import Imported

#: The connector's class names walstream takes over.
CONNECTOR = "io.debezium.connector.postgresql.PostgresConnector"
_PLAIN_TABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]*\\?\.[A-Za-z_][A-Za-z0-9_$]*$")
_NAME = re.compile(r"[^a-z0-9_-]+")
#: Producer settings that mean the same to librdkafka as to Kafka's Java producer.
_PRODUCER = {
    "acks",
    "compression.type",
    "linger.ms",
    "batch.size",
    "security.protocol",
    "sasl.mechanism",
    "client.id",
    "enable.idempotence",
    "message.max.bytes",
    "request.timeout.ms",
    "retries",
    "retry.backoff.ms",
    "ssl.ca.location",
}
#: Settings that tune Debezium's own machinery: walstream has no such knob to set.
_TUNING = {
    "max.batch.size": "walstream's batches are Spark's micro-batches (source.max_changes_per_batch)",
    "max.queue.size": "walstream buffers raw WAL (source.max_buffer_bytes)",
    "max.queue.size.in.bytes": "walstream buffers raw WAL (source.max_buffer_bytes)",
    "poll.interval.ms": "walstream's trigger interval is spark.trigger_interval",
    "tasks.max": "one query per source; delivery runs in Spark tasks (sinks[].partitions)",
    "name": "the connector's name; the sink is named debezium",
    "slot.drop.on.stop": "walstream never drops its slot",
    "slot.max.retries": "walstream reconnects on its own",
    "slot.retry.delay.ms": "walstream reconnects on its own",
    "status.update.interval.ms": "walstream confirms what each batch committed",
    "offset.flush.interval.ms": "walstream's offsets are Spark's checkpoint",
    "offset.storage": "walstream's offsets are Spark's checkpoint",
    "offset.flush.timeout.ms": "walstream's offsets are Spark's checkpoint",
    "include.unknown.datatypes": "walstream sends every column Debezium's mapping has",
}


def read_properties(text: str) -> dict[str, str]:
    """A Java `.properties` file: `key=value` or `key: value`, `#`/`!` comments, a
    trailing backslash continues the line."""
    out: dict[str, str] = {}
    logical = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not logical and (not stripped or stripped[0] in "#!"):
            continue
        if stripped.endswith("\\") and not stripped.endswith("\\\\"):
            logical += stripped[:-1]
            continue
        logical += stripped
        m = re.match(r"^((?:[^=:\s\\]|\\.)+)\s*[=:\s]\s*(.*)$", logical)
        if m:
            out[m.group(1).replace("\\", "")] = m.group(2)
        elif logical:
            out[logical] = ""
        logical = ""
    return out


def read_connector(path: Path) -> tuple[dict[str, str], dict[str, str]]:
    """(the connector's settings, Debezium Server's other settings) of a config file."""
    text = path.read_text()
    if path.suffix == ".json" or text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ConfigError(
                f"{path}: not JSON ({exc})", "give the connector's JSON config"
            ) from None
        if isinstance(data, dict) and isinstance(data.get("config"), dict):
            data = data["config"]
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: not a connector config", 'give {"config": {...}}')
        return {str(k): str(v) for k, v in data.items()}, {}
    props = read_properties(text)
    if any(k.startswith("debezium.") for k in props):  # Debezium Server
        source = {
            k[len("debezium.source.") :]: v
            for k, v in props.items()
            if k.startswith("debezium.source.")
        }
        server = {k: v for k, v in props.items() if not k.startswith("debezium.source.")}
        return source, server
    return props, {}


def read_offset(path: Path) -> dict[str, Any]:
    """Debezium's offset of the connector: from its offset file (FileOffsetBackingStore: a
    Java-serialized map whose values are JSON) or a JSON file of the offset itself (as
    Kafka Connect's offsets topic holds it). The last offset in the file."""
    text = path.read_bytes().decode("latin-1")
    found = [m.group(0) for m in re.finditer(r"\{[^{}]*\"lsn[^{}]*\}", text)]
    for candidate in reversed(found):
        try:
            offset = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(offset, dict) and ("lsn" in offset or "lsn_commit" in offset):
            return offset
    raise ConfigError(
        f"{path}: no Debezium offset in it (a JSON object with lsn / lsn_commit / lsn_proc)",
        "give the connector's offset file (offset.storage.file.filename) or its offset's "
        "JSON from the Connect offsets topic",
    )


def handover_of(offset: Mapping[str, Any]) -> dict[str, str]:
    """The source's `handover` from Debezium's offset: the end of the last commit it
    delivered (`lsn_commit`) and, of the transaction after it, the last change
    (`lsn_proc`)."""
    commit = offset.get("lsn_commit", offset.get("lsn"))
    if commit is None:
        raise ConfigError("the Debezium offset has no lsn_commit or lsn", "give another offset")
    out = {"commit_end": format_lsn(int(commit))}
    processed = offset.get("lsn_proc")
    if processed is not None and int(processed) > int(commit):
        out["processed"] = format_lsn(int(processed))
    return out


def import_debezium(
    path: Path, offsets: Path | None = None, bootstrap_servers: str | None = None
) -> Imported:
    """walstream.yaml for the connector in `path` (see the module docstring)."""
    props, server = read_connector(path)
    cls = props.get("connector.class", CONNECTOR)
    if cls not in (CONNECTOR, "PostgresConnector"):
        raise ConfigError(
            f"{path}: connector.class is {cls}",
            f"walstream reads PostgreSQL: give a {CONNECTOR} config",
        )
    reading = _Reading(props, Imported({}))
    reading.take("connector.class")
    reading.out.carried("connector.class", f"{cls}: read")
    prefix = reading.take("topic.prefix") or reading.take("database.server.name")
    if prefix is None:
        raise ConfigError(f"{path}: no topic.prefix", "a Debezium connector names its topics by it")
    name = _NAME.sub("-", prefix.lower()).strip("-_") or "debezium"
    if not name[0].isalpha():
        name = "db-" + name
    source = reading.source(name)
    offsets = offsets or _offset_file(props, path)
    if offsets is not None:
        source["handover"] = h = handover_of(read_offset(offsets))
        where = h["commit_end"] + (
            f", changes through {h['processed']}" if "processed" in h else ""
        )
        reading.out.carried(
            f"offsets ({offsets.name})", f"sources[0].handover: Debezium left off at {where}"
        )
    sink = reading.sink(name, prefix, server)
    sink["destination"] = _destination(server, bootstrap_servers, reading.out)
    reading.the_rest()
    reading.out.config = {"sources": [source], "sinks": [sink]}
    return reading.out


class _Reading:
    """The connector's settings as they are read: each one taken once, each one reported."""

    def __init__(self, props: Mapping[str, str], out: Imported) -> None:
        self.props, self.out = props, out
        self.done: set[str] = set()

    def take(self, key: str) -> str | None:
        self.done.add(key)
        return self.props.get(key)

    def source(self, name: str) -> dict[str, Any]:
        """The source: its DSN, Debezium's slot (a pgoutput one) and publication, heartbeat."""
        out, take = self.out, self.take
        source: dict[str, Any] = {"name": name, "dsn": _dsn(self.props, take, out)}
        plugin = take("plugin.name") or "decoderbufs"
        slot = take("slot.name") or "debezium"
        if plugin == "pgoutput":
            source["slot"] = slot
            out.carried("slot.name", f"sources[0].slot: {slot} (walstream continues on it)")
            out.carried("plugin.name", "pgoutput: the plugin walstream reads")
        else:
            out.left(
                "plugin.name",
                f"{plugin}: walstream reads pgoutput, so it cannot continue on slot {slot}; it "
                "makes its own (walstream_" + name.replace("-", "_") + "): start it before "
                "stopping Debezium and drop the duplicates at the seam, or re-snapshot",
            )
            out.left("slot.name", f"{slot} is a {plugin} slot")
        publication = take("publication.name") or "dbz_publication"
        source["publication"] = publication
        out.carried("publication.name", f"sources[0].publication: {publication}")
        if take("publication.autocreate.mode") is not None:
            out.carried(
                "publication.autocreate.mode",
                "walstream uses the publication as it is (it creates one only when it is missing)",
            )
        if take("offset.storage.file.filename") is not None:
            out.carried("offset.storage.file.filename", "read for the handover (--offsets)")
        heartbeat = take("heartbeat.interval.ms")
        if heartbeat is not None and int(heartbeat) > 0:
            source["heartbeat_interval"] = f"{int(heartbeat) / 1000:g}s"
            out.carried("heartbeat.interval.ms", "sources[0].heartbeat_interval")
        elif heartbeat is not None:
            out.carried(
                "heartbeat.interval.ms",
                "0: walstream's own heartbeat (5s) keeps the slot moving on a quiet database",
            )
        if take("heartbeat.action.query") is not None:
            out.left(
                "heartbeat.action.query",
                "walstream writes its heartbeat as a WAL message "
                "(docs/production-postgres.md); run the query yourself if you need it",
            )
        return source

    def sink(self, source: str, prefix: str, server: Mapping[str, str]) -> dict[str, Any]:
        """The sink of Debezium's records: its tables, the value settings, no snapshot."""
        out = self.out
        sink: dict[str, Any] = {"name": "debezium", "source": source, "format": "debezium"}
        _tables(self.props, self.take, sink, out)
        settings = {"topic.prefix": prefix}
        out.carried("topic.prefix", f"sinks[0].debezium: topics {prefix}.<schema>.<table>")
        for key in PROPERTIES:
            value = None if key == "topic.prefix" else self.take(key)
            if value is not None:
                settings[key] = value
                out.carried(key, "sinks[0].debezium")
        _server_format(server, settings, out)
        sink["debezium"] = settings
        snapshot = self.take("snapshot.mode") or "initial"
        out.carried(
            "snapshot.mode",
            f"{snapshot}: Debezium's snapshot is done; walstream continues "
            "the stream (a new sink that needs the rows: backfill: on_create)",
        )
        return sink

    def the_rest(self) -> None:
        """A line for every setting not read yet: why walstream has no place for it."""
        for key in sorted(self.props):
            if key in self.done:
                continue
            if key.startswith("database."):
                self.out.left(key, "a connection setting: add it to sources[0].dsn if libpq has it")
            elif key in _TUNING:
                self.out.left(key, _TUNING[key])
            elif key in ("transforms", "predicates"):
                self.out.left(key, _transforms(self.props, key))
            elif key.startswith(("transforms.", "predicates.")):
                continue  # said with `transforms`
            elif key.startswith(("key.converter", "value.converter")):
                self.out.left(key, "only JsonConverter (schemas on or off) is written")
            else:
                self.out.left(key, "not a setting walstream has")


def _transforms(props: Mapping[str, str], key: str) -> str:
    """Why a connector's single message transforms are not carried, and what does it here."""
    names = [n.strip() for n in props[key].split(",") if n.strip()]
    kinds = [props.get(f"{key}.{n}.type", "?") for n in names]
    note = ", ".join(f"{n} ({k.rsplit('.', 1)[-1]})" for n, k in zip(names, kinds, strict=True))
    hint = "a sink's filter and transform (Spark SQL or Python) do that work"
    if any(k.endswith("ExtractNewRecordState") for k in kinds):
        hint = "format: record sends the row alone, as ExtractNewRecordState does; " + hint
    return f"{note}: Kafka Connect's transforms do not run in walstream; {hint}"


def _dsn(props: Mapping[str, str], take: Any, out: Imported) -> str:
    host = take("database.hostname") or "localhost"
    port = take("database.port") or "5432"
    user = take("database.user") or "postgres"
    db = take("database.dbname")
    if db is None:
        raise ConfigError("no database.dbname", "the connector's database is required")
    params = []
    for key in ("sslmode", "sslrootcert", "sslcert", "sslkey"):
        value = take(f"database.{key}")
        if value is not None:
            params.append(f"{key}={value}")
            out.carried(f"database.{key}", "sources[0].dsn")
    for key in ("database.hostname", "database.port", "database.user", "database.dbname"):
        if key in props:
            out.carried(key, "sources[0].dsn")
    if take("database.password") is not None:
        out.left(
            "database.password",
            "not copied (a secret): export PGPASSWORD, or a "
            "~/.pgpass line, for the user in sources[0].dsn",
        )
        out.variables["PGPASSWORD"] = f"the password of {user}"
    query = ("?" + "&".join(params)) if params else ""
    return f"postgresql://{user}@{host}:{port}/{db}{query}"


def _tables(props: Mapping[str, str], take: Any, sink: dict[str, Any], out: Imported) -> None:
    """Debezium's include/exclude lists (Java regular expressions over `schema.table`): plain
    names as the sink's `tables`, anything else as its filter (Spark's RLIKE is Java's)."""
    include, exclude = take("table.include.list"), take("table.exclude.list")
    schemas, skip_schemas = take("schema.include.list"), take("schema.exclude.list")
    conds = []
    if include:
        names = [t.strip() for t in include.split(",") if t.strip()]
        if all(_PLAIN_TABLE.match(t) for t in names):
            sink["tables"] = [t.replace("\\.", ".") for t in names]
            out.carried("table.include.list", "sinks[0].tables")
        else:
            conds.append(_matches(names))
            out.carried("table.include.list", "sinks[0].filter (a regular expression)")
    if exclude:
        conds.append("NOT " + _matches([t.strip() for t in exclude.split(",") if t.strip()]))
        out.carried("table.exclude.list", "sinks[0].filter")
    if schemas:
        conds.append(_matches([f"(?:{s.strip()})\\..*" for s in schemas.split(",") if s.strip()]))
        out.carried("schema.include.list", "sinks[0].filter")
    if skip_schemas:
        conds.append(
            "NOT "
            + _matches([f"(?:{s.strip()})\\..*" for s in skip_schemas.split(",") if s.strip()])
        )
        out.carried("schema.exclude.list", "sinks[0].filter")
    if conds:
        sink["filter"] = " AND ".join(conds)
    for key in ("column.include.list", "column.exclude.list"):
        if take(key):
            out.left(
                key,
                "walstream sends every published column: give the publication a "
                "column list (PostgreSQL 15+: ALTER PUBLICATION ... SET TABLE t (a, b))",
            )
    for key in (
        "message.key.columns",
        "topic.naming.strategy",
        "provide.transaction.metadata",
        "signal.data.collection",
        "signal.enabled.channels",
    ):
        if take(key):
            out.left(
                key,
                {
                    "message.key.columns": "the key is the primary key's columns",
                    "topic.naming.strategy": "topics are <prefix>.<schema>.<table>, or the "
                    "destination's topic (a Spark SQL expression)",
                    "provide.transaction.metadata": "no transaction topic: each message carries "
                    "its transaction's id (source.txId)",
                    "signal.data.collection": "incremental snapshots are `walstream backfill`",
                    "signal.enabled.channels": "incremental snapshots are `walstream backfill`",
                }[key],
            )


def _matches(regexes: list[str]) -> str:
    """Spark SQL: the change's `schema.table` fully matches one of the regexes."""
    pattern = "^(?:" + "|".join(f"(?:{r})" for r in regexes) + ")$"
    return f"concat(`schema`, '.', `table`) RLIKE {quote(pattern)}"


def _offset_file(props: Mapping[str, str], path: Path) -> Path | None:
    """The offset file the config names (Debezium Server's, an embedded engine's), when it
    exists (a relative name: beside the config)."""
    name = props.get("offset.storage.file.filename")
    if name is None:
        return None
    found = (path.parent / name) if not Path(name).is_absolute() else Path(name)
    return found if found.exists() else None


def _server_format(server: Mapping[str, str], settings: dict[str, Any], out: Imported) -> None:
    for part in ("key", "value"):
        fmt = server.get(f"debezium.format.{part}")
        if fmt is not None and fmt != "json":
            out.left(
                f"debezium.format.{part}",
                f"{fmt}: walstream writes JSON (Avro needs a "
                "schema registry: docs/from-debezium.md)",
            )
        enable = server.get(f"debezium.format.{part}.schemas.enable")
        if enable is not None:
            settings[f"{part}.converter.schemas.enable"] = enable
            out.carried(f"debezium.format.{part}.schemas.enable", "sinks[0].debezium")


def _destination(server: Mapping[str, str], bootstrap: str | None, out: Imported) -> dict[str, Any]:
    """The sink's destination: Debezium Server's Kafka sink, else Kafka at `bootstrap`."""
    kind = server.get("debezium.sink.type")
    if kind not in (None, "kafka"):
        out.left(
            "debezium.sink.type",
            f"{kind}: the import writes a Kafka destination; "
            "change sinks[0].destination (docs/sinks.md lists walstream's)",
        )
    producer: dict[str, Any] = {}
    servers = bootstrap
    for key, value in sorted(server.items()):
        if not key.startswith("debezium.sink.kafka.producer."):
            continue
        name = key[len("debezium.sink.kafka.producer.") :]
        if name == "bootstrap.servers":
            servers = servers or value
            out.carried(key, "sinks[0].destination.bootstrap_servers")
        elif name in ("key.serializer", "value.serializer"):
            out.carried(key, "walstream's producer sends bytes")
        elif name in _PRODUCER:
            producer[name] = value
            out.carried(key, "sinks[0].destination.producer")
        else:
            out.left(
                key,
                "not carried: set it in sinks[0].destination.producer by librdkafka's "
                "name (secrets as ${VARIABLES})",
            )
    if servers is None:
        servers = "${KAFKA_BOOTSTRAP_SERVERS}"
        out.variables["KAFKA_BOOTSTRAP_SERVERS"] = "the Kafka brokers Debezium wrote to"
    dest: dict[str, Any] = {"type": "kafka", "bootstrap_servers": servers, "create_topics": True}
    if producer:
        dest["producer"] = producer
    return dest
