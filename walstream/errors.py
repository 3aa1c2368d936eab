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
