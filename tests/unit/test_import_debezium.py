"""`walstream import debezium`: a connector's config (Kafka Connect JSON, .properties,
Debezium Server's application.properties) and offsets as walstream.yaml, with a line
for every setting; secrets never copied. The takeover itself runs against Debezium in
tests/integration/test_debezium_takeover.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from walstream.config import parse_config
from walstream.errors import ConfigError
from walstream.importers.debezium import import_debezium, read_offset, read_properties

CONFIG = {
    "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
    "database.hostname": "db.internal", "database.port": "5433", "database.user": "dbz",
    "database.password": "hunter2", "database.dbname": "inventory",
    "database.sslmode": "verify-full", "topic.prefix": "DbServer1", "plugin.name": "pgoutput",
    "slot.name": "dbz_slot", "publication.name": "dbz_pub",
    "table.include.list": "public\\.orders,inventory\\.(items|stock)",
    "table.exclude.list": "public\\.audit_.*", "decimal.handling.mode": "string",
    "tombstones.on.delete": "false", "skipped.operations": "none",
    "heartbeat.interval.ms": "2500", "transforms": "unwrap",
    "transforms.unwrap.type": "io.debezium.transforms.ExtractNewRecordState",
    "max.batch.size": "4096", "some.unknown": "x",
}  # fmt: skip


def lines(imported) -> dict[str, tuple[bool, str]]:
    return {line.key: (line.carried, line.note) for line in imported.lines}


def test_a_connect_config_becomes_a_source_on_its_slot_and_a_sink_of_its_records(tmp_path):
    path = tmp_path / "connector.json"
    path.write_text(json.dumps({"name": "inv", "config": CONFIG}))
    imported = import_debezium(path, bootstrap_servers="k1:9092,k2:9092")
    (source,), (sink,) = imported.config["sources"], imported.config["sinks"]
    assert source == {
        "name": "dbserver1", "dsn": "postgresql://dbz@db.internal:5433/inventory?sslmode=verify-full",
        "slot": "dbz_slot", "publication": "dbz_pub", "heartbeat_interval": "2.5s",
    }  # fmt: skip
    assert sink["format"] == "debezium" and sink["debezium"] == {
        "topic.prefix": "DbServer1", "decimal.handling.mode": "string",
        "tombstones.on.delete": "false", "skipped.operations": "none",
    }  # fmt: skip
    # Debezium's lists are Java regular expressions: Spark's RLIKE is Java's
    assert sink["filter"] == (
        "concat(`schema`, '.', `table`) RLIKE '^(?:(?:public\\\\.orders)|(?:inventory\\\\.(items|stock)))$' "
        "AND NOT concat(`schema`, '.', `table`) RLIKE '^(?:(?:public\\\\.audit_.*))$'"
    )
    assert sink["destination"]["bootstrap_servers"] == "k1:9092,k2:9092"
    said = lines(imported)
    assert said["database.password"][0] is False and "PGPASSWORD" in said["database.password"][1]
    assert "hunter2" not in json.dumps(imported.config) + repr(imported.lines)
    assert said["transforms"] == (False, said["transforms"][1])
    assert (
        "ExtractNewRecordState" in said["transforms"][1]
        and "format: record" in said["transforms"][1]
    )
    assert said["some.unknown"] == (False, "not a setting walstream has")
    assert said["max.batch.size"][0] is False
    assert said["slot.name"][0] and said["decimal.handling.mode"] == (True, "sinks[0].debezium")
    parse_config(imported.config)  # a valid walstream.yaml


def test_debezium_server_properties_with_its_kafka_sink_and_offset_file(tmp_path):
    offsets = tmp_path / "offsets.dat"
    # FileOffsetBackingStore: a Java-serialized map; its values are the offsets' JSON
    offsets.write_bytes(b"\xac\xed\x00\x05sr\x00\x11java.util.HashMap" + b"\x00" * 8
                        + b'["dbz",{"server":"app"}]' + b"\x00uq\x00"
                        + b'{"transaction_id":null,"lsn_proc":23851400,"messageType":"UPDATE",'
                        b'"lsn_commit":23851240,"lsn":23851400,"txId":771,"ts_usec":1}')  # fmt: skip
    props = tmp_path / "application.properties"
    props.write_text(
        "# Debezium Server\n"
        "debezium.sink.type=kafka\n"
        "debezium.sink.kafka.producer.bootstrap.servers=kafka:9092\n"
        "debezium.sink.kafka.producer.key.serializer=org.apache.kafka.common.serialization.StringSerializer\n"
        "debezium.sink.kafka.producer.compression.type=lz4\n"
        "debezium.sink.kafka.producer.sasl.jaas.config=org.apache...required \\\n"
        '    username="u" password="p";\n'
        "debezium.source.connector.class=io.debezium.connector.postgresql.PostgresConnector\n"
        "debezium.source.offset.storage.file.filename=offsets.dat\n"
        "debezium.source.database.hostname=pg\n"
        "debezium.source.database.dbname=app\n"
        "debezium.source.topic.prefix=app\n"
        "debezium.source.plugin.name=pgoutput\n"
        "debezium.format.value.schemas.enable=false\n"
    )
    imported = import_debezium(props)
    (source,), (sink,) = imported.config["sources"], imported.config["sinks"]
    assert source["handover"] == {"commit_end": "0/16BF0E8", "processed": "0/16BF188"}
    assert source["slot"] == "debezium" and source["publication"] == "dbz_publication"  # defaults
    assert sink["debezium"]["value.converter.schemas.enable"] == "false"
    assert sink["destination"] == {"type": "kafka", "bootstrap_servers": "kafka:9092",
                                   "create_topics": True, "producer": {"compression.type": "lz4"}}  # fmt: skip
    said = lines(imported)
    jaas = said["debezium.sink.kafka.producer.sasl.jaas.config"]
    assert jaas[0] is False and '"p"' not in json.dumps(imported.config)
    parse_config(imported.config)


def test_a_decoderbufs_slot_cannot_be_continued_and_the_report_says_so(tmp_path):
    path = tmp_path / "c.properties"
    path.write_text("database.dbname=app\ntopic.prefix=app\nslot.name=old\n")  # plugin: default
    imported = import_debezium(path)
    assert "slot" not in imported.config["sources"][0]  # walstream makes its own
    carried, note = lines(imported)["plugin.name"]
    assert not carried and "decoderbufs" in note and "cannot continue on slot old" in note
    assert imported.config["sinks"][0]["destination"]["bootstrap_servers"] == (
        "${KAFKA_BOOTSTRAP_SERVERS}"
    )
    assert imported.variables == {"KAFKA_BOOTSTRAP_SERVERS": "the Kafka brokers Debezium wrote to"}


@pytest.mark.parametrize(
    ("config", "problem"),
    [
        ({"connector.class": "io.debezium.connector.mysql.MySqlConnector"}, "connector.class"),
        ({"database.dbname": "app"}, "no topic.prefix"),
        ({"topic.prefix": "app"}, "no database.dbname"),
    ],
)
def test_a_config_walstream_cannot_take_names_the_problem(tmp_path, config, problem):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=problem):
        import_debezium(path)


def test_an_offset_is_read_from_the_offsets_topics_json_too(tmp_path):
    path = tmp_path / "offset.json"
    path.write_text('{"lsn": 100, "txId": 5}')
    assert read_offset(path) == {"lsn": 100, "txId": 5}
    path.write_text("nothing here")
    with pytest.raises(ConfigError, match="no Debezium offset"):
        read_offset(path)


def test_properties_lines_continue_and_comments_are_skipped():
    text = "# a\n! b\na.b = 1\nc: two words\nlong=one \\\n   two\nempty=\n"
    assert read_properties(text) == {"a.b": "1", "c": "two words", "long": "one two", "empty": ""}


def test_the_command_writes_the_file_and_reports_each_setting(tmp_path: Path):
    path = tmp_path / "connector.json"
    path.write_text(json.dumps(CONFIG))
    out = tmp_path / "walstream.yaml"
    run = [sys.executable, "-m", "walstream.cli", "import", "debezium", str(path), "--out",
           str(out), "--bootstrap-servers", "k:9092"]  # fmt: skip
    done = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(out.read_text())["sources"][0]["slot"] == "dbz_slot"
    assert "✗ database.password" in done.stdout and "hunter2" not in done.stdout + out.read_text()
    assert "setting(s) carried" in done.stdout
    again = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "exists" in again.stderr and "--force" in again.stderr


def test_a_handover_is_an_lsn_and_one_slots(tmp_path):
    base = {"name": "app", "dsn": "postgresql://u@h/db"}
    sink = {"name": "s", "source": "app", "destination": {"type": "file", "path": str(tmp_path)}}
    ok = parse_config({"sources": [{**base, "handover": {"commit_end": "0/16B3748"}}],
                       "sinks": [sink]})  # fmt: skip
    assert ok.sources[0].handover.positions() == (0x16B3748, 0x16B3748)
    for handover, problem in (({"commit_end": "0/XYZ"}, "invalid LSN"),
                              ({"processed": "0/1"}, "commit_end")):  # fmt: skip
        with pytest.raises(ConfigError, match=problem):
            parse_config({"sources": [{**base, "handover": handover}], "sinks": [sink]})
    with pytest.raises(ConfigError, match="handover and shards"):
        parse_config({"sources": [{**base, "handover": {"commit_end": "0/1"},
                                   "shards": [["public.a"], ["public.b"]]}], "sinks": [sink]})  # fmt: skip
