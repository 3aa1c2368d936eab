"""One exception tree for walstream; every error says what to do about it."""

from __future__ import annotations


class WalstreamError(Exception):
    """Base of every error walstream raises on purpose.

    `fix` is the operator-facing sentence that says how to resolve the problem;
    it is appended to the message so it shows up in logs and CLI output alike.
    """

    def __init__(self, problem: str, fix: str | None = None) -> None:
        self.problem = problem
        self.fix = fix
        super().__init__(f"{problem}\n  fix: {fix}" if fix else problem)


class ConfigError(WalstreamError):
    """walstream.yaml or a command-line option is invalid."""


class SetupError(WalstreamError):
    """The database is not set up for logical replication the way walstream needs."""


class ConnectionFailed(WalstreamError):
    """A server (Postgres, a broker, ...) could not be reached."""


class DecodeError(WalstreamError):
    """A pgoutput message could not be decoded; the stream cannot continue past it."""


class MissingDependency(WalstreamError):
    """An optional dependency is not installed; the message names the install command."""

    def __init__(self, what: str, extra: str) -> None:
        super().__init__(
            f"{what} is not installed",
            f"pip install 'walstream[{extra}]'",
        )


class SinkError(WalstreamError):
    """A sink could not deliver some messages.

    The sink only classifies; the delivery layer decides what happens next.
    `retryable`: the same messages may succeed later (broker down, timeout, 5xx).
    `delivered`: indices (into the list given to `deliver`) known to be durably
    delivered despite the error; the others are not.
    `retry_after`: seconds the destination asked to wait, if it said.
    `pause`: the destination said to stop sending (a webhook's 410 Gone): the delivery
    layer pauses the sink with this error as the reason, and parks nothing.
    """

    def __init__(
        self,
        problem: str,
        fix: str | None = None,
        *,
        retryable: bool,
        delivered: frozenset[int] = frozenset(),
        retry_after: float | None = None,
        pause: bool = False,
    ) -> None:
        super().__init__(problem, fix)
        self.retryable = retryable
        self.delivered = delivered
        self.retry_after = retry_after
        self.pause = pause

    def __reduce__(self) -> tuple[object, ...]:  # keep the fields when pickled across processes
        return (
            _sink_error,
            (self.problem, self.fix, self.retryable, self.delivered, self.retry_after, self.pause),
        )


def _sink_error(
    problem: str,
    fix: str | None,
    retryable: bool,
    delivered: frozenset[int],
    retry: float | None,
    pause: bool = False,
) -> SinkError:
    return SinkError(
        problem, fix, retryable=retryable, delivered=delivered, retry_after=retry, pause=pause
    )
