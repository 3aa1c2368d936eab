"""Lake sink settings: what a delta / iceberg destination accepts, and what it refuses."""

from __future__ import annotations

from typing import Any

import pytest

from walstream.config import parse_config
from walstream.errors import ConfigError


def config(destination: dict[str, Any], **sink: Any) -> dict[str, Any]:
    return {
        "sources": [{"name": "app", "dsn": "postgresql://walstream:s3cret@127.0.0.1:5432/app"}],
        "sinks": [{"name": "lake", "source": "app", "destination": destination, **sink}],
    }


def error_of(data: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    return str(info.value)


def test_defaults_and_what_the_plan_fills_in():
    plan = parse_config(config({"type": "delta"}))
    dest = plan.sinks[0].destination
    assert (dest.mode, dest.path, dest.partition_by) == ("mirror", "./lake/{schema}/{table}", [])
    assert dest.source_dsn is not None  # the catalog gives the types
    assert dest.source_dsn.get_secret_value().endswith("127.0.0.1:5432/app")
    assert dest.location("public", "orders").endswith("/lake/public/orders")
    ice = parse_config(config({"type": "iceberg", "mode": "history"})).sinks[0].destination
    assert (ice.catalog.type, ice.location("public", "orders")) == ("sql", "public.orders")
    assert ice.state_schema == "walstream" and ice.state_dsn


@pytest.mark.parametrize(
    ("destination", "sink", "message"),
    [
        ({"type": "delta", "path": "/lake/{db}/{table}"}, {}, "unknown placeholder {db}"),
        ({"type": "iceberg", "table": "{table}"}, {}, "give namespace.table"),
        ({"type": "iceberg", "catalog": {"type": "rest"}}, {}, "rest catalog needs `uri`"),
        ({"type": "delta", "mode": "scd2"}, {}, "mirror"),
        ({"type": "delta"}, {"transform": {"a": "action"}}, "remove the transform"),
        ({"type": "iceberg"}, {"group_by": ["pk"]}, "remove group_by"),
        ({"type": "delta"}, {"format": "debezium"}, "writes typed columns"),
        ({"type": "delta", "partition_by": ["a", "a"]}, {}, "named twice"),
        ({"type": "iceberg", "mode": "changelog", "updates": "merge_on_read"}, {},
         "merge_on_read is for mode: mirror or history"),
        ({"type": "delta", "updates": "merge_on_read", "partition_by": ["a"]}, {},
         "does not take partition_by"),
        ({"type": "delta", "path": "gs://b/{table}", "updates": "merge_on_read"}, {},
         "local disk and S3"),
    ],
)  # fmt: skip
def test_refused_settings_name_the_key_and_the_fix(
    destination: dict[str, Any], sink: dict[str, Any], message: str
):
    assert message in error_of(config(destination, **sink))


def test_storage_secrets_never_show_in_the_config_snapshot():
    from walstream.config import sink_snapshot

    plan = parse_config(
        config({"type": "delta", "path": "s3://bucket/{table}",
                "storage_options": {"AWS_SECRET_ACCESS_KEY": "hunter2"}})
    )  # fmt: skip
    assert "hunter2" not in str(sink_snapshot(plan.sinks[0]))
    assert "hunter2" not in repr(plan.sinks[0])
