"""The gRPC PullerService: `Subscribe` streams a `type: stream` sink's messages, `Ack`
stores a consumer group's progress. It reads through the same `StreamReader` as the
HTTP API (`../stream_reader.py`): the same store, markers, tokens and gaps.

Served by a `grpc.server` on `server.grpc_port` (`GrpcServer`), beside the HTTP server.
Open subscriptions are bounded like the HTTP reads (`server.max_stream_connections`,
`server.max_client_connections`, counted for gRPC on their own).
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Iterator
from concurrent import futures
from typing import TYPE_CHECKING, Any

from fastapi import HTTPException

from walstream.errors import SetupError
from walstream.server.connections import Connections
from walstream.server.stream_reader import Delivered, StreamProblem, StreamReader
from walstream.state.streams import version
from walstream.streams import markers

if TYPE_CHECKING:
    from walstream.server.metrics import Metrics
    from walstream.server.status import Control

log = logging.getLogger(__name__)

#: How many messages one read of the store takes while subscribed.
PAGE = 500


def _code(status: int) -> Any:
    import grpc

    return {
        400: grpc.StatusCode.INVALID_ARGUMENT,
        401: grpc.StatusCode.UNAUTHENTICATED,
        403: grpc.StatusCode.PERMISSION_DENIED,
        404: grpc.StatusCode.NOT_FOUND,
        410: grpc.StatusCode.OUT_OF_RANGE,
        429: grpc.StatusCode.RESOURCE_EXHAUSTED,
        503: grpc.StatusCode.UNAVAILABLE,
    }.get(status, grpc.StatusCode.INTERNAL)


def _abort(context: Any, status: int, problem: str, fix: str | None) -> None:
    """End the call with the status for `status` (HTTP), saying the problem and the fix."""
    context.abort(_code(status), f"{problem}; fix: {fix}" if fix else problem)


def peer_address(peer: str) -> str:
    """The client's address in a gRPC peer string, without its port: each channel has a
    port of its own, and `server.max_client_connections` bounds a client, not a channel
    ('ipv4:10.0.0.7:51234' -> '10.0.0.7', 'ipv6:[::1]:51234' or 'ipv6:%5B::1%5D:51234'
    -> '::1'). Other kinds (a Unix socket) as they are."""
    from urllib.parse import unquote

    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6") or ":" not in rest:
        return peer
    host = unquote(rest).rpartition(":")[0]
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def servicer(reader: StreamReader, connections: Connections, stopping: Any) -> Any:
    """A PullerServiceServicer over `reader` (built here: grpc is imported only when served)."""
    from walstream.server.puller import puller_pb2, puller_pb2_grpc

    def event(m: Delivered) -> Any:
        return puller_pb2.Event(
            source=m.source,
            table=m.table,
            action=m.action,
            key=m.key,
            lsn=m.lsn,
            seq=m.seq,
            idempotency_key=m.idempotency_key,
            progress=m.progress,
            message=m.value or "",
            coalesced=m.coalesced or 0,
        )

    def authorize(name: str, context: Any) -> None:
        token = reader.token(name)
        given = dict(context.invocation_metadata()).get("authorization", "")
        scheme, _, value = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            value.strip().encode(), token.encode()
        ):
            raise StreamProblem(
                401,
                "missing or wrong consumer token",
                "send the metadata authorization: Bearer <token>",
            )

    class Puller(puller_pb2_grpc.PullerServiceServicer):
        def Subscribe(self, request: Any, context: Any) -> Iterator[Any]:
            name = request.stream
            try:
                authorize(name, context)
                at = reader.start(name, request.after or None, request.consumer_id or None)
                reader.read(name, at, 1, False)  # a gap is an error before the first event
                release = connections.open(name, peer_address(context.peer()))
            except StreamProblem as exc:
                _abort(context, exc.status, exc.problem, exc.fix)
                return
            except HTTPException as exc:  # too many open reads
                detail = (
                    exc.detail if isinstance(exc.detail, dict) else {"problem": str(exc.detail)}
                )
                _abort(context, exc.status_code, detail["problem"], detail.get("fix"))
                return
            try:
                yield from follow(name, at, request.coalesce_on_catch_up, context)
            except StreamProblem as exc:  # e.g. retention deleted what it had not read yet
                _abort(context, exc.status, exc.problem, exc.fix)
            finally:
                release()

        def Ack(self, request: Any, context: Any) -> Any:
            try:
                authorize(request.stream, context)
                if not request.consumer_id or len(request.consumer_id) > 200:
                    raise StreamProblem(400, "consumer_id: a group name (1-200 characters)")
                stored = reader.ack(request.stream, request.consumer_id, request.progress)
            except StreamProblem as exc:
                _abort(context, exc.status, exc.problem, exc.fix)
                return None
            return puller_pb2.AckReply(progress=markers.encode(request.stream, stored))

    def follow(name: str, at: dict[str, Any], coalescing: bool, context: Any) -> Iterator[Any]:
        position = at
        while context.is_active() and not stopping.is_set():
            seen = version()
            page = reader.read(name, position, PAGE, coalescing)
            for m in page.messages:
                yield event(m)
            if page.progress != markers.encode(name, position):
                position = markers.decode(name, page.progress)
                if not page.messages:  # a coalesced window that collapsed to nothing
                    yield puller_pb2.Event(progress=page.progress, progress_only=True)
            if page.messages:
                continue
            deadline = time.monotonic() + 1.0
            while version() == seen and time.monotonic() < deadline and context.is_active():
                time.sleep(0.05)

    return Puller()


class GrpcServer:
    """Serves the PullerService on `server.host`:`server.grpc_port` until `stop()`."""

    def __init__(self, control: Control, metrics: Metrics) -> None:
        import threading

        try:
            import grpc

            from walstream.server.puller import puller_pb2_grpc
        except ImportError as exc:
            raise SetupError(
                f"server.grpc_port is set but gRPC is not installed ({exc})",
                "pip install 'walstream[grpc]', or remove server.grpc_port",
            ) from exc
        cfg = control.config.server
        self.stopping = threading.Event()
        reader = StreamReader(control, metrics)
        connections = Connections(cfg.max_stream_connections, cfg.max_client_connections)
        # Each open subscription holds a worker: room for every one the limits allow.
        workers = min(cfg.max_stream_connections * max(1, len(reader.streams)), 256) + 4
        self.server = grpc.server(futures.ThreadPoolExecutor(workers, "walstream-grpc"))
        puller_pb2_grpc.add_PullerServiceServicer_to_server(
            servicer(reader, connections, self.stopping), self.server
        )
        host = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
        assert cfg.grpc_port is not None
        try:
            self.port = self.server.add_insecure_port(f"{host}:{cfg.grpc_port}")
        except RuntimeError as exc:
            self.port = 0
            log.debug("gRPC bind failed: %s", exc)
        if not self.port:
            raise SetupError(
                f"the gRPC server cannot listen on {cfg.host}:{cfg.grpc_port} (in use?)",
                "set server.grpc_port to a free port, or remove it",
            )
        self.host = host

    def start(self) -> GrpcServer:
        self.server.start()
        log.warning("serving the gRPC PullerService at %s:%d", self.host, self.port)
        return self

    @property
    def target(self) -> str:
        return f"{self.host}:{self.port}"

    def stop(self, grace: float = 2.0) -> None:
        self.stopping.set()
        self.server.stop(grace).wait(grace + 1)
