"""walstream run's stream API and the Python client, on a real server over a real state
database, without Spark: the test writes the stream's messages the way the pipeline does
(`StreamTables.write`, then `make_visible`). A stream without a token refuses reads
(403, and gRPC's PERMISSION_DENIED); a gRPC subscription without a marker starts from
now; an idle SSE subscription sends keep-alives; the client rides out a server that
answers 503 for a while; a consumer killed in the middle of a page gets that page again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.serving import StoreOnly
from walstream.client import subscribe
from walstream.config import parse_config
from walstream.server import Server
from walstream.server.metrics import Metrics
from walstream.server.monitor import Monitor
from walstream.streams.store import StreamStore
from walstream.testing import holds_for

TOKEN = "pull-token-5"


@pytest.fixture
def served(db: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, StoreOnly]]:
    monkeypatch.delenv("WALSTREAM_STREAMS_TOKEN", raising=False)
    cfg = parse_config({
        "server": {"port": 0, "grpc_port": 0},
        "sources": [{"name": "app", "dsn": db.dsn}],
        "sinks": [
            {"name": "feed", "source": "app",
             "destination": {"type": "stream", "stream": "feed", "token": TOKEN}},
            {"name": "closed", "source": "app", "destination": {"type": "stream", "stream": "closed"}},
        ],
    })  # fmt: skip
    store = StreamStore(db.dsn, "walstream")
    store.ensure()
    control = StoreOnly(cfg, store)
    server = Server(control, Monitor(control), Metrics()).start()  # type: ignore[arg-type]
    assert server.grpc is not None
    control.grpc_target = server.grpc.target  # type: ignore[attr-defined]
    try:
        yield server.url, control
    finally:
        server.stop()


def publish(store: StreamStore, first: int, n: int, stream: str = "feed") -> None:
    """Messages first..first+n-1 of source app, as a batch of the pipeline writes them."""
    rows = [(stream, "app", 1000 + i, 0, "public.t", "insert", str(i), f"ik{i}",
             json.dumps({"n": i}), 10) for i in range(first, first + n)]  # fmt: skip
    store.write(rows)
    store.make_visible(stream, "app", (1000 + first + n - 1, 0))


def test_a_stream_without_a_token_refuses_reads_but_describes_itself(served):
    url, _ = served
    for path in ("messages", "subscribe"):
        r = httpx.get(f"{url}/v1/streams/closed/{path}", headers={"Authorization": "Bearer x"})
        assert r.status_code == 403, r.text
        assert (
            r.json()["detail"]["problem"]
            == "stream closed has no consumer token: its read API is off"
        )
        assert "WALSTREAM_STREAMS_TOKEN" in r.json()["detail"]["fix"]
    info = httpx.get(f"{url}/v1/streams/closed")
    assert info.status_code == 200 and info.json()["reads_enabled"] is False


def grpc_subscribe(control: Any, stream: str, **request: Any) -> Any:
    """A gRPC Subscribe call with the consumer token (its events as they come)."""
    import grpc

    from walstream.server.puller import puller_pb2, puller_pb2_grpc

    channel = grpc.insecure_channel(control.grpc_target)
    stub = puller_pb2_grpc.PullerServiceStub(channel)
    return stub.Subscribe(puller_pb2.SubscribeRequest(stream=stream, **request),
                          metadata=[("authorization", f"Bearer {TOKEN}")], timeout=30)  # fmt: skip


def test_grpc_refuses_a_stream_without_a_token_and_starts_from_now_without_a_marker(served):
    """PERMISSION_DENIED with the problem and the fix, as the HTTP API's 403; with neither
    `after` nor `consumer_id`, a subscription starts from now: its first event is one
    kept after it began."""
    import grpc

    _, control = served
    with pytest.raises(grpc.RpcError) as err:
        next(grpc_subscribe(control, "closed"))
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "stream closed has no consumer token" in err.value.details()
    assert "WALSTREAM_STREAMS_TOKEN" in err.value.details()

    publish(control.streams, 0, 3)  # kept before the subscription
    call = grpc_subscribe(control, "feed")
    got: list[Any] = []
    reader = threading.Thread(target=lambda: got.append(next(call)), daemon=True)
    reader.start()
    n, deadline = 3, time.monotonic() + 30
    while reader.is_alive() and time.monotonic() < deadline:  # until the first event comes
        publish(control.streams, n, 1)
        n += 1
        reader.join(0.5)
    call.cancel()
    assert got, "no event within 30 s"
    assert json.loads(got[0].message)["n"] >= 3  # kept after it began, never before


def test_an_idle_sse_subscription_gets_keep_alives_then_the_message(served, monkeypatch):
    monkeypatch.setattr("walstream.server.streams.KEEPALIVE", 0.3)
    url, control = served
    lines: list[str] = []
    with httpx.stream("GET", f"{url}/v1/streams/feed/subscribe", timeout=30,
                      headers={"Authorization": f"Bearer {TOKEN}"}) as resp:  # fmt: skip
        assert resp.status_code == 200
        for line in resp.iter_lines():
            lines.append(line)
            if lines.count(": keep-alive") == 2 and not any(x.startswith("data:") for x in lines):
                publish(control.streams, 0, 1)  # type: ignore[arg-type]
            if line.startswith("data: "):
                break
    assert lines.count(": keep-alive") >= 2
    assert json.loads(lines[-1].removeprefix("data: "))["message"] == {"n": 0}


def test_the_client_waits_out_a_server_answering_503(served):
    url, control = served
    store, control.streams = control.streams, None  # "walstream is starting": 503
    assert httpx.get(f"{url}/v1/streams/feed/messages",
                     headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 503  # fmt: skip
    start = httpx.get(f"{url}/v1/streams/feed")  # open, but it needs the store too
    assert start.status_code == 503
    got: list[Any] = []

    def consume() -> None:
        with subscribe(url, "feed", token=TOKEN, after=marker, wait=1, retry_for=60) as sub:
            for m in sub:
                got.append(m.message["n"])
                if len(got) == 3:
                    return

    control.streams = store
    marker = httpx.get(f"{url}/v1/streams/feed").json()["head"]
    control.streams = None
    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    # The client meets 503s meanwhile: it keeps retrying, and nothing arrives.
    holds_for(lambda: consumer.is_alive() and got == [], 1.5, message=lambda: f"got {got}")
    publish(store, 0, 3)
    control.streams = store
    consumer.join(30)
    assert got == [0, 1, 2]


CONSUMER = """
import sys
from walstream.client import subscribe
with subscribe(sys.argv[1], "feed", token=sys.argv[2], after=sys.argv[3] or None,
               progress_file=sys.argv[4], limit=10, wait=1) as sub:
    for m in sub:
        print(m.message["n"], flush=True)
        sys.stdin.readline()  # the test says when to go on (or kills it here)
"""


def test_a_consumer_killed_mid_page_gets_that_page_again_and_skips_nothing(served, tmp_path):
    url, control = served
    marker = httpx.get(f"{url}/v1/streams/feed").json()["head"]
    publish(control.streams, 0, 30)  # type: ignore[arg-type]
    progress = tmp_path / "feed.progress"

    def start(after: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-c", CONSUMER, url, TOKEN, after, str(progress)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip

    def go_on(consumer: subprocess.Popen[str]) -> None:
        """Let the consumer ask for its next message (it waits in its loop until then, so it
        never runs ahead of what the test has read)."""
        assert consumer.stdin is not None
        consumer.stdin.write("\n")
        consumer.stdin.flush()

    first = start(marker)
    seen = []
    assert first.stdout is not None
    for line in first.stdout:
        seen.append(int(line))
        if len(seen) == 15:  # five messages into its second page of ten
            os.kill(first.pid, signal.SIGKILL)
            break
        go_on(first)
    first.wait(10)
    assert progress.exists()  # saved after the first page
    again = start("")
    assert again.stdout is not None
    resumed = []
    for line in again.stdout:
        resumed.append(int(line))
        if resumed[-1] == 29:
            break
        go_on(again)
    again.kill()
    again.wait(10)
    assert seen == list(range(15))
    assert resumed == list(range(10, 30))  # the page in flight again, then the rest
