"""The Iceberg sink's settings and catalog: where tables are registered (`type: iceberg`).

A SQL catalog whose two tables live in the state database's walstream schema (the
default), or a REST catalog. See `iceberg.py` for the sink.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from walstream.errors import optional_import
from walstream.fields import Model
from walstream.lake.contract import LakeDestination, check_template, fill_template
from walstream.sinks.clients import Clients


class Catalog(Model):
    """Where Iceberg tables are registered."""

    type: Literal["sql", "rest"] = "sql"
    #: sql: a Postgres DSN (default: the state database); rest: the catalog's URL.
    uri: SecretStr | None = None
    warehouse: str = "./lake"
    token: SecretStr | None = None  # rest: a bearer token
    #: More pyiceberg catalog properties (s3.endpoint, s3.access-key-id, ...).
    properties: dict[str, SecretStr] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _rest_needs_uri(self) -> Catalog:
        if self.type == "rest" and self.uri is None:
            raise ValueError("a rest catalog needs `uri` (the catalog's URL)")
        return self


class IcebergDestination(LakeDestination):
    """Iceberg tables named `table` (`namespace.table`, default `{schema}.{table}`)."""

    type: Literal["iceberg"]
    table: str = "{schema}.{table}"
    catalog: Catalog = Field(default_factory=lambda: Catalog.model_validate({}))

    @field_validator("table")
    @classmethod
    def _table(cls, v: str) -> str:
        check_template(v, "table")
        if "." not in v:
            raise ValueError(f"table {v!r}: give namespace.table, e.g. '{{schema}}.{{table}}'")
        return v

    def location(self, schema: str, table: str) -> str:
        return fill_template(self.table, schema, table)


def load_pyiceberg() -> Any:
    """pyiceberg, with the submodules the sink uses imported."""
    module = optional_import("pyiceberg", "pyiceberg (the Iceberg sink)", "iceberg")
    import pyiceberg.catalog
    import pyiceberg.exceptions
    import pyiceberg.expressions  # noqa: F401

    return module


def sqlalchemy_url(dsn: str, schema: str) -> str:
    """A libpq DSN as the SQLAlchemy URL pyiceberg's SQL catalog takes (psycopg 3), with
    the catalog's tables in `schema`."""
    from psycopg.conninfo import conninfo_to_dict
    from sqlalchemy import URL

    params = {k: str(v) for k, v in conninfo_to_dict(dsn).items()}
    query = {
        k: v for k, v in params.items() if k not in ("user", "password", "host", "port", "dbname")
    }
    query["options"] = (query.get("options", "") + f" -csearch_path={schema}").strip()
    return URL.create(
        "postgresql+psycopg",
        username=params.get("user"),
        password=params.get("password"),
        host=params.get("host"),
        port=int(params["port"]) if "port" in params else None,
        database=params.get("dbname"),
        query=query,
    ).render_as_string(hide_password=False)


CATALOGS: Clients[Any] = Clients()


def ensure_schema(dsn: str, schema: str) -> None:
    """The schema the SQL catalog's tables go in (the state schema) exists."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
