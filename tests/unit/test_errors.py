"""Error kinds, and reading our error back out of the text Spark wraps it in."""

from __future__ import annotations

import pickle
import traceback

import pytest

from walstream.errors import (
    MARKER,
    ConfigError,
    ConnectionFailed,
    DecodeError,
    Kind,
    SinkError,
    WalstreamError,
    error_summary,
    optional_import,
)


def spark_text(exc: BaseException) -> str:
    """What a query failure says when a task raised `exc`: Java's wrapper around the Python
    traceback, exactly as Python formats it (with the error's notes)."""
    try:
        raise exc
    except BaseException as raised:
        tb = "".join(traceback.format_exception(raised))
    return (
        "[FOREACH_BATCH_USER_FUNCTION_ERROR] An error occurred in the user provided function "
        "in foreach batch sink. Reason: An exception was raised by the Python Proxy. Return "
        f"Message: {tb}\n\tat org.apache.spark.sql.execution.streaming.sources.ForeachBatch"
    )


def test_kinds_are_decided_where_the_error_is_raised() -> None:
    assert ConfigError("x").kind is Kind.CONFIG
    assert ConnectionFailed("x").kind is Kind.TRANSIENT
    assert DecodeError("x").kind is Kind.TERMINAL
    assert SinkError("x", retryable=True).kind is Kind.TRANSIENT
    assert SinkError("x", retryable=False).kind is Kind.TERMINAL


def test_our_error_is_read_back_from_spark_text_by_its_marker() -> None:
    err = SinkError(
        "sink seq: still failing after 60s: Kafka: _TRANSPORT (down)",
        "check that the brokers in destination.bootstrap_servers are up and reachable",
        retryable=True,
    )
    summary = error_summary(RuntimeError(spark_text(err)))
    assert summary.name == "SinkError"
    assert summary.kind is Kind.TRANSIENT
    assert summary.message == (
        "sink seq: still failing after 60s: Kafka: _TRANSPORT (down) — fix: check that the "
        "brokers in destination.bootstrap_servers are up and reachable"
    )


def test_a_config_error_inside_spark_text_is_the_kind_that_stops_the_run() -> None:
    inner = ConfigError("transform 'a:b' cannot be loaded: no module named 'a'\nsecond line")
    summary = error_summary(RuntimeError(spark_text(RuntimeError("wrapper")) + spark_text(inner)))
    assert (summary.name, summary.kind) == ("ConfigError", Kind.CONFIG)  # the last one wins
    assert summary.message == "transform 'a:b' cannot be loaded: no module named 'a'\nsecond line"


def test_a_traceback_line_alone_is_not_read_as_our_error() -> None:
    """The type name printed by Python is not trusted: only the marker is."""
    text = "Traceback ...\nwalstream.errors.ConfigError: looks like ours\n"
    summary = error_summary(RuntimeError(text))
    assert (summary.name, summary.kind) == ("RuntimeError", Kind.TRANSIENT)
    damaged = error_summary(RuntimeError(MARKER + '{"kind": "config", "type"'))
    assert damaged.kind is Kind.TRANSIENT


def test_our_own_and_foreign_errors() -> None:
    assert error_summary(SinkError("boom", "do x", retryable=False)) == (
        "SinkError", "boom — fix: do x", Kind.TERMINAL,
    )  # fmt: skip
    foreign = error_summary(OSError("\n  first line\nsecond"))
    assert foreign == ("OSError", "first line", Kind.TRANSIENT)


def test_the_marker_survives_pickling_once() -> None:
    err = pickle.loads(pickle.dumps(SinkError("boom", None, retryable=False)))
    assert [n for n in err.__notes__ if n.startswith(MARKER)] == [err.__notes__[-1]]
    assert err.kind is Kind.TERMINAL and not err.retryable
    assert str(WalstreamError("p", "f")) == "p\n  fix: f"  # the marker is not in the message


def test_optional_import_names_the_install_command() -> None:
    assert optional_import("json", "json", "x").dumps(1) == "1"
    with pytest.raises(WalstreamError, match=r"pip install 'walstream\[kafka\]'"):
        optional_import("walstream_no_such_module", "the thing", "kafka")


def test_a_foreign_error_in_spark_text_is_named_by_its_exception_line() -> None:
    """Not Spark's first line ("... Return Message: Traceback (most recent call last):"):
    the operator sees the exception's type and message."""
    try:
        import pyarrow as pa

        pa.table({"k": [1], "a": [[1]]}).join(pa.table({"k": [1]}), "k", join_type="left anti")
    except Exception as exc:  # ArrowInvalid: a list column in a join
        summary = error_summary(RuntimeError(spark_text(exc) + "\n SQLSTATE: 39000"))
    assert summary.kind is Kind.TRANSIENT and summary.name == "RuntimeError"
    assert summary.message.startswith("pyarrow.lib.ArrowInvalid: Data type list"), summary
    deep = error_summary(RuntimeError(spark_text(RecursionError("maximum recursion depth"))))
    assert deep.message == "RecursionError: maximum recursion depth"
