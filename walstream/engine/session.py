"""The SparkSession walstream runs on, and the environment every Spark start needs.

`spark_environment` is called before any SparkSession starts in this process — by
`walstream run`, `walstream check`, the tests' session and the test cluster — so
each gets the same four things: executors run this Python (on a local master through
`pyworker.worker_python`, which spares each worker compiling PySpark); a local Spark binds
127.0.0.1 (a host whose name does not resolve would make the JVM exit before the
gateway starts); a local Spark's processes give freed large blocks back to the system
(`LOCAL_MALLOC_ENV`); and a Java of 17 or newer (Spark 4's floor), found under JAVA_HOME,
on the PATH or in /usr/lib/jvm, or a clear error saying which Java was found.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import zipfile
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from walstream.engine.classes import archive_options
from walstream.engine.pyworker import worker_python
from walstream.errors import SetupError
from walstream.nopandas import no_pandas

log = logging.getLogger(__name__)

FS_CHECKPOINTS = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)
LOG_PROFILE = Path(__file__).with_name("log4j2.properties")
JAVA_FLOOR = 17
_VERSION = re.compile(r'version "(?:1\.)?(\d+)')
_LOOPBACK = ("localhost", "127.0.0.1", "::1", "[::1]")
#: A local master's defaults, sized for a small machine (docs/performance-log.md, "Memory"):
#: Spark's own 1 GB heap, G1's bookkeeping and an initial heap of 1/64 of RAM made its JVM
#: 0.8-1 GB resident.
LOCAL_CONF = {"spark.driver.memory": "512m"}  # Spark refuses less than 450 MB
#: ...and its JVM's: the serial collector (no G1 remembered sets; one or two cores), a heap
#: that starts small and grows only as far as it is used, a young generation of at most 64 MB,
#: and an old generation kept near what is live (grown when less than 10% is free after a
#: full collection, shrunk when more than 25% is): large short-lived arrays (a batch's task,
#: Arrow buffers) go straight to the old generation, and with the defaults (40% / 70%) its
#: garbage piled up to the heap's limit between collections. Measured: the JVM 60-100 MB
#: less resident at the same rate and latency (docs/performance-log.md, "Memory under a backlog").
LOCAL_JAVA_OPTIONS = (
    "-XX:+UseSerialGC -Xms64m -XX:MaxNewSize=64m -XX:MinHeapFreeRatio=10 -XX:MaxHeapFreeRatio=25"
)
#: ...and the C allocator settings of every process a local master starts (the JVM, the
#: Python workers, the streaming source): glibc raises its mmap threshold to the size of
#: each large block freed (up to 32 MB), so a batch's big buffers (a task's pickled
#: partition, Arrow buffers, a task's bytes in the JVM) were then carved from the heap and
#: stayed resident after they were freed. A fixed threshold maps each block of 1 MB or more
#: on its own and unmaps it when freed; the heap's free top is given back past 4 MB.
#: Measured (docs/performance-log.md, "glibc's allocator"): `walstream run` into Kafka 65-100 MB
#: less resident at the same rate and latency (128 KB for both cost ~25 ms of p50 latency).
#: The environment's own values win.
LOCAL_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "1048576", "MALLOC_TRIM_THRESHOLD_": "4194304"}
#: Spark's value for "no byte bound" on an Arrow batch (Int.MaxValue; it checks for it).
ARROW_NO_BYTE_BOUND = 2**31 - 1
#: ...and on a machine of at most 2 cores, only the quick JIT compiler (C1): C2's compiler
#: threads took 20-60% of a core for minutes, on the cores the stream needs. Measured on 2
#: cores (docs/performance-log.md, "Start"): the first message of a 200k backlog 4-6 s sooner,
#: the same throughput, lake backfills faster, latency no worse, ~150 MB less resident.
SMALL_MACHINE_JIT = "-XX:TieredStopAtLevel=1"
_GC_CHOICE = re.compile(r"-XX:\+Use\w+GC\b")


def java_version(java: str) -> int | None:
    """The major version a `java` binary reports (1.8.0_x -> 8, 17.0.2 -> 17), or None."""
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    m = _VERSION.search(out.stderr + out.stdout)
    return int(m.group(1)) if m else None


@functools.cache
def find_java() -> Path:
    """JAVA_HOME of a Java >= 17: JAVA_HOME, then `java` on the PATH, then /usr/lib/jvm/*."""
    candidates: list[Path] = []
    if os.environ.get("JAVA_HOME"):
        candidates.append(Path(os.environ["JAVA_HOME"]) / "bin" / "java")
    on_path = shutil.which("java")
    if on_path:
        candidates.append(Path(on_path).resolve())
    candidates += sorted(Path("/usr/lib/jvm").glob("*/bin/java"), reverse=True)
    found: list[str] = []
    for java in candidates:
        version = java_version(str(java))
        if version is not None and version >= JAVA_FLOOR:
            return java.parent.parent
        if version is not None:
            found.append(f"Java {version} at {java}")
    raise SetupError(
        f"Spark 4 needs Java {JAVA_FLOOR} or newer; "
        + (f"found only {', '.join(found)}" if found else "no java was found"),
        "apt-get install openjdk-17-jre-headless (bin/setup does), or set JAVA_HOME to a "
        f"Java {JAVA_FLOOR}+ installation",
    )


def spark_environment(master: str) -> None:
    """Prepare this process to start a SparkSession on `master` (see the module docstring)."""
    host = urlparse(master).hostname if "://" in master else None
    if "PYSPARK_PYTHON" not in os.environ:  # executors run this Python
        os.environ["PYSPARK_PYTHON"] = (
            worker_python() if master.startswith("local") else sys.executable
        )
    if master.startswith("local") or host in _LOOPBACK:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    elif "SPARK_LOCAL_IP" not in os.environ and not _resolvable(socket.gethostname()):
        raise SetupError(
            f"this host's name {socket.gethostname()!r} does not resolve, so Spark cannot tell "
            f"the cluster ({master}) where to reach the driver",
            "export SPARK_LOCAL_IP=<this machine's address the cluster can reach>, or add the "
            "name to /etc/hosts",
        )
    if master.startswith("local"):
        for k, v in LOCAL_MALLOC_ENV.items():
            os.environ.setdefault(k, v)  # read by the JVM and each process it starts
    java_home = find_java()
    if os.environ.get("JAVA_HOME") != str(java_home):
        current = shutil.which("java")
        if current is None or Path(current).resolve().parent.parent != java_home:
            os.environ["JAVA_HOME"] = str(java_home)


def _resolvable(name: str) -> bool:
    try:
        socket.getaddrinfo(name, None)
        return True
    except OSError:
        return False


def spark_conf(config: Any, quiet: bool = True) -> dict[str, str]:
    """The Spark settings `build_spark` starts with: walstream's defaults (a local master's
    sized for a small machine, see LOCAL_CONF), then the config's `spark.conf` over them."""
    conf = {
        "spark.python.worker.reuse": "true",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",  # stage bars would garble the progress table
        "spark.sql.adaptive.enabled": "false",  # not used by streaming queries anyway
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": "4",
        "spark.sql.streaming.stopTimeout": "30s",
        # Backfill reads run in their own pool: a free core goes to the stream's batch
        # first instead of waiting behind a queue of chunk reads (FIFO would starve it).
        "spark.scheduler.mode": "FAIR",
        # Rows go to a delivery task's Python in Arrow batches of at most 10,000
        # (maxRecordsPerBatch). A byte bound as well makes Spark add up every column's
        # size after each row: ~7 µs of JVM per change into Kafka, a fifth of its work
        # (docs/performance-log.md). The source's own Arrow batches (8,192 rows) have no byte
        # bound either, so this holds no more than a batch from the source already does.
        "spark.sql.execution.arrow.maxBytesPerBatch": str(ARROW_NO_BYTE_BOUND),
    }
    java: list[str] = []
    if quiet:
        java.append(f"-Dlog4j2.configurationFile={LOG_PROFILE.as_uri()}")
    if config.spark.master.startswith("local"):
        conf.update(LOCAL_CONF)
        if not _GC_CHOICE.search(config.spark.conf.get("spark.driver.extraJavaOptions", "")):
            java.append(LOCAL_JAVA_OPTIONS)  # the user's options follow: theirs win
        if (os.cpu_count() or 1) <= 2:
            java.append(SMALL_MACHINE_JIT)  # -XX:TieredStopAtLevel=4 after it: C2 again
        archive = archive_options(find_java())  # Spark's classes, when saved (classes.py)
        if archive is not None:
            java.append(archive)
    if java:
        conf["spark.driver.extraJavaOptions"] = " ".join(java)
    if urlparse(str(config.spark.checkpoint_dir)).scheme in ("", "file"):
        # Local disk: rename is atomic, so skip Hadoop's .crc side files (~40 ms per batch).
        conf["spark.sql.streaming.checkpointFileManagerClass"] = FS_CHECKPOINTS
    for k, v in config.spark.conf.items():
        conf[k] = f"{conf[k]} {v}" if k == "spark.driver.extraJavaOptions" and k in conf else v
    return conf


def build_spark(config: Any, quiet: bool = True) -> Any:
    """A SparkSession for walstream on the config's master, with `spark_conf`.

    `quiet` uses walstream's log profile (engine/log4j2.properties): failures are
    reported once by the runtime instead of as stack traces from every layer.
    """
    from pyspark.sql import SparkSession

    spark_environment(config.spark.master)
    conf = spark_conf(config, quiet)
    builder = SparkSession.builder.master(config.spark.master).appName("walstream")
    for k, v in conf.items():
        builder = builder.config(k, v)
    # A new SparkContext takes SIGINT for itself: its handler cancels every job and raises
    # KeyboardInterrupt. walstream run's Ctrl-C lets the batch in flight finish first, so
    # the handler that was there before stays. The JVM is started with SIGTERM ignored, as
    # PySpark starts it with SIGINT ignored: a signal to the whole process group (systemd's
    # stop, `kill -TERM -- -PGID`) then reaches only this process, which stops the query
    # and the JVM itself (HotSpot keeps a termination signal ignored that it found so).
    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGINT) if main else None
    term = signal.signal(signal.SIGTERM, signal.SIG_IGN) if main else None
    try:
        with no_pandas():  # PySpark's py4j converters would load it (see nopandas.py)
            spark = builder.getOrCreate()
    finally:
        if main:  # None: a handler not set from Python, i.e. the default
            signal.signal(signal.SIGTERM, signal.SIG_DFL if term is None else term)
    if before is not None:
        signal.signal(signal.SIGINT, before)
    if not quiet:
        spark.sparkContext.setLogLevel("WARN")
    if not config.spark.master.startswith("local"):
        ship_package(spark)
    return spark


def ship_package(spark: Any) -> Path:
    """Send this walstream to the executors (`addPyFile` of a zip of the package), so they
    run the driver's code whatever they have installed. Its dependencies (psycopg,
    pyarrow, the sinks' clients) must be on the executors' Python already. A compiled
    module cannot be loaded from a zip: it goes as a file of its own, beside the zip
    (`values.rows.beside_the_zip`)."""
    target = package_zip(Path(tempfile.mkdtemp(prefix="walstream-ship-")))
    for compiled in sorted(Path(__file__).resolve().parents[1].rglob("*.so")):
        spark.sparkContext.addFile(str(compiled))
    spark.sparkContext.addPyFile(str(target))
    log.info("shipped walstream to the executors (%s)", target)
    return target


def package_zip(directory: Path) -> Path:
    """`directory`/walstream.zip: the walstream package's sources, for `addPyFile`."""
    root = Path(__file__).resolve().parents[1]  # the walstream package
    target = directory / "walstream.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as z:
        for f in sorted(root.rglob("*")):
            if f.is_file() and "__pycache__" not in f.parts and f.suffix not in (".pyc", ".so"):
                z.write(f, Path("walstream") / f.relative_to(root))
    return target


def start_spark(config: Any, say: Any, quiet: bool = True) -> Any:
    """`build_spark`, saying so through `say`, and its Python workers warmed in the
    background (beside the rest of the start, not in the first batch)."""
    import time

    from walstream.engine.warm import warm_workers

    t0 = time.monotonic()
    say(f"starting Spark ({config.spark.master}): its JVM and Python workers")
    spark = build_spark(config, quiet=quiet)
    say(f"Spark is up ({time.monotonic() - t0:.1f}s)")
    warm_workers(spark)
    return spark
