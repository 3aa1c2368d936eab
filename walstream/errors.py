"""One exception tree for walstream; every error has a kind and says what to do about it.

The kind is decided where the error is raised, and decides what happens next in one
place each: the runtime stops on `config` and restarts a query on the others (with
`Backoff`); the delivery layer retries a `transient` sink error inline and parks it,
and dead-letters a `terminal` one.

Errors cross Spark's boundary as text (a task's or foreachBatch's traceback inside a
Java exception). Each error carries a note, `walstream-error: {json}`, that Python
prints with the traceback: `error_summary` reads the error back from that marker.
"""

from __future__ import annotations

import enum
import importlib
import json
from typing import Any, NamedTuple

MARKER = "walstream-error: "


class Kind(enum.StrEnum):
    TRANSIENT = "transient"  # may succeed later by itself: retry, restart with backoff
    TERMINAL = "terminal"  # will not succeed as it is: park, dead-letter, restart and report
    CONFIG = "config"  # the settings are wrong: stop until the operator changes them


class WalstreamError(Exception):
    """Base of every error walstream raises on purpose.

    `fix` is the operator-facing sentence that says how to resolve the problem;
    it is appended to the message so it shows up in logs and CLI output alike.
    """

    kind: Kind = Kind.TERMINAL

    def __init__(self, problem: str, fix: str | None = None) -> None:
        self.problem = problem
        self.fix = fix
        super().__init__(f"{problem}\n  fix: {fix}" if fix else problem)
        self._mark()

    def _mark(self) -> None:
        """The note that carries this error through Spark's text (see the module docstring)."""
        note = MARKER + json.dumps(
            {
                "kind": str(self.kind),
                "type": type(self).__name__,
                "problem": self.problem,
                "fix": self.fix,
            },
            ensure_ascii=False,
        )
        notes = [n for n in getattr(self, "__notes__", []) if not n.startswith(MARKER)]
        self.__notes__ = [*notes, note]


class ConfigError(WalstreamError):
    """walstream.yaml or a command-line option is invalid."""

    kind: Kind = Kind.CONFIG


class SetupError(WalstreamError):
    """The database is not set up for logical replication the way walstream needs."""


class ConnectionFailed(WalstreamError):
    """A server (Postgres, a broker, ...) could not be reached."""

    kind: Kind = Kind.TRANSIENT


class StandbyBehind(WalstreamError):
    """A physical standby has not replayed the primary's WAL far enough yet (it may later)."""

    kind: Kind = Kind.TRANSIENT


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
        self.kind = Kind.TRANSIENT if retryable else Kind.TERMINAL
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


def optional_import(module: str, what: str, extra: str) -> Any:
    """`import module`, or a MissingDependency naming `pip install 'walstream[extra]'`."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependency(what, extra) from exc


class ErrorSummary(NamedTuple):
    name: str  # the error's type: "SinkError", "ConfigError", "Py4JNetworkError", ...
    message: str  # one line: the problem, and " — fix: ..." when there is one
    kind: Kind


def error_summary(exc: BaseException) -> ErrorSummary:
    """What failed, in one line, and its kind: our error if one is inside `exc` (the last
    `walstream-error` marker in its text: a Spark failure quotes the traceback of the
    task or function that raised it); else `exc` itself (a foreign error is transient)."""
    text = str(exc)
    at = text.rfind(MARKER)
    if at >= 0:
        line = text[at + len(MARKER) :].split("\n", 1)[0]
        try:
            data = json.loads(line)
            kind = Kind(data["kind"])
            name, problem, fix = str(data["type"]), str(data["problem"]), data.get("fix")
        except (ValueError, KeyError, TypeError):
            pass  # a damaged marker: read the error as a foreign one
        else:
            return ErrorSummary(name, problem + (f" — fix: {fix}" if fix else ""), kind)
    if isinstance(exc, WalstreamError):
        fix_text = f" — fix: {exc.fix}" if exc.fix else ""
        return ErrorSummary(type(exc).__name__, exc.problem + fix_text, exc.kind)
    first = python_exception(text) or next(
        (line for line in text.splitlines() if line.strip()), type(exc).__name__
    )
    return ErrorSummary(type(exc).__name__, first.strip()[:500], Kind.TRANSIENT)


_TRACEBACK = "Traceback (most recent call last):"


def python_exception(text: str) -> str | None:
    """The exception line (`pyarrow.lib.ArrowInvalid: ...`) of the last Python traceback
    quoted in `text` (a Spark failure quotes the one its Python function raised), or None."""
    at = text.rfind(_TRACEBACK)
    if at < 0:
        return None
    for line in text[at + len(_TRACEBACK) :].splitlines():
        if not line.strip() or line[:1] in (" ", "\t"):  # the traceback's frames
            continue
        name = line.split(":", 1)[0]
        return line if name.replace(".", "").replace("_", "").isalnum() else None
    return None
