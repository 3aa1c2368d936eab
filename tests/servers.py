"""Redis, NATS (JetStream), RabbitMQ and an S3 API for the tests, and a recording webhook
receiver.

A server already listening on its standard loopback port (6379, 4222, 5672) is
used as it is; otherwise one is started from the Debian package's binary on a
free port, in a temporary directory, and stopped afterwards.
WALSTREAM_TEST_OWN_SERVERS=1 starts them even when the standard ports answer.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from walstream.errors import SetupError
from walstream.testing import _port_open, free_port, wait_until


@dataclass
class Service:
    name: str
    port: int
    proc: subprocess.Popen[bytes] | None = None
    workdir: Path | None = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)


def _binary(name: str, package: str) -> str:
    path = shutil.which(name) or (
        f"/usr/sbin/{name}" if Path(f"/usr/sbin/{name}").exists() else None
    )
    if path is None:
        raise SetupError(
            f"{name} is not installed and nothing listens on its standard port",
            f"apt-get install {package} (the tests start it themselves)",
        )
    return path


def _start(name: str, argv: list[str], port: int, workdir: Path, env: dict[str, str] | None = None,
           timeout: float = 60.0) -> Service:  # fmt: skip
    log = (workdir / f"{name}.log").open("wb")
    proc = subprocess.Popen(
        argv, stdout=log, stderr=subprocess.STDOUT, cwd=workdir, env={**os.environ, **(env or {})}
    )
    svc = Service(name, port, proc, workdir)

    def up() -> bool:
        if proc.poll() is not None:
            text = (workdir / f"{name}.log").read_text(errors="replace")[-2000:]
            raise SetupError(f"{name} exited with {proc.returncode}: {text}", "see its log above")
        return _port_open(port)

    wait_until(up, timeout, message=f"{name} did not listen on {port}")
    return svc


def _standard(port: int) -> bool:
    return _port_open(port) and os.environ.get("WALSTREAM_TEST_OWN_SERVERS") != "1"


def redis_server(own: bool = False, workdir: Path | None = None, *extra: str) -> Service:
    """A Redis on a free port (a standard one already running, unless `own`: a test that
    changes the server's settings needs its own). `workdir`: its directory (and dump)."""
    if not own and workdir is None and _standard(6379):
        return Service("redis", 6379)
    port = free_port()
    workdir = workdir or Path(tempfile.mkdtemp(prefix="walstream-redis-"))
    argv = [_binary("redis-server", "redis-server"), "--port", str(port), "--bind", "127.0.0.1",
            "--save", "", "--appendonly", "no", "--dir", str(workdir), *extra]  # fmt: skip
    return _start("redis", argv, port, workdir)


@dataclass
class S3:
    """An S3 API (moto's server, a real HTTP server speaking the S3 protocol, conditional
    puts included) on loopback, with one bucket `lake`. `delta` and `iceberg` are the
    settings a destination gives it, in each library's own keys."""

    service: Service
    bucket: str = "lake"

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.service.port}"

    @property
    def delta(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "test-key-id",
                "AWS_SECRET_ACCESS_KEY": "test-secret-key", "AWS_REGION": "us-east-1",
                "AWS_ALLOW_HTTP": "true"}  # fmt: skip

    @property
    def iceberg(self) -> dict[str, str]:
        return {"s3.endpoint": self.endpoint, "s3.access-key-id": "test-key-id",
                "s3.secret-access-key": "test-secret-key", "s3.region": "us-east-1"}  # fmt: skip

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id="test-key-id",
                            aws_secret_access_key="test-secret-key", region_name="us-east-1")  # fmt: skip

    def keys(self, prefix: str = "") -> list[str]:
        return self.keys_in(self.bucket, prefix)

    def keys_in(self, bucket: str, prefix: str = "") -> list[str]:
        pages = (
            self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        )
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def s3_server() -> S3:
    """moto's S3 server (from the `moto[server]` wheel) on a free port, bucket `lake` made."""
    import sys

    port, workdir = free_port(), Path(tempfile.mkdtemp(prefix="walstream-s3-"))
    argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    s3 = S3(_start("s3", argv, port, workdir))
    s3.client().create_bucket(Bucket=s3.bucket)
    return s3


def nats_server() -> Service:
    if _standard(4222):
        return Service("nats", 4222)
    port, workdir = free_port(), Path(tempfile.mkdtemp(prefix="walstream-nats-"))
    argv = [_binary("nats-server", "nats-server"), "-a", "127.0.0.1", "-p", str(port), "-js",
            "-sd", str(workdir / "js")]  # fmt: skip
    return _start("nats", argv, port, workdir)


def rabbitmq_server() -> Service:
    if _standard(5672):
        return Service("rabbitmq", 5672)
    port, workdir = free_port(), Path(tempfile.mkdtemp(prefix="walstream-rabbitmq-"))
    (workdir / "enabled_plugins").write_text("[].\n")
    env = {
        "RABBITMQ_NODE_PORT": str(port),
        "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
        "RABBITMQ_NODENAME": f"walstream{port}@localhost",
        "RABBITMQ_DIST_PORT": str(free_port()),
        "RABBITMQ_MNESIA_BASE": str(workdir / "mnesia"),
        "RABBITMQ_LOG_BASE": str(workdir / "log"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(workdir / "enabled_plugins"),
        "RABBITMQ_SERVER_START_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
    }
    # Our own config and env files: the system's may pin the port (5672) and paths.
    (workdir / "rabbitmq.conf").write_text(
        f"listeners.tcp.1 = 127.0.0.1:{port}\nlog.file.level = warning\n"
    )
    (workdir / "rabbitmq-env.conf").write_text("")
    env["RABBITMQ_CONFIG_FILE"] = str(workdir / "rabbitmq.conf")
    env["RABBITMQ_CONF_ENV_FILE"] = str(workdir / "rabbitmq-env.conf")
    env["HOME"] = str(workdir)  # its Erlang cookie
    env["RABBITMQ_FEATURE_FLAGS_FILE"] = str(workdir / "feature_flags")
    # Debian's /usr/sbin wrapper switches to the rabbitmq user, which cannot write our
    # temporary directory: run the server script itself, as the current user.
    direct = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
    binary = str(direct) if direct.exists() else _binary("rabbitmq-server", "rabbitmq-server")
    return _start("rabbitmq", [binary], port, workdir, env, timeout=120)


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes  # as received (gzip still compressed)

    def decoded(self) -> bytes:
        """The body as an HTTP receiver hands it on: its Content-Encoding undone."""
        import gzip

        if self.headers.get("content-encoding") == "gzip":
            return gzip.decompress(self.body)
        return self.body

    def json(self) -> Any:
        return json.loads(self.decoded())


@dataclass
class WebhookReceiver:
    """A real HTTP/1.1 server on loopback that records what it is sent.

    `answer(path)` decides the status for a request (default 200); set it to make
    the receiver fail: e.g. `rx.answer = lambda path: 500`. `requests` holds the
    accepted (2xx) requests in arrival order; `refused` the others.
    """

    port: int = field(default_factory=free_port)
    requests: list[Request] = field(default_factory=list)
    refused: list[tuple[int, Request]] = field(default_factory=list)
    answer: Callable[[str], int] = lambda path: 200
    retry_after: str | None = None
    connections: set[tuple[str, int]] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def start(self) -> WebhookReceiver:
        rx = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive

            def log_message(self, *args: Any) -> None:
                pass

            def _any(self) -> None:
                n = int(self.headers.get("content-length") or 0)
                req = Request(self.command, self.path, {k.lower(): v for k, v in self.headers.items()},
                              self.rfile.read(n))  # fmt: skip
                status = rx.answer(self.path) if self.command != "HEAD" else 200
                with rx.lock:
                    rx.connections.add(self.client_address)
                    if 200 <= status < 300:
                        if self.command != "HEAD":
                            rx.requests.append(req)
                    else:
                        rx.refused.append((status, req))
                body = b"ok" if status < 300 else b'{"error": "told to fail"}'
                self.send_response(status)
                if rx.retry_after and status >= 300:
                    self.send_header("Retry-After", rx.retry_after)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_POST = do_PUT = do_PATCH = do_HEAD = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
