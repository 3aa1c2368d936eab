"""How the runtime reads a failed query: our error inside Spark's text decides restart vs stop."""

from __future__ import annotations

from walstream.errors import SinkError
from walstream.runtime import concise, database_name

SPARK_TEXT = """[FOREACH_BATCH_USER_FUNCTION_ERROR] An error occurred in the user provided function.
Traceback (most recent call last):
  File "deliver.py", line 1, in send
walstream.errors.SinkError: sink seq: still failing after 60s: Kafka: _TRANSPORT (down)
  fix: check that the brokers in destination.bootstrap_servers are up and reachable
"""


def test_concise_finds_our_error_and_its_fix_inside_spark_text() -> None:
    kind, message = concise(Exception(SPARK_TEXT))
    assert kind == "SinkError"
    assert message == (
        "sink seq: still failing after 60s: Kafka: _TRANSPORT (down) — fix: check that the "
        "brokers in destination.bootstrap_servers are up and reachable"
    )


def test_concise_config_error_is_recognised_as_fatal_kind() -> None:
    kind, _ = concise(Exception("walstream.errors.ConfigError: transform 'a:b' cannot be loaded"))
    assert kind == "ConfigError"


def test_concise_of_our_own_and_of_foreign_errors() -> None:
    assert concise(SinkError("boom", "do x", retryable=True)) == ("SinkError", "boom — fix: do x")
    assert concise(RuntimeError("\n  first line\nsecond")) == ("RuntimeError", "first line")


def test_database_name() -> None:
    assert database_name("postgresql://u@h:5432/app") == "app"
    assert database_name("host=h dbname=shop") == "shop"
