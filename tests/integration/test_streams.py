"""Pull subscriptions: two source databases feed one stream; consumers pull it over HTTP
and over gRPC (the PullerService).

A consumer that leaves and resumes with its saved marker gets every message once in
per-source order (also while the sources write); a consumer group is shared by two
consumers; a consumer far behind with coalesce=true ends in the sources' state; SSE
streams the same messages, and so does gRPC's Subscribe (resumed, in a group, coalesced);
a marker past retention gets 410 (gRPC: OUT_OF_RANGE) and counts a gap.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import grpc
import httpx
import pytest
import yaml

from tests.integration.test_server import metrics, sample
from walstream.client import Gap, StreamMessage, subscribe
from walstream.config import load_config
from walstream.runtime import Runtime
from walstream.server.puller import puller_pb2, puller_pb2_grpc
from walstream.testing import supervised, wait_until

pytestmark = [pytest.mark.spark]

TOKEN = "consumer-token-7"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ROWS = 120  # per source


def workload(db: Any, offset: int) -> list[tuple[str, str, str]]:
    """Inserts, updates and deletes in many small transactions; the (table, action, key)
    of every change, in commit order."""
    db.execute("CREATE TABLE IF NOT EXISTS items (id int PRIMARY KEY, v int NOT NULL)")
    done: list[tuple[str, str, str]] = []
    for i in range(1, ROWS + 1):
        db.execute("INSERT INTO items VALUES (%s, %s)", (i, offset + i))
        done.append(("public.items", "insert", str(i)))
        if i % 3 == 0:  # an update of an earlier row
            db.execute("UPDATE items SET v = v + 1000 WHERE id = %s", (i - 1,))
            done.append(("public.items", "update", str(i - 1)))
        if i % 5 == 0:  # a delete of an earlier row (inserted, maybe updated)
            db.execute("DELETE FROM items WHERE id = %s", (i - 3,))
            done.append(("public.items", "delete", str(i - 3)))
    return done


def per_source(got: list[StreamMessage]) -> dict[str, list[tuple[str, str, str]]]:
    out: dict[str, list[tuple[str, str, str]]] = {}
    for m in got:
        out.setdefault(m.source, []).append((m.table, m.action, m.key or ""))
    return out


def take(sub: Any, n: int, into: list[StreamMessage]) -> None:
    """Receive until `into` holds n messages (the subscription long-polls meanwhile)."""
    for m in sub:
        into.append(m)
        if len(into) >= n:
            return


def test_two_sources_one_stream_resume_groups_coalesce_sse_and_gaps(spark, db, other_db, tmp_path):
    stream = {"type": "stream", "stream": "changes", "token": TOKEN, "catch_up_threshold": 50}
    brief = {"type": "stream", "stream": "brief", "token": TOKEN, "retention": "1s"}
    path = tmp_path / "walstream.yaml"
    path.write_text(yaml.safe_dump({
        "server": {"port": 0, "grpc_port": 0},
        "spark": {"checkpoint_dir": str(tmp_path / "ckpt")},
        "sources": [{"name": "east", "dsn": db.dsn}, {"name": "west", "dsn": other_db.dsn}],
        "sinks": [
            {"name": "east-changes", "source": "east", "destination": stream},
            {"name": "west-changes", "source": "west", "destination": stream,
             "format": "record"},
            {"name": "east-brief", "source": "east", "destination": brief, "format": "record"},
        ],
    }))  # fmt: skip
    db.slots.append("walstream_east")
    other_db.slots.append("walstream_west")
    runtime = Runtime(load_config(path), spark=spark).start()
    assert runtime.server is not None
    url = runtime.server.url
    with supervised(runtime):
        info = httpx.get(f"{url}/v1/streams/changes").json()
        assert info["sources"] == ["east", "west"] and info["messages"] == 0
        start = info["head"]  # before any change: every message comes after it
        # A consumer group made now starts here too.
        group = httpx.get(f"{url}/v1/streams/changes/groups/workers", headers=AUTH)
        assert group.status_code == 200, group.text

        # Refusals: no token, a wrong one, unknown stream, bad markers, bad wait.
        base = f"{url}/v1/streams/changes/messages"
        assert httpx.get(base).status_code == 401
        assert httpx.get(base, headers={"Authorization": "Bearer no"}).status_code == 401
        assert httpx.get(f"{url}/v1/streams/nope/messages", headers=AUTH).status_code == 404
        r = httpx.get(base, params={"after": "garbage"}, headers=AUTH)
        assert r.status_code == 400 and "not a progress marker" in r.json()["detail"]["problem"]
        brief_head = httpx.get(f"{url}/v1/streams/brief").json()["head"]
        r = httpx.get(base, params={"after": brief_head}, headers=AUTH)
        assert r.status_code == 400 and "of stream 'brief'" in r.json()["detail"]["problem"]
        assert httpx.get(base, params={"wait": "forever"}, headers=AUTH).status_code == 422

        # Both sources write while consumers read.
        expected: dict[str, list[tuple[str, str, str]]] = {}

        def write(name: str, database: Any, offset: int) -> None:
            expected[name] = workload(database, offset)

        writers = [
            threading.Thread(target=write, args=("east", db, 0)),
            threading.Thread(target=write, args=("west", other_db, 10_000)),
        ]
        for t in writers:
            t.start()
        # The writers' exact counts are known only when they finish; this many at least.
        total = 2 * (ROWS + ROWS // 3 + ROWS // 5)

        # 1. A consumer reads part, leaves, and resumes from its saved marker.
        progress = tmp_path / "consumer.progress"
        got: list[StreamMessage] = []
        with subscribe(url, "changes", token=TOKEN, after=start, progress_file=progress,
                       limit=37, wait=2) as sub:  # fmt: skip
            take(sub, 100, got)
        assert progress.read_text() == got[-1].progress
        with subscribe(url, "changes", token=TOKEN, progress_file=progress, limit=37,
                       wait=2) as sub:  # fmt: skip
            take(sub, total, got)
        for t in writers:
            t.join()
        assert sum(len(v) for v in expected.values()) == total
        assert per_source(got) == expected  # each exactly once, in per-source order
        assert len({m.idempotency_key for m in got}) == total
        west = next(m for m in got if m.source == "west" and m.action == "update")
        assert west.message["v"] > 10_000 and "action" not in west.message  # record
        east = next(m for m in got if m.source == "east" and m.action == "insert")
        assert east.message["action"] == "insert" and "record" in east.message  # sequin

        # 2. Two consumers share a group: the second goes on where the first acked.
        first: list[StreamMessage] = []
        with subscribe(url, "changes", token=TOKEN, group="workers", limit=25, wait=1) as a:
            take(a, 60, first)
        second: list[StreamMessage] = []
        with subscribe(url, "changes", token=TOKEN, group="workers", limit=200, wait=1) as b:
            take(b, total - 60, second)
        assert per_source(first + second) == expected
        checkpoint = httpx.get(f"{url}/v1/streams/changes/groups/workers", headers=AUTH).json()
        assert checkpoint["progress"] == second[-1].progress
        r = httpx.post(f"{url}/v1/streams/changes/groups/workers/ack",
                       json={"progress": "garbage"}, headers=AUTH)  # fmt: skip
        assert r.status_code == 400

        # 3. Far behind (more than catch_up_threshold), coalesced: the sources' state.
        # Every row was new in the window: each net change is an insert of the row as it
        # is now, and rows inserted and deleted in it are not there at all.
        r = httpx.get(base, params={"after": start, "limit": 10_000, "coalesce": "true"},
                      headers=AUTH)  # fmt: skip
        assert r.status_code == 200, r.text
        page = r.json()
        assert page["coalesced"] is True and page["behind"] > 50
        assert {m["action"] for m in page["messages"]} == {"insert"}
        deleted = {
            (s, k) for s, changes in expected.items() for _, a, k in changes if a == "delete"
        }
        vanished = sum((s, k) in deleted for s, changes in expected.items() for _, _, k in changes)
        assert sum(m["coalesced"] for m in page["messages"]) == total - vanished
        state = {
            (m["source"], m["key"]):
                (m["message"] if m["source"] == "west" else m["message"]["record"])["v"]
            for m in page["messages"]
        }  # fmt: skip
        assert len(state) == len(page["messages"])
        for name, database in (("east", db), ("west", other_db)):
            rows = dict(database.execute("SELECT id::text, v FROM items"))
            assert {k: v for (s, k), v in state.items() if s == name} == rows
        west_insert = next(m for m in page["messages"] if m["source"] == "west")
        assert west_insert["action"] == "insert" and "action" not in west_insert["message"]
        r = httpx.get(base, params={"after": page["progress"], "coalesce": "true"}, headers=AUTH)
        assert r.json()["messages"] == [] and r.json()["progress"] == page["progress"]
        # Not far behind: the same request is not coalesced.
        r = httpx.get(base, params={"after": got[-25].progress, "coalesce": "true"}, headers=AUTH)
        assert r.json()["coalesced"] is False and len(r.json()["messages"]) == 24

        # 4. Server-Sent Events from the start, and a reconnect with Last-Event-ID: the
        # same messages, in the same order, as a long-poll read now.
        def sse(headers: dict[str, str], params: dict[str, str], n: int) -> list[dict[str, Any]]:
            out: list[dict[str, Any]] = []
            with httpx.stream("GET", f"{url}/v1/streams/changes/subscribe", params=params,
                              headers={**AUTH, **headers}, timeout=30) as resp:  # fmt: skip
                assert resp.status_code == 200
                for line in resp.iter_lines():
                    if line.startswith("data: "):
                        out.append(json.loads(line.removeprefix("data: ")))
                        if len(out) == n:
                            break
            return out

        events = sse({}, {"after": start}, 40)
        events += sse({"Last-Event-ID": events[-1]["progress"]}, {}, 40)
        now = httpx.get(base, params={"after": start, "limit": 80}, headers=AUTH).json()
        assert events == now["messages"]

        # 5. gRPC's PullerService, through its generated client: the same messages from
        # the same marker, resumed from an event's progress, in a group, coalesced.
        assert runtime.server.grpc is not None
        with grpc.insecure_channel(runtime.server.grpc.target) as channel:
            puller = Puller(puller_pb2_grpc.PullerServiceStub(channel))
            pulled = puller.pull(40, after=start)
            pulled += puller.pull(40, after=pulled[-1].progress)
            assert [as_http(e) for e in pulled] == now["messages"]
            reply = puller.stub.Ack(
                puller_pb2.AckRequest(stream="changes", consumer_id="g", progress=pulled[9].progress),
                metadata=puller.auth,
            )  # fmt: skip
            assert reply.progress == pulled[9].progress
            assert [as_http(e) for e in puller.pull(5, consumer_id="g")] == now["messages"][10:15]
            collapsed = puller.pull(len(page["messages"]), after=start, coalesce_on_catch_up=True)
            assert [as_http(e) for e in collapsed] == page["messages"]
            for request, metadata, code, text in [
                ({"after": start}, [], grpc.StatusCode.UNAUTHENTICATED, "consumer token"),
                ({"stream": "nope"}, None, grpc.StatusCode.NOT_FOUND, "no stream named 'nope'"),
                ({"after": "garbage"}, None, grpc.StatusCode.INVALID_ARGUMENT, "progress marker"),
            ]:
                with pytest.raises(grpc.RpcError) as err:
                    puller.pull(1, metadata=metadata, **request)
                assert err.value.code() == code and text in err.value.details(), err.value

        # 6. Retention: the brief stream deleted what is over 1s old; a marker from before
        # is a gap (410), counted in the metrics.
        def expired() -> bool:
            # east's brief sink may not have made a batch visible yet: no position, not yet
            east = httpx.get(f"{url}/v1/streams/brief").json()["positions"].get("east")
            return east is not None and east["expired"][0] > 0

        wait_until(expired, 30, message="the brief stream's retention deleted nothing")
        r = httpx.get(f"{url}/v1/streams/brief/messages", params={"after": brief_head},
                      headers=AUTH)  # fmt: skip
        assert r.status_code == 410, r.text
        assert "gap" in r.json()["detail"]["problem"]
        assert sample(metrics(url), "walstream_stream_gaps_total", stream="brief") == 1.0
        sub = subscribe(url, "brief", token=TOKEN, after=brief_head, wait=0)
        with pytest.raises(Gap, match="deleted by the stream's retention"):
            next(iter(sub))
        sub.close()
        with grpc.insecure_channel(runtime.server.grpc.target) as channel:
            puller = Puller(puller_pb2_grpc.PullerServiceStub(channel))
            with pytest.raises(grpc.RpcError) as err:
                puller.pull(1, stream="brief", after=brief_head)
            assert err.value.code() == grpc.StatusCode.OUT_OF_RANGE
            assert "deleted by the stream's retention" in err.value.details()
            assert "fix: rebuild the consumer's state" in err.value.details()
        # one more each: the client's read above, and this subscription
        assert sample(metrics(url), "walstream_stream_gaps_total", stream="brief") == 3.0


class Puller:
    """The PullerService's generated client, with the consumer token."""

    def __init__(self, stub: Any) -> None:
        self.stub = stub
        self.auth = [("authorization", f"Bearer {TOKEN}")]

    def pull(self, n: int, metadata: Any = None, **request: Any) -> list[Any]:
        """The first `n` events of a subscription (then it is cancelled)."""
        request.setdefault("stream", "changes")
        call = self.stub.Subscribe(
            puller_pb2.SubscribeRequest(**request),
            metadata=self.auth if metadata is None else metadata,
            timeout=60,
        )
        out = []
        for e in call:
            out.append(e)
            if len(out) == n:
                break
        call.cancel()
        return out


def as_http(e: Any) -> dict[str, Any]:
    """An event as the HTTP API shows the same message."""
    m = {
        "source": e.source, "table": e.table, "action": e.action,
        "key": e.key if e.HasField("key") else None, "lsn": e.lsn, "seq": e.seq,
        "idempotency_key": e.idempotency_key, "progress": e.progress,
    }  # fmt: skip
    if e.coalesced:
        m["coalesced"] = e.coalesced
    m["message"] = json.loads(e.message) if e.message else None
    return m


def test_open_reads_are_bounded_and_markers_and_acks_are_checked(spark, db, tmp_path):
    """At most 2 open reads per client and 3 per stream (429 with Retry-After beyond; gRPC
    subscriptions counted apart, per client address whatever the channel);
    a marker naming an unknown source or nested deep is a 400, never a 500; a group ack
    past what the stream made visible is a 400 and stores nothing."""
    import base64

    from walstream.streams import markers

    path = tmp_path / "walstream.yaml"
    path.write_text(yaml.safe_dump({
        "server": {"port": 0, "grpc_port": 0, "max_client_connections": 2,
                   "max_stream_connections": 3},
        "spark": {"checkpoint_dir": str(tmp_path / "ckpt")},
        "sources": [{"name": "east", "dsn": db.dsn}],
        "sinks": [{"name": "east-changes", "source": "east",
                   "destination": {"type": "stream", "stream": "changes", "token": TOKEN}}],
    }))  # fmt: skip
    db.slots.append("walstream_east")
    db.execute("CREATE TABLE items (id int PRIMARY KEY)")
    runtime = Runtime(load_config(path), spark=spark).start()
    assert runtime.server is not None
    url = runtime.server.url
    base = f"{url}/v1/streams/changes"
    with supervised(runtime):
        db.execute("INSERT INTO items SELECT generate_series(1, 5)")
        # The five inserts are kept and visible (the head marker holds the source), all
        # five: the head was seen at the third once, and a group begins at the head then.
        wait_until(lambda: markers.decode("changes", httpx.get(base).json()["head"])
                   .get("east", markers.START)[1] == 4, 60)  # fmt: skip
        head = httpx.get(base).json()["head"]

        # Markers: an unknown source, nesting past the marker's layout, a deep bomb.
        for marker, why in (
            (markers.encode("changes", {"north": (1, 0)}), "does not have"),
            (base64.urlsafe_b64encode(b'{"v":1,"s":"changes","p":{"east":[[[1]],0]}}'), "nested"),
            (base64.urlsafe_b64encode(b"[" * 15_000), "nested"),
        ):  # fmt: skip
            text = marker if isinstance(marker, str) else marker.decode().rstrip("=")
            read = httpx.get(f"{base}/messages", params={"after": text}, headers=AUTH)
            ack = httpx.post(f"{base}/groups/g/ack", json={"progress": text}, headers=AUTH)
            for r in (read, ack):
                assert r.status_code == 400, r.text
                assert why in r.json()["detail"]["problem"]

        # Acks: past what is visible is refused; the group stays where it was.
        before = httpx.get(f"{base}/groups/g", headers=AUTH).json()["progress"]
        visible = markers.decode("changes", head)
        ahead = {"east": (visible["east"][0] + 10**9, 0)}
        r = httpx.post(f"{base}/groups/g/ack", json={"progress": markers.encode("changes", ahead)},
                       headers=AUTH)  # fmt: skip
        assert r.status_code == 400 and "past what the stream has made visible" in r.text
        assert httpx.get(f"{base}/groups/g", headers=AUTH).json()["progress"] == before
        r = httpx.post(f"{base}/groups/g/ack", json={"progress": head}, headers=AUTH)
        assert r.status_code == 200 and r.json()["progress"] == head

        # Open reads: SSE subscriptions held open, from two loopback client addresses.
        def client(address: str) -> httpx.Client:
            return httpx.Client(transport=httpx.HTTPTransport(local_address=address), timeout=30)

        def opened(c: httpx.Client) -> Any:
            cm = c.stream("GET", f"{base}/subscribe", headers=AUTH)
            resp = cm.__enter__()
            return cm, resp

        a, b = client("127.0.0.1"), client("127.0.0.2")
        held = [opened(a), opened(a)]
        assert [resp.status_code for _, resp in held] == [200, 200]
        r = a.get(f"{base}/messages", headers=AUTH)  # a long-poll counts too
        assert r.status_code == 429 and r.headers["retry-after"] == "5"
        assert "this client has 2 open reads" in r.json()["detail"]["problem"]
        held.append(opened(b))
        assert held[-1][1].status_code == 200
        r = b.get(f"{base}/messages", headers=AUTH)
        assert r.status_code == 429 and "stream changes has 3 open reads" in r.text

        # gRPC's subscriptions are counted apart from HTTP's (all three places are held),
        # per client address: three channels of one client are one client.
        assert runtime.server.grpc is not None
        begin = markers.encode("changes", {"east": markers.START})
        channels = [  # each its own connection (gRPC shares one between alike channels)
            grpc.insecure_channel(runtime.server.grpc.target,
                                  options=[("grpc.use_local_subchannel_pool", 1)])
            for _ in range(3)
        ]  # fmt: skip
        calls = []
        for channel in channels[:2]:
            call = Puller(puller_pb2_grpc.PullerServiceStub(channel)).stub.Subscribe(
                puller_pb2.SubscribeRequest(stream="changes", after=begin),
                metadata=[("authorization", f"Bearer {TOKEN}")], timeout=60,
            )  # fmt: skip
            assert next(call).table == "public.items"  # open, and counted
            calls.append(call)
        with pytest.raises(grpc.RpcError) as err:
            Puller(puller_pb2_grpc.PullerServiceStub(channels[2])).pull(1, after=begin)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "this client has 2 open reads" in err.value.details()
        calls.pop().cancel()  # one ends: its place frees

        def freed() -> bool:
            try:
                puller = Puller(puller_pb2_grpc.PullerServiceStub(channels[2]))
                return len(puller.pull(1, after=begin)) == 1
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                    raise
                return False  # the server has not seen the cancel yet

        wait_until(freed, 30)
        for call in calls:
            call.cancel()
        for channel in channels:
            channel.close()
        cm, _ = held.pop(0)
        cm.__exit__(None, None, None)  # one closes: its place frees
        wait_until(lambda: b.get(f"{base}/messages", headers=AUTH).status_code == 200, 30)
        for cm, _ in held:
            cm.__exit__(None, None, None)
        a.close()
        b.close()
