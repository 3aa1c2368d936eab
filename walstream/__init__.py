"""walstream: change data capture for PostgreSQL on Spark Structured Streaming."""

from walstream.change import (
    CHANGE_COLUMNS,
    CHANGE_SCHEMA_DDL,
    ChangeRow,
    WalCursor,
    format_lsn,
    idempotency_key,
    parse_lsn,
    spark_schema,
)
from walstream.errors import (
    ConfigError,
    ConnectionFailed,
    DecodeError,
    SetupError,
    WalstreamError,
)
from walstream.version import __version__


def register(spark: object) -> None:
    """Register the "walstream" streaming data source with a SparkSession.

    Then: `spark.readStream.format("walstream").option("dsn", ...).load()`.
    """
    from walstream.source.datasource import register as _register

    _register(spark)


__all__ = [
    "CHANGE_COLUMNS",
    "CHANGE_SCHEMA_DDL",
    "ChangeRow",
    "ConfigError",
    "ConnectionFailed",
    "DecodeError",
    "SetupError",
    "WalCursor",
    "WalstreamError",
    "__version__",
    "format_lsn",
    "idempotency_key",
    "parse_lsn",
    "register",
    "spark_schema",
]
