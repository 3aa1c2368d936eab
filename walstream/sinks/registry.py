"""Every sink type: the modules of `walstream.sinks` and of the `walstream.sinks` entry
points (the lake's, and any package's own), each of which `@register`s its sinks.

The `destination:` union of the config, `sink_for`, `walstream check` and the
contract suite's list of sinks are all built from here: a new sink is its module
(settings + a sink kind + `@register`), a harness entry in `tests/sinks/conftest.py`
and its tests. A sink outside walstream names its module in its own package's
`[project.entry-points."walstream.sinks"]`.
"""

from __future__ import annotations

import importlib
import pkgutil
import threading
from importlib.metadata import entry_points
from pathlib import Path
from typing import Annotated, Any, TypeVar, Union, get_args

from pydantic import Field

from walstream.sinks.base import Capabilities, DestinationSettings, Sink, TaskSink

S = TypeVar("S", bound=type[Sink])

#: The entry-point group of sink modules outside `walstream.sinks`.
ENTRY_POINTS = "walstream.sinks"
#: walstream's own sink modules outside this package (the lake wing's), loaded by name:
#: also where no metadata declares them (an executor running the shipped zip). Their
#: entry points in pyproject.toml show a package of its own how to add one.
OWN_ELSEWHERE = ("walstream.lake.delta", "walstream.lake.iceberg")

_TYPES: dict[str, type[Sink]] = {}
_LOCK = threading.RLock()
_loaded = False
_union: Any = None


def type_name(settings: type[DestinationSettings]) -> str:
    """The `type:` a settings model declares (its `Literal[...]`)."""
    names = get_args(settings.model_fields["type"].annotation)
    if len(names) != 1 or not isinstance(names[0], str):
        raise TypeError(f"{settings.__name__}.type must be a Literal of one name")
    return names[0]


def register(cls: S) -> S:
    """Class decorator: `cls` serves destinations of its settings' `type`."""
    name = type_name(cls.settings_model)
    other = _TYPES.get(name)
    if other is not None and other is not cls:
        raise TypeError(f"two sinks for destination type {name!r}: {other} and {cls}")
    _TYPES[name] = cls
    return cls


def sink_types() -> dict[str, type[Sink]]:
    """Every registered sink type by name (importing the sink modules once)."""
    global _loaded, _union
    with _LOCK:
        if not _loaded:
            here = [str(Path(__file__).parent)]  # walstream/sinks: its modules and packages
            for info in sorted(pkgutil.iter_modules(here), key=lambda m: m.name):
                importlib.import_module(f"{__package__}.{info.name}")
            for module in OWN_ELSEWHERE:
                importlib.import_module(module)
            for entry in sorted(entry_points(group=ENTRY_POINTS), key=lambda e: e.name):
                if entry.value.split(":")[0] in OWN_ELSEWHERE:
                    continue  # loaded above, from the code running (executors may run a
                    # shipped zip beside another walstream's metadata, or none)
                try:
                    entry.load()
                except Exception as exc:
                    raise ImportError(
                        f"the sink module {entry.value!r} (entry point {entry.name!r} of "
                        f"group {ENTRY_POINTS!r}) cannot be imported: {exc}; install or fix "
                        "the package that declares it"
                    ) from exc
            settings = [cls.settings_model for cls in _TYPES.values()]
            _union = Annotated[Union[tuple(settings)], Field(discriminator="type")]  # type: ignore[valid-type]  # noqa: UP007
            for model in settings:  # wrappers (faulty) name `AnyDestination` for their inner one
                model.model_rebuild(force=True, _types_namespace={"AnyDestination": _union})
            _loaded = True
        return dict(_TYPES)


def destination_union() -> Any:
    """The type of a `destination:` section: any registered settings, chosen by `type`."""
    sink_types()
    return _union


def sink_for(destination: DestinationSettings) -> Sink:
    """A new Sink for validated destination settings."""
    cls = sink_types().get(destination.type)
    if cls is None:
        raise ValueError(f"no sink for destination type {destination.type!r}")
    return cls(destination)


def task_sink_for(destination: DestinationSettings) -> TaskSink:
    """A new message or batch sink for `destination` (what a Spark task delivers to)."""
    sink = sink_for(destination)
    if not isinstance(sink, TaskSink):
        raise TypeError(f"a {destination.type} sink writes tables, not messages")
    return sink


def capabilities(destination: DestinationSettings) -> Capabilities:
    """What the sink of `destination` (a wrapper's innermost one) can take."""
    inner = destination.unwrapped()
    cls = sink_types().get(inner.type)
    if cls is None:
        raise ValueError(f"no sink for destination type {inner.type!r}")
    return cls.capabilities


def preflight(plan: Any) -> None:
    """Each sink type's checks across the whole config, before anything runs
    (`DestinationSettings.preflight`, given the plan's sinks of that type): a ConfigError
    names the first problem."""
    by_type: dict[type[DestinationSettings], list[Any]] = {}
    for sink in plan.sinks:
        by_type.setdefault(type(sink.destination.unwrapped()), []).append(sink)
    for settings, sinks in by_type.items():
        settings.preflight(plan, sinks)
