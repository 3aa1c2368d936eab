"""The Redis Streams sink against its own real Redis: trimming, and the errors it retries."""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.servers import Service, redis_server
from tests.sinks.test_contract import run_batch, workload
from walstream.errors import SinkError
from walstream.testing import wait_until

redis = pytest.importorskip("redis")


@pytest.fixture(scope="module")
def server() -> Iterator[Service]:
    svc = redis_server(True)
    yield svc
    svc.stop()


@pytest.fixture
def client(server: Service) -> Iterator[Any]:
    c = redis.Redis(port=server.port)
    c.flushall()
    yield c
    c.close()


def dest(server: Service, **more: Any) -> dict[str, Any]:
    return {"type": "redis_stream", "url": f"redis://127.0.0.1:{server.port}/0",
            "stream": "changes", "timeout": 5, **more}  # fmt: skip


def test_maxlen_trims_each_stream_to_about_that_many_keeping_the_newest(server, client):
    client.config_set("stream-node-max-entries", 10)  # trimming is by whole nodes
    sent = workload(3, 100)
    run_batch(dest(server, maxlen=50), sent)
    assert 50 <= client.xlen("changes") < 60  # approximate (MAXLEN ~), never below
    entries = client.xrange("changes")
    assert [f[b"message"] for _, f in entries] == [m.value for m in sent[-len(entries) :]]


def busy_script(server: Service) -> Iterator[None]:
    """A Lua script that keeps Redis busy until SCRIPT KILL."""
    client = redis.Redis(port=server.port)
    client.config_set("busy-reply-threshold", 50)
    killed: list[Exception] = []

    def loop() -> None:
        try:
            client.eval("while true do end", 0)
        except redis.ResponseError as exc:  # SCRIPT KILL ends it with an error
            killed.append(exc)

    looping = threading.Thread(target=loop, daemon=True)
    looping.start()
    probe = redis.Redis(port=server.port)

    def busy() -> bool:
        try:
            probe.ping()
        except redis.exceptions.BusyLoadingError:
            return False
        except redis.ResponseError as exc:
            return str(exc).startswith("BUSY")
        return False

    wait_until(busy, 10, message="the script never made Redis busy")
    yield
    probe.script_kill()
    looping.join(10)
    assert killed, "the busy script was not killed"


def readonly(server: Service) -> Iterator[None]:
    """Redis as a replica of a primary that is not there: it refuses writes."""
    client = redis.Redis(port=server.port)
    client.replicaof("127.0.0.1", "1")
    yield
    client.replicaof("NO", "ONE")


def out_of_memory(server: Service) -> Iterator[None]:
    client = redis.Redis(port=server.port)
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", 1)
    yield
    client.config_set("maxmemory", 0)


@pytest.mark.parametrize("condition", [out_of_memory, readonly, busy_script],
                         ids=["OOM", "READONLY", "BUSY"])  # fmt: skip
def test_a_redis_that_cannot_write_now_is_retried_and_then_takes_everything(
    server, client, condition
):
    sent = workload(2, 3)
    state = condition(server)
    next(state)
    try:
        with pytest.raises(SinkError) as err:
            run_batch(dest(server), sent)
    finally:
        next(state, None)
    e = err.value
    code = condition.__name__
    assert e.retryable and e.delivered == frozenset(), e
    assert {"out_of_memory": "OOM", "readonly": "READONLY", "busy_script": "BUSY"}[
        code
    ] in e.problem
    assert "raise maxmemory" in e.fix
    run_batch(dest(server), sent)  # the retry, once Redis writes again
    assert [f[b"message"] for _, f in client.xrange("changes")] == [m.value for m in sent]


def test_a_redis_still_loading_its_data_is_retried():
    """A restarted Redis answers LOADING until its dump is read back."""
    workdir = Path(tempfile.mkdtemp(prefix="walstream-redis-loading-"))
    try:
        first = redis_server(True, workdir, "--enable-debug-command", "yes")
        # redis-py's default socket timeout (5 s) is shorter than a SAVE of 4M keys on a
        # busy machine (a CI run timed out in it)
        c = redis.Redis(port=first.port, socket_timeout=300)
        c.execute_command("DEBUG", "POPULATE", 4_000_000)  # a dump that takes seconds to load
        c.save()
        c.close()
        first.proc.terminate()
        first.proc.wait(30)
        again = redis_server(True, workdir)  # reads dump.rdb; the port opens before it is done
        try:
            with pytest.raises(SinkError) as err:
                run_batch(dest(again), workload(1, 2))
            assert err.value.retryable and "LOADING Redis is loading" in err.value.problem, (
                err.value
            )
            assert "reading its data back after a restart" in err.value.fix
        finally:
            again.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
