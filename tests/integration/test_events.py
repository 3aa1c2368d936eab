"""Event ingestion: concurrent producers POST 600 events; three webhook subscriptions
by event type get them in order per ordering key, through a receiver that fails with
500 for a while, one that refuses an event with 400 (a dead letter) and one that
times out; a repeated Idempotency-Key inserts nothing. Events without an ordering key
are each their own group (a refused one takes no other with it); a sink without
`event_types` gets the source's tables but not the outbox; retried through the API,
the dead letters arrive in their order."""

from __future__ import annotations

import itertools
import json
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import unique
from tests.integration.test_backfill import files, messages
from tests.servers import Request, WebhookReceiver
from walstream.config import load_config
from walstream.runtime import Runtime
from walstream.testing import supervised, wait_until

pytestmark = [pytest.mark.spark]

PRODUCERS, PER_PRODUCER, KEYS_PER_PRODUCER = 4, 150, 5
EVENTS = PRODUCERS * PER_PRODUCER
TYPES = ["order.created", "order.paid", "user.signup"]
TOKEN = "producer-token-42"
READ_TOKEN = "read-token-0123456789abcdef"
READ = {"Authorization": f"Bearer {READ_TOKEN}"}
API_TOKEN = "api-token-0123456789abcdef"
#: Sign-ups without an ordering key: each its own group; the second is refused (400)
NO_KEY = [{"event_type": "user.signup",
           "payload": {"producer": 9, "i": j, "seq": j, "key": None,
                       "tag": "poison" if j == 1 else "ok"}} for j in range(3)]  # fmt: skip


def event_of(p: int, i: int) -> dict[str, Any]:
    """Producer p's i-th event: its keys are its own, each with an increasing sequence."""
    key = f"p{p}-k{i % KEYS_PER_PRODUCER}"
    return {
        "event_type": TYPES[i % 3],
        "ordering_key": key,
        "payload": {"producer": p, "i": i, "seq": i // KEYS_PER_PRODUCER, "key": key,
                    "tag": "poison" if (p, i) == (1, 2) else "ok"},
    }  # fmt: skip


def unique_requests(rx: WebhookReceiver) -> list[dict[str, Any]]:
    """Accepted requests in arrival order, repeats of a webhook-id dropped (a timed-out
    request the receiver still took is sent again)."""
    seen: set[str] = set()
    out = []
    with rx.lock:
        requests: list[Request] = list(rx.requests)
    for r in requests:
        if r.headers["webhook-id"] in seen:
            continue
        seen.add(r.headers["webhook-id"])
        out.append(json.loads(r.body))
    return out


def in_order_per_key(events: list[dict[str, Any]]) -> None:
    last: dict[str, int] = defaultdict(lambda: -1)
    for e in events:
        key, seq = e["ordering_key"], e["payload"]["seq"]
        if key is None:
            continue  # its own group: no order with any other
        assert seq > last[key], f"{key}: {seq} after {last[key]}"
        last[key] = seq


def test_ingested_events_reach_their_subscriptions_in_order_per_key(spark, db, tmp_path):
    failing = WebhookReceiver().start()  # 500 for its first 40 requests
    refusing = WebhookReceiver().start()  # 400 for the poison event: a dead letter
    slow = WebhookReceiver().start()  # answers its first 4 requests after the sink gave up
    calls = itertools.count()
    failing.answer = lambda path: 500 if next(calls) < 40 else 200
    refusing.answer = lambda path: 400 if path.endswith("/poison") else 200
    slow_calls = itertools.count()

    def slow_answer(path: str) -> int:
        if next(slow_calls) < 4:
            time.sleep(1.5)  # the slow destination's delay (see `slow` above)
        return 200

    slow.answer = slow_answer
    pub, slot = unique("pub"), unique("slot")
    db.slots.append(slot)
    db.execute("CREATE TABLE notes (id int PRIMARY KEY)")
    db.execute(f"CREATE PUBLICATION {pub} FOR TABLE notes")  # walstream adds the outbox
    path = tmp_path / "walstream.yaml"
    hook = {"type": "webhook", "retry_timeout": "2s", "timeout": "5s"}
    path.write_text(yaml.safe_dump({
        "server": {"port": 0, "read_token": READ_TOKEN, "token": API_TOKEN},
        "spark": {"checkpoint_dir": str(tmp_path / "ckpt")},
        "events": {"source": "app", "token": TOKEN},
        "sources": [{"name": "app", "dsn": db.dsn, "slot": slot, "publication": pub}],
        "sinks": [
            {"name": "orders", "source": "app", "event_types": ["order.created", "order.paid"],
             "group_by": ["ordering_key"], "backoff": {"initial": "0.2s", "max": "1s"},
             "destination": {**hook, "url": failing.url()}},
            {"name": "signups", "source": "app", "event_types": ["user.signup"],
             "group_by": ["ordering_key"],
             "destination": {**hook, "url": f"concat('{refusing.url('/hook/')}', "
                                            "get_json_object(record, '$.payload.tag'))"}},
            {"name": "audit", "source": "app", "event_types": TYPES, "group_by": ["ordering_key"],
             "backoff": {"initial": "0.2s", "max": "1s"},
             "destination": {**hook, "url": slow.url(), "timeout": "0.5s"}},
            files("everything", tmp_path / "everything"),  # no event_types: not the outbox
        ],
    }))  # fmt: skip
    runtime = Runtime(load_config(path), spark=spark).start()
    assert runtime.server is not None
    url = runtime.server.url
    auth = {"Authorization": f"Bearer {TOKEN}"}
    try:
        with supervised(runtime):
            # Refusals first: no token, a wrong one, bad bodies.
            ev = event_of(0, 0)
            assert httpx.post(f"{url}/v1/events", json=ev).status_code == 401
            assert (
                httpx.post(
                    f"{url}/v1/events", json=ev, headers={"Authorization": "Bearer x"}
                ).status_code
                == 401
            )
            for bad in ({"event_type": "", "payload": {}}, {"event_type": "a", "payload": [1]},
                        {"event_type": "a"}, {"event_type": "a", "payload": {"x": "\x00"}}):  # fmt: skip
                r = httpx.post(f"{url}/v1/events", json=bad, headers=auth)
                assert r.status_code == 422, (bad, r.text)
                assert r.json()["detail"]["problem"]
            r = httpx.post(
                f"{url}/v1/events",
                content=b"{" + b" " * 300_000 + b"}",
                headers={**auth, "content-type": "application/json"},
            )
            assert r.status_code == 413

            # Idempotency: the same key twice is one event.
            key = {**auth, "Idempotency-Key": unique("idem")}
            first = httpx.post(
                f"{url}/v1/events", json={"event_type": "noise", "payload": {"n": 1}}, headers=key
            )
            again = httpx.post(
                f"{url}/v1/events", json={"event_type": "noise", "payload": {"n": 2}}, headers=key
            )
            assert first.status_code == again.status_code == 202
            assert first.json()["duplicate"] is False and again.json() == {
                "id": first.json()["id"],
                "duplicate": True,
            }
            assert db.execute("SELECT count(*) FROM walstream.events WHERE idempotency_key = %s",
                              (key["Idempotency-Key"],)) == [(1,)]  # fmt: skip

            # 4 producers at once, each 500 events on its own 5 keys, in order per key.
            def produce(p: int) -> list[str]:
                with httpx.Client(headers=auth) as c:
                    ids = []
                    for i in range(PER_PRODUCER):
                        r = c.post(f"{url}/v1/events", json=event_of(p, i))
                        assert r.status_code == 202, r.text
                        ids.append(r.json()["id"])
                    return ids

            with ThreadPoolExecutor(PRODUCERS) as pool:
                ids = [i for batch in pool.map(produce, range(PRODUCERS)) for i in batch]
            for ev in NO_KEY:
                r = httpx.post(f"{url}/v1/events", json=ev, headers=auth)
                assert r.status_code == 202, r.text
                ids.append(r.json()["id"])
            assert len(set(ids)) == EVENTS + len(NO_KEY)
            db.execute("INSERT INTO notes SELECT generate_series(1, 5)")

            produced = [event_of(p, i) for p in range(PRODUCERS) for i in range(PER_PRODUCER)]
            wanted = {name: [e for e in produced + NO_KEY if e["event_type"] in types]
                      for name, types in (("orders", TYPES[:2]), ("signups", TYPES[2:]), ("audit", TYPES))}  # fmt: skip

            def dead_letters() -> list[dict[str, Any]]:
                listed = httpx.get(
                    f"{url}/api/dead-letters", params={"sink": "signups"}, headers=READ
                ).json()
                return [
                    httpx.get(f"{url}/api/dead-letters/{d['id']}", headers=READ).json()
                    for d in listed["items"]
                ]

            def arrived() -> bool:
                dead = httpx.get(
                    f"{url}/api/dead-letters", params={"sink": "signups"}, headers=READ
                ).json()
                return (
                    len(unique_requests(failing)) == len(wanted["orders"])
                    and len(unique_requests(refusing)) + dead["total"] == len(wanted["signups"])
                    and len(unique_requests(slow)) == len(wanted["audit"])
                )

            wait_until(arrived, 240, message=lambda: (
                f"orders {len(unique_requests(failing))}/{len(wanted['orders'])}, signups "
                f"{len(unique_requests(refusing))} + dead letters /{len(wanted['signups'])}, audit "
                f"{len(unique_requests(slow))}/{len(wanted['audit'])}"))  # fmt: skip
            # The 400 made the poison event a dead letter, and with it the events of its
            # ordering key behind it in that delivery chunk (their order is kept for a retry).
            # The poison without a key took none with it: the keyless ones are their own groups.
            dead = dead_letters()
            keyless = [d for d in dead if json.loads(d["message"])["ordering_key"] is None]
            assert [json.loads(d["message"])["payload"]["i"] for d in keyless] == [1]
            head, *behind = [d for d in dead if d not in keyless]
            assert json.loads(head["message"])["payload"]["tag"] == "poison"
            assert "400" in head["errors"][0]["error"]
            assert all(json.loads(d["message"])["ordering_key"] == "p1-k2" for d in behind)
            assert all("behind" in d["errors"][0]["error"] for d in behind), behind[:1]

            for rx, name in ((failing, "orders"), (refusing, "signups"), (slow, "audit")):
                got = unique_requests(rx)
                in_order_per_key(got)
                assert {e["id"] for e in got} <= set(ids)
                expect = {(e["payload"]["producer"], e["payload"]["i"]) for e in wanted[name]}
                if name == "signups":
                    expect -= {
                        (p["producer"], p["i"])
                        for p in (json.loads(d["message"])["payload"] for d in dead)
                    }
                assert {(e["payload"]["producer"], e["payload"]["i"]) for e in got} == expect
                assert all(e["event_type"] in {w["event_type"] for w in wanted[name]} for e in got)
            assert len(failing.refused) >= 40 and all(s == 500 for s, _ in failing.refused)
            assert len(slow.requests) > len(
                unique_requests(slow)
            )  # the timed-out ones, taken twice
            assert {r[0] for r in db.execute("SELECT event_type FROM walstream.events")} == {
                *TYPES,
                "noise",
            }
            # A sink without event_types (or tables) has the source's tables, not the outbox.
            wait_until(lambda: len(messages(tmp_path / "everything")) >= 5, 60)
            everything = messages(tmp_path / "everything")
            assert [(m["metadata"]["table_schema"], m["metadata"]["table_name"], m["record"]["id"])
                    for m in everything] == [("public", "notes", i) for i in range(1, 6)]  # fmt: skip

            # The receiver takes them now; retried, the dead letters arrive, each key's in order.
            refusing.answer = lambda path: 200
            before = len(unique_requests(refusing))
            for d in dead:
                r = httpx.post(f"{url}/api/dead-letters/{d['id']}/retry",
                               headers={"Authorization": f"Bearer {API_TOKEN}"})  # fmt: skip
                assert r.status_code == 200 and r.json()["retried"] is True, r.text
            wait_until(lambda: len(unique_requests(refusing)) == before + len(dead), 60,
                       message=lambda: f"{len(unique_requests(refusing)) - before}/{len(dead)}")  # fmt: skip
            retried = unique_requests(refusing)[before:]
            in_order_per_key(retried)
            assert sorted(e["id"] for e in retried) == sorted(
                json.loads(d["message"])["id"] for d in dead
            )
            assert dead_letters() == []
    finally:
        for rx in (failing, refusing, slow):
            rx.stop()
