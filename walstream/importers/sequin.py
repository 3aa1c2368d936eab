"""A Sequin `sequin.yaml` as walstream.yaml.

Databases become sources (their slot and publication kept), sinks become sinks in
Sequin's own message format (walstream's default, `format: sequin`): tables and schemas
to include or exclude, actions, column filters (as Spark SQL over `record`), a `path`
transform of `record` (`format: record`), group columns, batch size, an initial full
backfill, and the destinations walstream has (Kafka, webhooks, Redis Streams, RabbitMQ,
NATS, Sequin Stream as a pull stream). Elixir functions, enrichment and the destinations
walstream lacks are reported, not carried. A literal secret is never copied: it becomes
a `${VARIABLE}` to export; a `${VARIABLE}` reference is kept as it is.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from walstream.engine.sql import quote
from walstream.errors import ConfigError
from walstream.importers import Imported

_REFERENCE = re.compile(r"^\$\{[A-Za-z_][A-Za-z0-9_]*(?::-[^}]*)?\}$")
_NAME = re.compile(r"[^a-z0-9_-]+")
_OPERATORS = {"=", "!=", ">", ">=", "<", "<="}
#: Sequin's destinations walstream has no sink for.
_MISSING = (
    "sqs",
    "sns",
    "kinesis",
    "gcp_pubsub",
    "azure_event_hub",
    "typesense",
    "meilisearch",
    "elasticsearch",
    "mysql",
    "s2",
    "redis_string",
)


def name_of(text: str, fallback: str) -> str:
    """A walstream name (lowercase letters, digits, '_', '-', from a letter) for `text`."""
    name = _NAME.sub("-", str(text).lower()).strip("-_")[:63]
    return name if name and name[0].isalpha() else fallback


class _Import:
    def __init__(self, data: Mapping[str, Any]) -> None:
        self.data, self.out = data, Imported({})
        self.functions = {f.get("name"): f for f in data.get("functions") or [] if f}
        self.transforms = {t.get("name"): t for t in data.get("transforms") or [] if t}
        self.endpoints = {e.get("name"): e for e in data.get("http_endpoints") or [] if e}
        self.sources: dict[str, str] = {}  # Sequin database name -> source name

    def secret(self, value: Any, variable: str, what: str) -> str:
        """A reference as it is; a literal secret as a variable the user exports."""
        text = str(value)
        if _REFERENCE.match(text):
            return text
        self.out.variables[variable] = what
        return "${" + variable + "}"

    # -- databases ---------------------------------------------------------------------------
    def database(self, i: int, db: Mapping[str, Any]) -> dict[str, Any]:
        at = f"databases[{i}]"
        name = name_of(db.get("name", f"db{i}"), f"db{i}")
        self.sources[str(db.get("name"))] = name
        user, host = db.get("username", "postgres"), db.get("hostname")
        if not host or not db.get("database"):
            raise ConfigError(f"{at}: hostname and database are required", "complete the entry")
        source: dict[str, Any] = {
            "name": name,
            "dsn": f"postgresql://{user}@{host}:{db.get('port', 5432)}/{db['database']}",
        }
        self.out.carried(f"{at}.hostname/port/database/username", f"sources: {name}.dsn")
        if "password" in db:
            password = str(db["password"])
            if _REFERENCE.match(password):
                self.out.left(
                    f"{at}.password",
                    f"{password}: export PGPASSWORD from it (or a "
                    "~/.pgpass line): walstream's DSN holds no password",
                )
            else:
                self.out.left(
                    f"{at}.password",
                    "not copied (a secret): export PGPASSWORD, or a ~/.pgpass line",
                )
        slot = db.get("slot_name") or (db.get("slot") or {}).get("name")
        publication = db.get("publication_name") or (db.get("publication") or {}).get("name")
        if slot:
            source["slot"] = name_of(slot, "sequin_slot").replace("-", "_")
            self.out.carried(
                f"{at}.slot",
                f"sources: {name}.slot (walstream continues on it; "
                "what Sequin sent after its last confirmation comes again: "
                "docs/from-sequin.md)",
            )
        if publication:
            source["publication"] = name_of(publication, "sequin_pub").replace("-", "_")
            self.out.carried(f"{at}.publication", f"sources: {name}.publication")
        tables = [
            f"{t.get('table_schema', 'public')}.{t['table_name']}"
            for t in db.get("tables") or []
            if t.get("table_name")
        ]
        if tables:
            source["tables"] = tables
            self.out.carried(f"{at}.tables", f"sources: {name}.tables")
        if isinstance(db.get("primary"), Mapping):
            p = db["primary"]
            source["primary_dsn"] = (
                f"postgresql://{p.get('username', 'postgres')}@"
                f"{p.get('hostname')}:{p.get('port', 5432)}/{p.get('database')}"
            )
            self.out.carried(f"{at}.primary", f"sources: {name}.primary_dsn")
        for key in ("pool_size", "await_database"):
            if key in db:
                self.out.left(f"{at}.{key}", "walstream opens what it needs and retries on its own")
        return source

    # -- sinks -------------------------------------------------------------------------------
    def sink(self, i: int, s: Mapping[str, Any]) -> dict[str, Any] | None:
        at = f"sinks[{i}]"
        name = name_of(s.get("name", f"sink{i}"), f"sink{i}")
        if s.get("status") == "disabled":
            self.out.left(at, f"{s.get('name')}: disabled in Sequin, left out")
            return None
        database = str(s.get("database"))
        if database not in self.sources:
            raise ConfigError(f"{at}.database: no database named {database!r}", "check sequin.yaml")
        sink: dict[str, Any] = {"name": name, "source": self.sources[database]}
        self.tables(at, s, sink)
        if s.get("actions"):
            sink["actions"] = sorted({*s["actions"], "read"}, key=str)
            self.out.carried(
                f"{at}.actions",
                f"sinks: {name}.actions (with read: Sequin always sends a backfill's rows)",
            )
        conds = [
            self.column_filter(f"{at}.filters[{j}]", f)
            for j, f in enumerate(s.get("filters") or [])
        ]
        conds = [c for c in conds if c]
        if conds:
            sink["filter"] = " AND ".join(f"({c})" for c in [sink.get("filter"), *conds] if c)
        self.functions_of(at, s, sink)
        if s.get("batch_size"):
            sink["batch_size"] = int(s["batch_size"])
            self.out.carried(f"{at}.batch_size", f"sinks: {name}.batch_size")
        groups = [c for t in s.get("tables") or [] for c in t.get("group_column_names") or []]
        if groups:
            sink["group_by"] = [f"record.{c}" for c in groups]
            self.out.carried(f"{at}.tables[].group_column_names", f"sinks: {name}.group_by")
        if s.get("message_grouping") is False:
            self.out.left(
                f"{at}.message_grouping",
                "false: walstream keeps each row's changes in order always (grouped by key)",
            )
        backfill = s.get("initial_backfill")
        if "initial_backfill" in s and backfill is not False:
            if isinstance(backfill, Mapping) and backfill.get("where"):
                self.out.left(
                    f"{at}.initial_backfill",
                    f"partial: run `walstream backfill {name} --where ...` once the sink runs",
                )
            else:
                sink["backfill"] = "on_create"
                self.out.carried(f"{at}.initial_backfill", f"sinks: {name}.backfill: on_create")
        if s.get("annotations"):
            self.out.left(
                f"{at}.annotations",
                "walstream's messages carry transaction "
                "annotations (docs/configuration.md), not a sink's",
            )
        dest = self.destination(f"{at}.destination", name, s.get("destination") or {}, database)
        if dest is None:
            return None
        sink["destination"] = dest
        return sink

    def tables(self, at: str, s: Mapping[str, Any], sink: dict[str, Any]) -> None:
        src = s.get("source") or {}
        include = [*src.get("include_tables", []), *([s["table"]] if s.get("table") else [])]
        include = [t if "." in t else f"public.{t}" for t in include]
        include += [f"{x}.*" for x in src.get("include_schemas", [])]
        if s.get("schema"):
            include.append(f"{s['schema']}.*")
        if include:
            sink["tables"] = include
            self.out.carried(f"{at}.source (include)", f"sinks: {sink['name']}.tables")
        excluded = [
            *src.get("exclude_tables", []),
            *(f"{x}.*" for x in src.get("exclude_schemas", [])),
        ]
        if excluded:
            likes = " OR ".join(
                f"concat(`schema`, '.', `table`) LIKE {quote(t.replace('*', '%'))}"
                for t in excluded
            )
            sink["filter"] = f"NOT ({likes})"
            self.out.carried(f"{at}.source (exclude)", f"sinks: {sink['name']}.filter")

    def column_filter(self, at: str, f: Mapping[str, Any]) -> str | None:
        """Sequin's column filter as Spark SQL over the change's `record` (JSON)."""
        column, op = f.get("column_name"), str(f.get("operator", "")).lower()
        if not column:
            self.out.left(at, "no column_name")
            return None
        path = "$." + ".".join([str(column), *str(f.get("field_path") or "").split(".")]).strip(".")
        value = f"get_json_object(record, {quote(path)})"
        wanted = f.get("comparison_value")
        if op in ("is null", "is not null"):
            sql = f"{value} {op.upper()}"
        elif op in ("in", "not in") and isinstance(wanted, list):
            sql = f"{value} {op.upper()} ({', '.join(quote(str(v)) for v in wanted)})"
        elif op in _OPERATORS and isinstance(wanted, bool):
            sql = f"{value} {op} {quote(str(wanted).lower())}"
        elif op in _OPERATORS and isinstance(wanted, int | float):
            sql = f"CAST({value} AS DOUBLE) {op} {float(wanted)!r}"
        elif op in _OPERATORS and wanted is not None:
            sql = f"{value} {op} {quote(str(wanted))}"
        else:
            self.out.left(at, f"operator {op!r} with {wanted!r}: write it as the sink's filter")
            return None
        self.out.carried(at, "the sink's filter")
        return sql

    def functions_of(self, at: str, s: Mapping[str, Any], sink: dict[str, Any]) -> None:
        for kind in ("transform", "filter", "routing", "enrichment"):
            ref = s.get(kind)
            if not ref or ref == "none":
                continue
            fn = self.functions.get(ref) or self.transforms.get(ref) or {}
            spec = fn.get("transform", fn)
            if kind == "transform" and spec.get("type") == "path" and spec.get("path") == "record":
                sink["format"] = "record"
                self.out.carried(f"{at}.transform", f"{ref} (path record): format: record")
            else:
                self.out.left(
                    f"{at}.{kind}",
                    f"{ref}: Sequin's functions (Elixir) do not run in "
                    "walstream: write it as the sink's filter/transform (Spark SQL) or "
                    "a Python transform (docs/configuration.md)",
                )

    def destination(
        self, at: str, sink: str, d: Mapping[str, Any], database: str
    ) -> dict[str, Any] | None:
        """The sink's destination (None: walstream has no such sink; reported)."""
        kind = str(d.get("type"))
        make = {
            "kafka": self._kafka,
            "webhook": self._webhook,
            "redis_stream": self._redis,
            "redis": self._redis,
            "rabbitmq": self._rabbitmq,
            "nats": self._nats,
        }.get(kind)
        if kind == "sequin_stream":
            self.out.carried(
                at,
                "a pull stream (docs/pull-subscriptions.md): consumers read it over HTTP or "
                "gRPC with WALSTREAM_STREAMS_TOKEN",
            )
            return {"type": "stream", "stream": sink.replace("-", "_")}
        if make is None:
            why = "walstream has no such sink" if kind in _MISSING else "unknown destination type"
            self.out.left(at, f"{kind}: {why}; the sink is left out")
            return None
        out = make(at, sink, d, sink.upper().replace("-", "_"), database)
        if out is not None:
            self.out.carried(at, f"sinks: {sink}.destination ({out['type']})")
        return out

    @staticmethod
    def _per_change(database: str) -> str:
        """Sequin's subject and routing key of a change: sequin.changes.<db>.<schema>.<table>.<action>."""
        prefix = quote("sequin.changes." + database + ".")
        return f"concat({prefix}, `schema`, '.', `table`, '.', action)"

    def _kafka(
        self, at: str, sink: str, d: Mapping[str, Any], var: str, _db: str
    ) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": "kafka",
            "bootstrap_servers": d.get("hosts"),
            "topic": d.get("topic"),
            "create_topics": True,
        }
        producer: dict[str, Any] = {}
        if d.get("username"):
            producer["security.protocol"] = "SASL_SSL" if d.get("tls") else "SASL_PLAINTEXT"
            mechanism = str(d.get("sasl_mechanism", "plain"))
            producer["sasl.mechanism"] = mechanism.upper().replace("_", "-")
            producer["sasl.username"] = d["username"]
            producer["sasl.password"] = self.secret(
                d.get("password", ""), f"{var}_KAFKA_PASSWORD", f"the Kafka password of sink {sink}"
            )
        elif d.get("tls"):
            producer["security.protocol"] = "SSL"
        if producer:
            out["producer"] = producer
        return out

    def _webhook(
        self, at: str, sink: str, d: Mapping[str, Any], var: str, _db: str
    ) -> dict[str, Any] | None:
        endpoint = self.endpoints.get(d.get("http_endpoint")) or {}
        if not endpoint.get("url"):
            self.out.left(
                at,
                f"http_endpoint {d.get('http_endpoint')!r}: no url (a local or webhook.site "
                "endpoint): give the sink a url",
            )
            return None
        url = endpoint["url"].rstrip("/") + (d.get("http_endpoint_path") or "")
        out: dict[str, Any] = {"type": "webhook", "url": url}
        headers = {h["key"]: h["value"] for h in endpoint.get("headers") or []}
        for j, h in enumerate(endpoint.get("encrypted_headers") or []):
            headers[h["key"]] = self.secret(
                h["value"], f"{var}_HEADER_{j}", f"header {h['key']} of sink {sink}"
            )
        if headers:
            out["headers"] = headers
        if d.get("batch"):
            out["batch"] = True
        return out

    def _redis(
        self, at: str, sink: str, d: Mapping[str, Any], var: str, _db: str
    ) -> dict[str, Any]:
        auth = ""
        if d.get("password"):
            secret = self.secret(
                d["password"], f"{var}_REDIS_PASSWORD", f"the Redis password of sink {sink}"
            )
            auth = f"{d.get('username', '')}:{secret}@"
        scheme = "rediss" if d.get("tls") else "redis"
        url = f"{scheme}://{auth}{d.get('host')}:{d.get('port', 6379)}/{d.get('database', 0)}"
        return {"type": "redis_stream", "url": url, "stream": d.get("stream_key")}

    def _rabbitmq(
        self, at: str, sink: str, d: Mapping[str, Any], var: str, database: str
    ) -> dict[str, Any]:
        secret = self.secret(
            d.get("password", "guest"),
            f"{var}_RABBITMQ_PASSWORD",
            f"the RabbitMQ password of sink {sink}",
        )
        vhost = str(d.get("virtual_host", "/")).replace("/", "%2F")
        scheme = "amqps" if d.get("tls") else "amqp"
        where = f"{d.get('host')}:{d.get('port', 5672)}/{vhost}"
        self.out.carried(f"{at}.exchange", "routing keys as Sequin's (sequin.changes....)")
        return {
            "type": "rabbitmq",
            "exchange": d.get("exchange", ""),
            "url": f"{scheme}://{d.get('username', 'guest')}:{secret}@{where}",
            "routing_key": self._per_change(database),
        }

    def _nats(
        self, at: str, sink: str, d: Mapping[str, Any], var: str, database: str
    ) -> dict[str, Any]:
        scheme = "tls" if d.get("tls") else "nats"
        out: dict[str, Any] = {
            "type": "nats",
            "servers": f"{scheme}://{d.get('host')}:{d.get('port', 4222)}",
            "subject": self._per_change(database),
        }
        if d.get("username"):
            out["user"] = d["username"]
            out["password"] = self.secret(
                d.get("password", ""), f"{var}_NATS_PASSWORD", f"the NATS password of sink {sink}"
            )
        for key in ("jwt", "nkey_seed"):
            if d.get(key):
                self.out.left(
                    f"{at}.{key}", "walstream's NATS sink takes a user and password or a token"
                )
        return out


def import_sequin(path: Path) -> Imported:
    """walstream.yaml for the `sequin.yaml` in `path` (see the module docstring)."""
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not YAML ({exc})", "give Sequin's sequin.yaml") from None
    if not isinstance(data, Mapping) or not data.get("databases"):
        raise ConfigError(f"{path}: no databases", "give Sequin's sequin.yaml (databases, sinks)")
    imp = _Import(data)
    sources = [imp.database(i, db) for i, db in enumerate(data["databases"])]
    sinks = [s for i, raw in enumerate(data.get("sinks") or []) if (s := imp.sink(i, raw))]
    for key in ("account", "users", "api_tokens", "change_retentions"):
        if data.get(key):
            imp.out.left(
                key,
                {
                    "account": "walstream has no accounts",
                    "users": "walstream's API has one token (server.token), not users",
                    "api_tokens": "walstream's API has one token (server.token)",
                    "change_retentions": "a history table in a Postgres or lake sink keeps every "
                    "change (docs/sinks.md)",
                }[key],
            )
    imp.out.config = {"sources": sources, "sinks": sinks}
    if any(s["destination"]["type"] == "stream" for s in sinks):
        imp.out.config["server"] = {"port": 8376}
        imp.out.variables.setdefault("WALSTREAM_STREAMS_TOKEN", "the pull streams' consumer token")
    return imp.out
