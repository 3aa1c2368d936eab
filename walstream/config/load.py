"""Reading walstream.yaml: YAML, `${ENV}` interpolation, validation, errors that name the key."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from walstream.config.model import Config
from walstream.config.plan import Plan, resolve
from walstream.errors import ConfigError
from walstream.sinks.registry import sink_types

_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def interpolate(data: Any, path: str = "") -> Any:
    """Replace `${VAR}` / `${VAR:-default}` in every string; a missing variable names its key."""
    if isinstance(data, dict):
        return {k: interpolate(v, f"{path}.{k}" if path else str(k)) for k, v in data.items()}
    if isinstance(data, list):
        return [interpolate(v, f"{path}[{i}]") for i, v in enumerate(data)]
    if isinstance(data, str):

        def env(m: re.Match[str]) -> str:
            value = os.environ.get(m.group(1), m.group(2))
            if value is None:
                raise ConfigError(
                    f"{path}: environment variable {m.group(1)} is not set",
                    f"export {m.group(1)}=... or write ${{{m.group(1)}:-default}}",
                )
            return value

        return _ENV.sub(env, data)
    return data


def _where(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in sink_types() and out.endswith(("destination", "inner")):
            continue  # pydantic names the union member; the user wrote `destination`
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def _explain(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        msg = err["msg"].removeprefix("Value error, ")
        where = _where(tuple(err["loc"]))
        if err["type"] == "extra_forbidden":
            msg = "unknown key (check its spelling and level)"
        elif err["type"] == "missing":
            msg = "required key is missing"
        value = err.get("input")
        shown = (
            ""
            if err["type"] in ("missing", "extra_forbidden") or isinstance(value, dict | list)
            else f" (got {value!r})"
        )
        if "dsn" in where:
            shown = ""  # never echo a connection string: it may hold a password
        lines.append(f"{where}: {msg}{shown}")
    return "\n".join(lines)


def validate_config(data: Any, origin: str = "walstream.yaml") -> Config:
    """The validated Config of a parsed YAML document (`${ENV}` replaced)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: expected a mapping of sections (sources, sinks, ...)", None)
    try:
        return Config.model_validate(interpolate(data))
    except ValidationError as exc:
        raise ConfigError(
            f"{origin} is invalid:\n{_explain(exc)}",
            "correct the keys above; docs/configuration.md lists every key",
        ) from None


def parse_config(data: Any, origin: str = "walstream.yaml") -> Plan:
    """A parsed YAML document -> validated -> resolved into the Plan walstream runs."""
    config = validate_config(data, origin)
    try:
        return resolve(config)
    except ValueError as exc:  # between sections: names, references, streams
        raise ConfigError(
            f"{origin} is invalid:\n(top level): {exc}",
            "correct the keys above; docs/configuration.md lists every key",
        ) from None


def load_config(path: str | Path) -> Plan:
    """Read, validate and resolve a walstream.yaml; every problem is a ConfigError naming the key."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(
            f"config file {p} does not exist",
            "pass -c path/to/walstream.yaml, or run `walstream demo` for a working example",
        )
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p} is not valid YAML: {exc}", "fix the YAML syntax") from None
    return parse_config(data, str(p))
