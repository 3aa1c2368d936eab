"""`walstream check -c`: can every destination be reached?"""

from __future__ import annotations

from walstream.config import Plan
from walstream.errors import SinkError
from walstream.secrets import scrubbed, secret_values
from walstream.sinks.registry import sink_for


def check_destinations(config: Plan) -> list[tuple[str, SinkError | None]]:
    """`test_connection` of every sink, after importing its Python transform: (sink name,
    the error or None)."""
    from walstream.delivery.deliver import load_function
    from walstream.errors import ConfigError

    out: list[tuple[str, SinkError | None]] = []
    for sink in config.sinks:
        if isinstance(sink.transform, str):  # a Python function: importable here, first
            try:
                load_function(sink.transform)
            except ConfigError as exc:
                out.append((sink.name, SinkError(exc.problem, exc.fix, retryable=False)))
                continue
        try:
            sink_for(sink.destination).test_connection()
            out.append((sink.name, None))
        except SinkError as exc:
            out.append((sink.name, scrubbed(exc, secret_values(sink))))
    return out
