"""walstream.yaml validation: every error names the key path and what is allowed."""

from __future__ import annotations

import base64
import copy
import re
from pathlib import Path
from typing import Any

import pytest

from walstream.config import load_config, parse_config
from walstream.errors import ConfigError

BASE: dict[str, Any] = {
    "sources": [{"name": "app", "dsn": "postgresql://walstream:s3cret@127.0.0.1:5432/app"}],
    "sinks": [
        {
            "name": "orders-to-kafka",
            "source": "app",
            "tables": ["public.orders"],
            "destination": {
                "type": "kafka",
                "bootstrap_servers": "127.0.0.1:9092",
                "topic": "orders",
            },
        }
    ],
}


def with_change(path: str, value: Any) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    *parents, last = path.split(".")
    node: Any = data
    for p in parents:
        node = node[int(p)] if p.isdigit() else node[p]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return data


_DELETE = object()


def error_of(data: Any) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    return str(info.value)


def test_defaults() -> None:
    cfg = parse_config(BASE)
    src = cfg.sources[0]
    assert (src.slot_name, src.publication_name) == ("walstream_app", "walstream_app")
    assert src.heartbeat_interval == 5.0
    assert src.max_buffer_bytes == 32 << 20
    sink = cfg.sinks[0]
    assert sink.format == "sequin"
    assert sink.actions == ["insert", "update", "delete", "truncate", "read"]
    assert sink.batch_size == 500
    assert cfg.state_dsn == "postgresql://walstream:s3cret@127.0.0.1:5432/app"
    assert cfg.state.schema_ == "walstream"
    assert cfg.spark.master == "local[*]"
    assert sink.wants_table("public", "orders") and not sink.wants_table("public", "items")


def test_durations_and_globs() -> None:
    cfg = parse_config(with_change("sources.0.heartbeat_interval", "500ms"))
    assert cfg.sources[0].heartbeat_interval == 0.5
    cfg = parse_config(with_change("sinks.0.tables", ["public.*"]))
    assert cfg.sinks[0].wants_table("public", "items")
    assert not cfg.sinks[0].wants_table("audit", "items")


def test_a_read_ahead_buffer_below_1_mib_is_refused() -> None:
    msg = error_of(with_change("sources.0.max_buffer_bytes", 1000))
    assert "sources[0].max_buffer_bytes" in msg and "1048576" in msg


def test_unknown_key_names_its_path() -> None:
    msg = error_of(with_change("sinks.0.destination.topik", "x"))
    assert "sinks[0].destination.topik: unknown key" in msg


def test_wrong_type_names_key_and_value() -> None:
    msg = error_of(with_change("sinks.0.batch_size", "lots"))
    assert "sinks[0].batch_size:" in msg and "'lots'" in msg


def test_unknown_sink_type() -> None:
    msg = error_of(with_change("sinks.0.destination", {"type": "carrier-pigeon"}))
    assert "sinks[0].destination:" in msg and "'kafka'" in msg and "carrier-pigeon" in msg


def test_missing_source_reference() -> None:
    msg = error_of(with_change("sinks.0.source", "nope"))
    assert "sinks[0].source: 'nope' is not a source" in msg and "['app']" in msg


def test_missing_required_key() -> None:
    msg = error_of(with_change("sinks.0.destination.bootstrap_servers", _DELETE))
    assert "sinks[0].destination.bootstrap_servers: required key is missing" in msg
    msg = error_of(with_change("sinks.0.destination.topic", _DELETE))  # only debezium's is named
    assert "destination.topic: name the topic" in msg and "only format: debezium" in msg


def test_bad_dsn_is_named_but_never_echoed() -> None:
    msg = error_of(with_change("sources.0.dsn", "postgresql://u:hunter2@bad host/db"))
    assert "sources[0].dsn: not a Postgres connection string" in msg
    assert "hunter2" not in msg


def test_bad_duration_and_action() -> None:
    msg = error_of(with_change("sources.0.heartbeat_interval", "soon"))
    assert "sources[0].heartbeat_interval:" in msg and "not a duration" in msg
    msg = error_of(with_change("sinks.0.actions", ["insert", "upsert"]))
    assert "sinks[0].actions[1]:" in msg and "upsert" in msg


def test_duplicate_names() -> None:
    data = copy.deepcopy(BASE)
    data["sinks"].append(copy.deepcopy(data["sinks"][0]))
    assert "orders-to-kafka" in error_of(data) and "unique" in error_of(data)


def test_transform_forms() -> None:
    assert parse_config(with_change("sinks.0.transform", "myapp.cdc:shape")).sinks[0].transform
    assert "module:function" in error_of(with_change("sinks.0.transform", "not a function"))


def test_env_interpolation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("APP_DSN", "postgresql://u:pw@127.0.0.1/app")
    data = with_change("sources.0.dsn", "${APP_DSN}")
    data["sinks"][0]["destination"]["topic"] = "${TOPIC:-fallback}"
    cfg = parse_config(data)
    assert cfg.sources[0].dsn.get_secret_value() == "postgresql://u:pw@127.0.0.1/app"
    assert cfg.sinks[0].destination.topic == "fallback"  # type: ignore[union-attr]
    assert "pw" not in repr(cfg)  # secrets never printed
    monkeypatch.delenv("APP_DSN")
    msg = error_of(data)
    assert "sources[0].dsn: environment variable APP_DSN is not set" in msg


def test_load_config_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("sources: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config(empty)


def test_local_paths_are_made_absolute_where_walstream_runs_and_uris_kept(tmp_path, monkeypatch):
    """Executors and the JVM may run elsewhere: relative paths mean walstream's directory."""
    monkeypatch.chdir(tmp_path)
    base = {
        "sources": [{"name": "app", "dsn": "postgresql://u@127.0.0.1/app"}],
        "sinks": [{"name": "f", "source": "app", "destination": {"type": "file", "path": "out"}}],
    }
    cfg = parse_config(base)
    assert cfg.spark.checkpoint_dir == str(tmp_path / ".walstream" / "checkpoints")
    assert cfg.sinks[0].destination.path == tmp_path / "out"
    cfg = parse_config({**base, "spark": {"checkpoint_dir": "s3a://bucket/walstream"}})
    assert cfg.spark.checkpoint_dir == "s3a://bucket/walstream"


def test_tombstones_are_for_kafka_only():
    base = {
        "sources": [{"name": "app", "dsn": "postgresql://u@127.0.0.1/app"}],
        "sinks": [
            {"name": "f", "source": "app", "tombstones": True,
             "destination": {"type": "file", "path": "/tmp/x"}}
        ],
    }  # fmt: skip
    with pytest.raises(ConfigError, match=r"sinks\[0\].*tombstones: only a Kafka destination"):
        parse_config(base)
    base["sinks"][0]["destination"] = {"type": "kafka", "bootstrap_servers": "b:9092", "topic": "t"}
    assert parse_config(base).sinks[0].tombstones


def _sink(destination: dict[str, Any], **sink: Any) -> dict[str, Any]:
    return {
        "sources": [{"name": "app", "dsn": "postgresql://u:pw@127.0.0.1/app"}],
        "sinks": [{"name": "s", "source": "app", "destination": destination, **sink}],
    }


def test_routes_are_names_or_expressions_and_secrets_stay_hidden():
    hook = parse_config(_sink({"type": "webhook", "url": "https://h.example/cdc",
                               "headers": {"Authorization": "Bearer t0ken"},
                               "secrets": ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]}))  # fmt: skip
    dest = hook.sinks[0].destination
    assert dest.route_expression() is None
    assert "t0ken" not in repr(dest) and "MfKQ9r8" not in repr(dest)
    routed = parse_config(_sink({"type": "webhook", "url": "concat('https://h/', `table`)"}))
    assert routed.sinks[0].destination.route_expression() == "concat('https://h/', `table`)"
    redis = parse_config(_sink({"type": "redis_stream", "stream": "cdc:{orders}"}))
    assert redis.sinks[0].destination.route_expression() is None
    nats = parse_config(_sink({"type": "nats", "subject": "concat('cdc.', `table`)"}))
    assert nats.sinks[0].destination.route_expression() == "concat('cdc.', `table`)"
    rabbit = parse_config(_sink({"type": "rabbitmq", "routing_key": "orders.#"}))
    assert rabbit.sinks[0].destination.route_expression() is None


def test_sink_settings_that_cannot_work_are_refused_with_the_fix():
    with pytest.raises(ConfigError, match=r"whsec_.*base64"):
        parse_config(_sink({"type": "webhook", "url": "https://h/", "secrets": ["not base64!"]}))
    short = "whsec_" + base64.b64encode(b"x" * 23).decode()  # 23 bytes: one too few
    with pytest.raises(ConfigError, match=r"signing secret of 23 bytes is too short") as err:
        parse_config(_sink({"type": "webhook", "url": "https://h/", "secrets": [short]}))
    assert short not in str(err.value)
    ok = "whsec_" + base64.b64encode(b"x" * 24).decode()
    parse_config(_sink({"type": "webhook", "url": "https://h/", "secrets": [ok]}))
    with pytest.raises(ConfigError, match=r"create_stream: needs `stream` and a plain `subject`"):
        parse_config(_sink({"type": "nats", "subject": "concat('a.', `table`)",
                            "stream": "A", "create_stream": True}))  # fmt: skip
    mirror = {"type": "postgres", "dsn": "postgresql://u@127.0.0.1/copy"}
    with pytest.raises(ConfigError, match=r"transform: a postgres destination mirrors rows"):
        parse_config(_sink(mirror, transform="app.cdc:shape"))
    with pytest.raises(ConfigError, match=r"group_by: a postgres destination .* groups by table"):
        parse_config(_sink(mirror, group_by=["pk"]))


def test_a_mirror_reads_table_definitions_from_its_own_source():
    cfg = parse_config(_sink({"type": "postgres", "dsn": "postgresql://u@127.0.0.1/copy"}))
    dest = cfg.sinks[0].destination
    assert dest.source_dsn.get_secret_value() == "postgresql://u:pw@127.0.0.1/app"
    assert dest.group_by() == ["schema", "table"] and dest.message_format() == "mirror"
    assert "pw" not in str(cfg.sinks[0].model_dump(mode="json"))


def test_backfill_on_create_is_the_one_setting_and_a_typo_names_it():
    ok = parse_config(_sink({"type": "file", "path": "/tmp/x"}, backfill="on_create"))
    assert ok.sinks[0].backfill == "on_create"
    assert parse_config(_sink({"type": "file", "path": "/tmp/x"})).sinks[0].backfill is None
    with pytest.raises(ConfigError, match=r"sinks\[0\]\.backfill: .*'on_create'"):
        parse_config(_sink({"type": "file", "path": "/tmp/x"}, backfill="always"))
    with pytest.raises(ConfigError, match="no sink named 'nope'"):
        ok.sink("nope")


def test_a_sharded_source_runs_as_one_source_and_sink_per_shard():
    data = copy.deepcopy(BASE)
    data["sources"][0]["shards"] = [["public.orders", "public.items"], ["public.events"]]
    data["sinks"].append({"name": "files", "source": "app",
                          "destination": {"type": "file", "path": "/tmp/out"}})  # fmt: skip
    data["sinks"].append({"name": "pull", "source": "app",
                          "destination": {"type": "stream", "stream": "all"}})  # fmt: skip
    cfg = parse_config(data)
    assert [(s.name, s.slot_name, s.publication_name, s.tables) for s in cfg.sources] == [
        ("app-1", "walstream_app_1", "walstream_app_1", ["public.orders", "public.items"]),
        ("app-2", "walstream_app_2", "walstream_app_2", ["public.events"]),
    ]
    assert [(k.name, k.source) for k in cfg.sinks] == [
        ("orders-to-kafka-1", "app-1"), ("orders-to-kafka-2", "app-2"),
        ("files-1", "app-1"), ("files-2", "app-2"), ("pull-1", "app-1"), ("pull-2", "app-2"),
    ]  # fmt: skip
    assert [str(k.destination.path) for k in cfg.sinks if k.name.startswith("files")] == [
        "/tmp/out/shard-1", "/tmp/out/shard-2",
    ]  # fmt: skip
    # One stream fed by both shards, each its own source of it.
    assert [k.destination._source for k in cfg.streams()["all"]] == ["app-1", "app-2"]


@pytest.mark.parametrize(
    ("shards", "problem"),
    [
        ([["public.a"]], "sources[0].shards: List should have at least 2 items"),
        ([["public.a"], []], "sources[0].shards[1]: List should have at least 1 item"),
    ],
)
def test_bad_shards_name_the_key(shards, problem):
    with pytest.raises(ConfigError, match=re.escape(problem)):
        parse_config(with_change("sources.0.shards", shards))


def test_tables_and_shards_are_exclusive():
    data = with_change("sources.0.shards", [["public.a"], ["public.b"]])
    data["sources"][0]["tables"] = ["public.a"]
    with pytest.raises(ConfigError, match="tables and shards: give one"):
        parse_config(data)


def test_sinks_feeding_one_stream_come_from_two_sources_and_agree_on_its_settings():
    """The stream sink's check across sinks (`check_sinks`), run as the config resolves."""
    data = copy.deepcopy(BASE)
    data["sources"].append({**data["sources"][0], "name": "other", "slot": "s2",
                            "publication": "p2"})  # fmt: skip
    pull = {"type": "stream", "stream": "all"}
    data["sinks"] = [{"name": "a", "source": "app", "destination": dict(pull)},
                     {"name": "b", "source": "other", "destination": dict(pull)}]  # fmt: skip
    cfg = parse_config(data)
    assert [s.name for s in cfg.streams()["all"]] == ["a", "b"]
    same_source = copy.deepcopy(data)
    same_source["sinks"][1]["source"] = "app"
    with pytest.raises(ConfigError, match=r"sinks\[1\]\.destination\.stream: sinks\[0\] \(a\) "
                       r"already feeds stream 'all' from source 'app'"):  # fmt: skip
        parse_config(same_source)
    other_retention = copy.deepcopy(data)
    other_retention["sinks"][1]["destination"]["retention"] = "2h"
    with pytest.raises(ConfigError, match=r"sinks\[1\]\.destination\.retention: differs from "
                       r"sinks\[0\] \(a\)"):  # fmt: skip
        parse_config(other_retention)


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_a_file_destination_is_read_back_in_batch_and_partition_order(tmp_path, fmt):
    import pyarrow as pa
    import pyarrow.parquet as pq

    cfg = parse_config(_sink({"type": "file", "path": str(tmp_path), "format": fmt}))
    written = {(3, 0): [b'{"a":1}', b'{"a":2}'], (3, 1): [b'{"a":3}'], (12, 0): [b'{"a":4}']}
    for (batch, part), lines in written.items():
        path = tmp_path / f"batch-{batch:012d}-part-{part:04d}.{fmt}"
        if fmt == "jsonl":
            path.write_bytes(b"".join(line + b"\n" for line in lines))
        else:
            pq.write_table(pa.table({"message": [m.decode() for m in lines]}), path)
    assert cfg.sinks[0].destination.read_back() == [b'{"a":1}', b'{"a":2}', b'{"a":3}', b'{"a":4}']
    kafka = parse_config(BASE).sinks[0].destination
    with pytest.raises(TypeError, match="kafka destination is not read back"):
        kafka.read_back()
