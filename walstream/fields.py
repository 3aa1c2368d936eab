"""Field types every settings model shares: frozen models, durations, sizes, DSNs, names."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, SecretStr

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)?\s*$")
_SIZE_UNITS = {
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KiB": 1 << 10,
    "MiB": 1 << 20,
    "GiB": 1 << 30,
    "TiB": 1 << 40,
}
_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")


class Model(BaseModel):
    """A settings section: unknown keys are errors, and a validated model never changes."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


def parse_duration(value: Any) -> Any:
    """'500ms', '5s', '2m', '1h', '1d' or a number of seconds -> seconds as float."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        m = _DURATION.match(value)
        if m:
            scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}[m.group(2) or "s"]
            return float(m.group(1)) * scale
    raise ValueError(
        f"{value!r} is not a duration: write e.g. 500ms, 5s, 2m, 6h, 1d or a number of seconds"
    )


def parse_size(value: Any) -> Any:
    """'512MiB', '1GB', '4096' or a number of bytes -> bytes as int."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        m = _SIZE.match(value)
        if m:
            return int(float(m.group(1)) * _SIZE_UNITS[m.group(2) or "B"])
    raise ValueError(f"{value!r} is not a size: write e.g. 512MiB, 1GiB or a number of bytes")


def check_dsn(value: SecretStr) -> SecretStr:
    """A Postgres connection string psycopg can parse (never echoed: it may hold a password)."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        conninfo_to_dict(value.get_secret_value())
    except Exception as exc:
        raise ValueError(
            f"not a Postgres connection string ({exc}); write postgresql://user@host:5432/db"
        ) from None
    return value


def check_name(value: str) -> str:
    if not _NAME.match(value):
        raise ValueError("use lowercase letters, digits, '_' and '-', starting with a letter")
    return value


def absolute(value: Any) -> Any:
    """A local path relative to where walstream runs, not to where the JVM or executors run."""
    text = str(value)
    if "://" in text or text.startswith("file:"):
        return text  # a URI (s3a://, hdfs://, file:/...): used as given
    return str(Path(text).expanduser().absolute())


Duration = Annotated[float, BeforeValidator(parse_duration), Field(ge=0)]
Size = Annotated[int, BeforeValidator(parse_size), Field(ge=0)]
Dsn = Annotated[SecretStr, AfterValidator(check_dsn)]
Name = Annotated[str, AfterValidator(check_name)]
LocalPath = Annotated[Path, BeforeValidator(absolute)]
#: A local directory, or a URI every node can reach (hdfs://, s3a://), as a string.
Location = Annotated[str, BeforeValidator(absolute)]
Identifier = Annotated[str, Field(pattern=r"^[a-z_][a-z0-9_]*$")]


def is_name(value: str, extra: str = "._-") -> bool:
    """A plain name (topic, stream, subject...) rather than a Spark SQL expression."""
    return bool(value) and all(c.isalnum() or c in extra for c in value)


def token_from(value: SecretStr | None, env: str) -> str | None:
    """A bearer token from the settings, else from the environment variable; None: neither."""
    if value is not None and value.get_secret_value():
        return value.get_secret_value()
    return os.environ.get(env) or None
