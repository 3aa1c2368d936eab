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

__version__ = "0.1.0"

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
    "spark_schema",
]
