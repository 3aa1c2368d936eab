"""The retrier: re-delivers parked messages on their schedule, from walstream run's driver.

Every `interval` seconds, for each sink that parks, it takes the blocked groups
whose head is due (see `ParkingLot.due_groups`) and delivers each group's parked
messages in cursor order through a driver-side instance of the sink. Delivered
messages are deleted; the first failure records an attempt on that message and
schedules the next one (exponential backoff with jitter, at least the sink's
Retry-After hint), or, after `max_attempts` or a non-retryable error, turns it
and everything parked behind it into dead letters. Parked messages are retried
whether or not new changes arrive.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

from walstream.backoff import Backoff
from walstream.config import SinkConfig, sink_snapshot
from walstream.delivery.deliver import load_function
from walstream.delivery.parking import Parked, ParkingLot
from walstream.errors import SinkError
from walstream.periodic import Periodic
from walstream.secrets import scrubbed, secret_values
from walstream.sinks.base import BatchInfo, Message, TaskSink
from walstream.sinks.registry import capabilities, task_sink_for

log = logging.getLogger(__name__)


class Retrier:
    def __init__(
        self,
        sinks: Sequence[SinkConfig],
        parking: ParkingLot,
        on_delivered: Callable[[str, int], Any] | None = None,
        interval: float = 1.0,
        leads: Callable[[str], bool] | None = None,
    ) -> None:
        self.sinks = [s for s in sinks if capabilities(s.destination).ledger]
        #: Whether this process leads a source (high availability): only the leader retries.
        self.leads = leads or (lambda source: True)
        self.parking = parking
        self.on_delivered = on_delivered
        self.interval = interval
        self._sinks: dict[str, TaskSink] = {}
        # A failed pass (the state database is down, say) is tried again on the next tick.
        self.task = Periodic(
            "walstream-retrier",
            self._pass,
            interval,
            what="retrier (parked messages wait)",
            logger=log,
        )
        self._stop = self.task.stopping

    def start(self) -> Retrier:
        if self.sinks:
            self.task.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self.task.stop(timeout)
        for s in self._sinks.values():
            s.close()
        self._sinks.clear()

    @property
    def last_error(self) -> str | None:
        return self.task.last_error

    def _pass(self) -> None:
        self.run_once()

    def run_once(self) -> int:
        """One pass over every sink's due groups; returns how many messages were delivered."""
        delivered = 0
        paused = self.parking.paused()
        for sink in self.sinks:
            if sink.name in paused:  # a paused sink delivers nothing, parked messages included
                continue
            if not self.leads(sink.source):  # a standby leaves them to the leader
                continue
            for group in self.parking.due_groups(sink.name):
                if self._stop.is_set():
                    return delivered
                delivered += self._retry_group(sink, group)
        return delivered

    def _sink(self, config: SinkConfig) -> TaskSink:
        s = self._sinks.get(config.name)
        if s is None:
            s = self._sinks[config.name] = task_sink_for(config.destination)
            s.begin(BatchInfo(config.name, -1, 0, 1))
        return s

    def _message(self, config: SinkConfig, p: Parked) -> Message:
        """The message to send; a transform that raised before is applied again (now fixed,
        perhaps); if it raises again, the message stays a dead letter. A change its format
        could not make a message of (Debezium's records of a table gone from the catalog)
        has none to send: it stays a dead letter."""
        if p.untransformed and p.message.value is None:
            raise SinkError(
                f"change {p.lsn}:{p.seq} of {p.message.table} has no message: its format "
                "could not make one (see the dead letter's error)",
                "delete the dead letter, or backfill the table into the sink",
                retryable=False,
            )
        if not p.untransformed or p.message.value is None or not isinstance(config.transform, str):
            return p.message
        try:
            fn = load_function(config.transform)
            value = json.dumps(fn(json.loads(p.message.value)), ensure_ascii=False, default=str)
        except Exception as exc:
            raise SinkError(
                f"transform {config.transform} raised {type(exc).__name__}: {exc}",
                "fix the transform, then `walstream dead-letters retry`",
                retryable=False,
            ) from exc
        return p.message._replace(value=value.encode())

    def _retry_group(self, config: SinkConfig, group: str) -> int:
        parked = self.parking.group(config.name, group)
        sink = self._sink(config)
        done = 0
        for i in range(0, len(parked), config.batch_size):
            chunk = parked[i : i + config.batch_size]
            msgs: list[Message] = []
            poison: SinkError | None = None
            for p in chunk:  # a transform that raises again stops the chunk at that message
                try:
                    msgs.append(self._message(config, p))
                except SinkError as exc:
                    poison = exc
                    break
            try:
                if msgs:
                    sink.deliver(msgs)
                if poison is not None:  # what came before it is delivered; it fails here
                    raise SinkError(
                        poison.problem,
                        poison.fix,
                        retryable=False,
                        delivered=frozenset(range(len(msgs))),
                    )
            except SinkError as raw:
                failure = scrubbed(raw, secret_values(config))  # before it is logged or kept
                ok = [chunk[k].id for k in sorted(failure.delivered)]
                self.parking.delivered(ok)
                done += len(ok)
                if failure.pause:  # the destination said to stop: not an attempt of the message
                    self.parking.set_paused(config.name, True, failure.problem)
                    log.error(
                        "sink %s is paused: %s; after fixing it, `walstream resume %s`",
                        config.name,
                        failure.problem,
                        config.name,
                    )
                    break
                head = next(p for k, p in enumerate(chunk) if k not in failure.delivered)
                attempts = head.attempts + 1
                dead = not failure.retryable or attempts >= config.max_attempts
                backoff = Backoff(config.backoff.initial, config.backoff.max)
                delay = backoff.delay(attempts, failure.retry_after)
                self.parking.failed(
                    head, failure.problem, dead=dead, delay=delay, sink_config=sink_snapshot(config)
                )
                if dead:
                    log.error(
                        "sink %s: group %r is dead-lettered after %d attempt(s): %s; "
                        "see `walstream dead-letters list --sink %s`",
                        config.name,
                        group,
                        attempts,
                        failure.problem,
                        config.name,
                    )
                else:
                    log.warning(
                        "sink %s: parked message %s of group %r failed again (attempt %d of %d): "
                        "%s; next attempt in %.0fs",
                        config.name,
                        head.id,
                        group,
                        attempts,
                        config.max_attempts,
                        failure.problem,
                        delay,
                    )
                break
            self.parking.delivered([p.id for p in chunk])
            done += len(chunk)
        if done and self.on_delivered is not None:
            self.on_delivered(config.name, done)
        return done
