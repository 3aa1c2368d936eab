"""walstream.yaml: load (YAML, `${ENV}`) -> validate (frozen models) -> resolve (a Plan).

`load.py` reads and explains errors, `sections.py` and `sink.py` are the validated
models (each sink's `destination:` settings live in its module under `sinks/`),
`model.py` the whole document, `plan.py` what it resolves to.
"""

from walstream.config.load import interpolate, load_config, parse_config, validate_config
from walstream.config.model import Config
from walstream.config.plan import Plan, resolve
from walstream.config.sections import (
    LOOPBACK_HOSTS,
    EventsConfig,
    ServerConfig,
    SourceConfig,
    SparkConfig,
    StateConfig,
)
from walstream.config.sink import (
    ACTIONS,
    Action,
    BackoffConfig,
    Destination,
    SinkConfig,
    sink_snapshot,
)

__all__ = [
    "ACTIONS",
    "LOOPBACK_HOSTS",
    "Action",
    "BackoffConfig",
    "Config",
    "Destination",
    "EventsConfig",
    "Plan",
    "ServerConfig",
    "SinkConfig",
    "SourceConfig",
    "SparkConfig",
    "StateConfig",
    "interpolate",
    "load_config",
    "parse_config",
    "resolve",
    "sink_snapshot",
    "validate_config",
]
