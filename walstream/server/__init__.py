"""The HTTP server `walstream run` starts (uvicorn in a thread): /health, /metrics, /api, /;
and, with `server.grpc_port`, the gRPC PullerService beside it (`puller/`)."""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from walstream.errors import SetupError

if TYPE_CHECKING:
    from walstream.server.metrics import Metrics
    from walstream.server.monitor import Monitor
    from walstream.server.puller.service import GrpcServer
    from walstream.server.status import Control

log = logging.getLogger(__name__)


class Server:
    """Serves the health, metrics, API and console until `stop()`."""

    def __init__(self, control: Control, monitor: Monitor, metrics: Metrics) -> None:
        import uvicorn

        from walstream.server.app import create_app

        cfg = control.config.server
        self.app = create_app(control, monitor, metrics)
        self.config = uvicorn.Config(
            self.app,
            host=cfg.host,
            port=cfg.port,
            log_level="warning",
            access_log=False,
            lifespan="off",
        )
        self.server = uvicorn.Server(self.config)
        self.thread = threading.Thread(target=self.server.run, name="walstream-http", daemon=True)
        self.port = cfg.port
        self.grpc: GrpcServer | None = None
        if cfg.grpc_port is not None:
            from walstream.server.puller.service import GrpcServer

            self.grpc = GrpcServer(control, metrics)

    def start(self, timeout: float = 15.0) -> Server:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive():
                cfg = self.config
                raise SetupError(
                    f"the HTTP server cannot listen on {cfg.host}:{cfg.port} (in use?)",
                    "set server.port to a free port (or server.enabled: false)",
                )
            if time.monotonic() > deadline:
                raise SetupError("the HTTP server did not start", "see the log above")
            time.sleep(0.02)
        sockets = [s for srv in self.server.servers for s in srv.sockets]
        if sockets:
            self.port = int(sockets[0].getsockname()[1])
        log.warning("serving /health, /metrics, /api and the console at %s", self.url)
        if self.grpc is not None:
            self.grpc.start()
        return self

    @property
    def url(self) -> str:
        host = self.config.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}"

    def stop(self, timeout: float = 5.0) -> None:
        if self.grpc is not None:
            self.grpc.stop()
        self.server.should_exit = True
        if self.thread.is_alive():
            self.thread.join(timeout)
