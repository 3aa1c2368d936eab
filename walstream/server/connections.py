"""Open long-polls and SSE subscriptions, bounded per stream and per client address."""

from __future__ import annotations

import threading
from collections.abc import Callable

from fastapi import HTTPException

from walstream.server.answers import problem


class Connections:
    """Open long-polls and SSE subscriptions, counted per stream and per client address.
    The HTTP server's is used from its event loop; the gRPC server's from its worker
    threads, at once: every count changes under the lock."""

    RETRY_AFTER = 5

    def __init__(self, per_stream: int, per_client: int) -> None:
        self.per_stream = per_stream
        self.per_client = per_client
        self.streams: dict[str, int] = {}
        self.clients: dict[str, int] = {}
        self.lock = threading.Lock()

    def open(self, stream: str, client: str) -> Callable[[], None]:
        """Count one more, or raise 429; returns the (idempotent) release."""
        with self.lock:
            self._count(stream, client)
        released = False

        def release() -> None:
            nonlocal released
            with self.lock:
                if released:
                    return
                released = True
                for counts, key in ((self.streams, stream), (self.clients, client)):
                    counts[key] -= 1
                    if not counts[key]:
                        del counts[key]

        return release

    def _count(self, stream: str, client: str) -> None:
        if self.streams.get(stream, 0) >= self.per_stream:
            raise _busy(
                problem(
                    429,
                    f"stream {stream} has {self.per_stream} open reads already",
                    "try again later (server.max_stream_connections sets the limit)",
                )
            )
        if self.clients.get(client, 0) >= self.per_client:
            raise _busy(
                problem(
                    429,
                    f"this client has {self.per_client} open reads already",
                    "close one, or try again later (server.max_client_connections sets the limit)",
                )
            )
        self.streams[stream] = self.streams.get(stream, 0) + 1
        self.clients[client] = self.clients.get(client, 0) + 1


def _busy(exc: HTTPException) -> HTTPException:
    exc.headers = {"Retry-After": str(Connections.RETRY_AFTER)}
    return exc
