"""Retention: deleting ingested events and each stream's kept messages past theirs, and
warning while a slot nears the WAL retention PostgreSQL allows it.

Each is a Periodic task; it does its work only in a process that leads the events'
source (resp. one of the stream's sources, the slot's source), so a standby deletes
nothing and stays quiet.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

from walstream.config import Plan, SinkConfig
from walstream.periodic import Periodic
from walstream.server.metrics import Metrics
from walstream.state.outbox import Outbox
from walstream.streams.store import StreamStore

log = logging.getLogger("walstream.runtime")

#: How often the slots' WAL retention is looked at (and a warning repeated).
SLOT_WATCH_SECONDS = 60.0


def _watch_slots(config: Plan, leads: Callable[[str], bool]) -> None:
    """Log a warning for each led source whose slot nears invalidation (see
    `SlotState.retention_warning`); /health and /metrics show the same."""
    from walstream.server.monitor import slot_state

    for source in config.sources:
        if leads(source.name):
            warning = slot_state(
                source.dsn.get_secret_value(), source.slot_name
            ).retention_warning()
            if warning is not None:
                log.warning("source %s: %s", source.name, warning)


def retention_tasks(
    config: Plan,
    outbox: Outbox | None,
    streams: StreamStore | None,
    leads: Callable[[str], bool],
    metrics: Metrics,
) -> list[Periodic]:
    """The tasks (not started): the slots every minute, events every 10 minutes, a stream
    every quarter of its retention (1 s to 30 s)."""
    tasks = [
        Periodic(
            "walstream-slot-retention",
            functools.partial(_watch_slots, config, leads),
            SLOT_WATCH_SECONDS,
            first=0.0,
            level=logging.WARNING,
            what="cannot look at the slots' WAL retention",
            logger=log,
        )
    ]
    ev = config.events
    if ev is not None and outbox is not None:

        def expire_events() -> None:
            if leads(ev.source):
                n = outbox.expire(ev.retention)
                if n:
                    log.info("events: deleted %d event(s) older than the retention", n)

        tasks.append(
            Periodic(
                "walstream-events-retention",
                expire_events,
                600.0,
                first=0.0,
                level=logging.WARNING,
                what="events: cannot delete expired events",
                logger=log,
            )
        )
    if streams is not None:
        for name, sinks in config.streams().items():
            retention = sinks[0].destination.retention  # type: ignore[attr-defined]
            tasks.append(
                Periodic(
                    f"walstream-stream-retention-{name}",
                    functools.partial(_expire_stream, streams, name, sinks, leads, metrics),
                    min(30.0, max(1.0, retention / 4)),
                    first=0.0,
                    level=logging.WARNING,
                    what=f"stream {name}: cannot delete expired messages",
                    logger=log,
                )
            )
    return tasks


def _expire_stream(
    streams: StreamStore,
    name: str,
    sinks: list[SinkConfig],
    leads: Callable[[str], bool],
    metrics: Metrics,
) -> None:
    if not any(leads(s.source) for s in sinks):
        return
    dest = sinks[0].destination
    n = streams.expire(name, dest.retention, dest.max_bytes)  # type: ignore[attr-defined]
    kept, size, _ = streams.stats(name)
    metrics.stream_kept.labels(name).set(kept)
    metrics.stream_kept_bytes.labels(name).set(size)
    if n:
        log.info("stream %s: deleted %d message(s) past its retention", name, n)
