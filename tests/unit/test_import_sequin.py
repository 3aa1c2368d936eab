"""`walstream import sequin`: a sequin.yaml as walstream.yaml, a line for every setting, no
literal secret copied (a `${VARIABLE}` reference kept)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from walstream.config import parse_config
from walstream.errors import ConfigError
from walstream.importers.sequin import import_sequin


def imported(tmp_path: Path, text: str):
    path = tmp_path / "sequin.yaml"
    path.write_text(text)
    return import_sequin(path)


FULL = """
account: {name: acme}
databases:
  - name: production-db
    hostname: db.internal
    database: app
    username: sequin
    password: "${DB_PASSWORD}"
    slot: {name: sequin_slot}
    publication: {name: sequin_pub}
functions:
  - {name: record-only, type: path, path: record}
  - {name: vip, type: filter, code: "def filter(action, record, changes, metadata) do true end"}
http_endpoints:
  - name: hook
    url: https://api.example.com/
    encrypted_headers: [{key: Authorization, value: "Bearer s3cr3t"}]
sinks:
  - name: orders-kafka
    database: production-db
    source: {include_tables: [public.orders], exclude_schemas: [private]}
    actions: [insert, update]
    filters:
      - {column_name: status, operator: "=", comparison_value: paid}
      - {column_name: total, operator: ">", comparison_value: 100}
      - {column_name: metadata, field_path: type.name, operator: "in", comparison_value: [a, b]}
      - {column_name: deleted_at, operator: "is null"}
    tables: [{name: public.orders, group_column_names: [account_id]}]
    batch_size: 50
    initial_backfill: {}
    destination: {type: kafka, hosts: "k1:9092", topic: orders, username: u, password: p4ss,
                  sasl_mechanism: scram_sha_256, tls: true}
  - name: hook-sink
    database: production-db
    table: users
    transform: record-only
    filter: vip
    destination: {type: webhook, http_endpoint: hook, http_endpoint_path: /users}
  - name: queue
    database: production-db
    destination: {type: sqs, queue_url: "https://sqs/x"}
  - name: rabbit
    database: production-db
    destination: {type: rabbitmq, host: mq, exchange: cdc, password: "${MQ_PASSWORD}"}
  - name: pull
    database: production-db
    destination: {type: sequin_stream}
"""


def test_databases_become_sources_on_their_slots_and_sinks_keep_what_walstream_has(tmp_path):
    out = imported(tmp_path, FULL)
    (source,) = out.config["sources"]
    assert source == {"name": "production-db", "dsn": "postgresql://sequin@db.internal:5432/app",
                      "slot": "sequin_slot", "publication": "sequin_pub"}  # fmt: skip
    kafka, hook, rabbit, pull = out.config["sinks"]  # the SQS sink is left out
    assert kafka["tables"] == ["public.orders"] and kafka["actions"] == ["insert", "read", "update"]
    assert kafka["filter"] == (
        "(NOT (concat(`schema`, '.', `table`) LIKE 'private.%')) AND "
        "(get_json_object(record, '$.status') = 'paid') AND "
        "(CAST(get_json_object(record, '$.total') AS DOUBLE) > 100.0) AND "
        "(get_json_object(record, '$.metadata.type.name') IN ('a', 'b')) AND "
        "(get_json_object(record, '$.deleted_at') IS NULL)"
    )
    assert kafka["group_by"] == ["record.account_id"] and kafka["backfill"] == "on_create"
    assert kafka["destination"]["producer"] == {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": "u", "sasl.password": "${ORDERS_KAFKA_KAFKA_PASSWORD}",
    }  # fmt: skip
    assert hook["format"] == "record" and hook["tables"] == ["public.users"]
    assert hook["destination"] == {"type": "webhook", "url": "https://api.example.com/users",
                                   "headers": {"Authorization": "${HOOK_SINK_HEADER_0}"}}  # fmt: skip
    assert rabbit["destination"]["url"] == "amqp://guest:${MQ_PASSWORD}@mq:5672/%2F"  # kept
    assert rabbit["destination"]["routing_key"].startswith("concat('sequin.changes.production-db.'")
    assert pull["destination"] == {"type": "stream", "stream": "pull"}
    text = json.dumps(out.config) + repr(out.lines)
    assert "s3cr3t" not in text and "p4ss" not in text
    said = {line.key: line for line in out.lines}
    assert not said["sinks[1].filter"].carried and "Elixir" in said["sinks[1].filter"].note
    assert not said["sinks[2].destination"].carried and "sqs" in said["sinks[2].destination"].note
    assert not said["account"].carried
    assert set(out.variables) == {"ORDERS_KAFKA_KAFKA_PASSWORD", "HOOK_SINK_HEADER_0",
                                  "WALSTREAM_STREAMS_TOKEN"}  # fmt: skip
    stand_in = json.loads(json.dumps(out.config).replace("${", "{"))  # variables set
    parse_config(stand_in)


def test_the_old_layout_of_databases_and_a_disabled_sink(tmp_path):
    out = imported(
        tmp_path,
        """
databases:
  - {name: db, hostname: h, database: d, slot_name: s1, publication_name: p1,
     tables: [{table_name: users}, {table_name: t, table_schema: app}]}
sinks:
  - {name: off, database: db, status: disabled, destination: {type: kafka, hosts: k, topic: t}}
""",
    )
    (source,) = out.config["sources"]
    assert (source["slot"], source["publication"]) == ("s1", "p1")
    assert source["tables"] == ["public.users", "app.t"]
    assert out.config["sinks"] == [] and not out.lines[-1].carried


@pytest.mark.parametrize(
    ("text", "problem"),
    [("{}", "no databases"), ("databases: [{name: x, hostname: h}]", "hostname and database"),
     ("databases: [{name: x, hostname: h, database: d}]\nsinks: [{name: s, database: y}]",
      "no database named 'y'"), (": : :", "not YAML")],
)  # fmt: skip
def test_a_file_walstream_cannot_read_names_the_problem(tmp_path, text, problem):
    with pytest.raises(ConfigError, match=problem):
        imported(tmp_path, text)
