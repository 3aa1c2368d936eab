"""Who may call the management API (the rules are in app.py's docstring), as FastAPI
dependencies, and the state its routes need once `walstream run` has started."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import Depends, Request

from walstream.server.answers import check_bearer, problem

if TYPE_CHECKING:
    from walstream.server.status import Control


class Access:
    """`read` and `write`: the dependencies of reads that may show row values and of
    management calls; `known_sink`, `lot` and `store` answer 404 / 503 as problems."""

    def __init__(self, control: Control) -> None:
        self.control = control
        self.sinks = [s.name for s in control.config.sinks]
        self.read = Depends(self._reader)
        self.write = Depends(self._writer)

    def _reader(self, request: Request) -> None:
        tokens = self.control.config.server.reader_tokens()
        if not tokens:
            raise problem(
                403,
                "reads that may show row values are disabled: no token is configured",
                "set server.read_token (or server.token) in walstream.yaml, or "
                "WALSTREAM_API_READ_TOKEN, then restart",
            )
        check_bearer(request, tokens, "read token")

    def _writer(self, request: Request) -> None:
        token = self.control.config.server.api_token()
        if token is None:
            raise problem(
                403,
                "write calls are disabled: no API token is configured",
                "set server.token in walstream.yaml or WALSTREAM_API_TOKEN, then restart",
            )
        check_bearer(request, token, "bearer token")

    def known_sink(self, name: str) -> None:
        if name not in self.sinks:
            raise problem(404, f"no sink named {name!r}", f"sinks are: {', '.join(self.sinks)}")

    def lot(self) -> Any:
        """The parking lot (parked messages, dead letters, pauses)."""
        if self.control.parking is None:
            raise problem(503, "walstream is starting", "try again in a moment")
        return self.control.parking

    def store(self) -> Any:
        """The backfill store."""
        if self.control.backfills is None:
            raise problem(503, "walstream is starting", "try again in a moment")
        return self.control.backfills
