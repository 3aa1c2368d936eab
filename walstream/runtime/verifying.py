"""Scheduled verification: each sink with `verify: {every: ...}` is compared with its source
by `walstream run`, one sink at a time, on one thread (docs/verify.md).

A sink is due when its last verification started `every` ago (one that could not compare:
after at most an hour), or when one was cut short (it is resumed). Only the process that
leads the sink's source verifies it; a verification running elsewhere, or a backfill of
the sink still running, puts it off to the next look. Results go to the state database
(`/health`, `/metrics` and the console read them there) and to the log.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime

from walstream.backfill.store import BackfillStore
from walstream.config import Plan, SinkConfig
from walstream.errors import WalstreamError
from walstream.periodic import Periodic
from walstream.secrets import scrub, secret_values
from walstream.verify.job import Options, Stopped, verify_sink
from walstream.verify.store import FAILED, VerificationStore

log = logging.getLogger("walstream.runtime")

#: How often the schedule is looked at.
LOOK_SECONDS = 15.0
#: A verification that could not compare is tried again after at most this long.
RETRY_SECONDS = 3600.0


class Schedule:
    """The scheduled verifications of a config: `task` (a Periodic, not started)."""

    def __init__(self, config: Plan, leads: Callable[[str], bool]) -> None:
        self.config = config
        self.leads = leads
        self.sinks = [s for s in config.sinks if s.verify is not None]
        self.store = VerificationStore(config.state_dsn, config.state.schema_)
        self.backfills = BackfillStore(config.state_dsn, config.state.schema_)
        self.task = Periodic(
            "walstream-verify",
            self.look,
            LOOK_SECONDS,
            first=5.0,
            level=logging.WARNING,
            what="scheduled verification",
            logger=log,
        )

    def look(self) -> None:
        """Verify each sink that is due, one after the other."""
        for sink in self.sinks:
            if self.task.stopping.is_set():
                return
            if self.leads(sink.source) and self.due(sink):
                self.run(sink)

    def due(self, sink: SinkConfig) -> bool:
        assert sink.verify is not None
        running = self.store.running(sink.name)
        if running is not None:
            if not self.store.dead(running):
                return False  # it runs elsewhere
            if running.trigger == "schedule":
                return True  # cut short: resume it
            # a command's, cut short: left to whoever ran it, until the schedule is due
        last = self.store.last_finished(sink.name)
        if last is not None:
            every = sink.verify.every
            if last.status == FAILED:
                every = min(every, RETRY_SECONDS)
            if (datetime.now(UTC) - last.started_at).total_seconds() < every:
                return False
        if self.backfills.find(sink.name, active_only=True):
            log.info("sink %s: verification put off while a backfill of it runs", sink.name)
            return False
        return True

    def run(self, sink: SinkConfig) -> None:
        v = sink.verify
        assert v is not None
        options = Options(v.tables, None, v.repair, False, v.wait, v.chunk_size)
        log.info("sink %s: verifying (verify: every %gs)", sink.name, v.every)
        try:
            outcome = verify_sink(
                self.config, sink.name, options, "schedule", log.debug, self.task.stopping
            )
        except Stopped:
            log.info("sink %s: verification let go of while stopping; resumed at start", sink.name)
            return
        except WalstreamError as exc:
            log.warning("sink %s: verification could not compare: %s", sink.name, exc.problem)
            return
        except Exception as exc:  # the state database or a side away: tried again later
            text = scrub(f"{type(exc).__name__}: {exc}", secret_values(self.config))
            log.warning("sink %s: verification failed: %s", sink.name, text)
            return
        different = [r for r in outcome.results if not r.equal]
        if not different:
            log.info(
                "sink %s: verification %d: %d table(s) equal to the source",
                sink.name,
                outcome.id,
                len(outcome.results),
            )
            return
        log.warning(
            "sink %s: verification %d found rows that differ from the source: %s; "
            "`walstream verify %s` lists them (--repair re-backfills them)",
            sink.name,
            outcome.id,
            "; ".join(
                f"{r.table}: {len(r.missing)} missing, {len(r.extra)} only in the sink, "
                f"{len(r.different)} different"
                + (f", {r.repaired} re-backfilled" if r.repaired else "")
                + (f", {r.removed} only in the sink deleted" if r.removed else "")
                for r in different
            ),
            sink.name,
        )
