"""The retrier against a real state database and a real destination (an HTTP receiver),
without Spark: a group that keeps failing becomes dead letters after `max_attempts` and stops
blocking its key; a standby retries nothing; a paused sink delivers nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.servers import WebhookReceiver
from walstream.config import parse_config
from walstream.delivery.parking import DEAD, PARKED, ParkingLot
from walstream.delivery.retrier import Retrier
from walstream.sinks.base import Message
from walstream.testing import wait_until


@pytest.fixture
def rx() -> Any:
    r = WebhookReceiver().start()
    yield r
    r.stop()


def received(rx: WebhookReceiver) -> list[Any]:
    return [json.loads(r.body) for r in rx.requests]


def setup(
    db: Any, tmp_path: Path, rx: WebhookReceiver, max_attempts: int = 3, batch_size: int = 1000
) -> tuple[Any, ParkingLot, Path]:
    switch = tmp_path / "failing"
    switch.touch()
    cfg = parse_config({
        "sources": [{"name": "app", "dsn": db.dsn}],
        "sinks": [{"name": "files", "source": "app", "max_attempts": max_attempts,
                   "batch_size": batch_size,
                   "backoff": {"initial": "0.05s", "max": "0.1s"},
                   "destination": {"type": "faulty", "fail_keys": ["1"], "retryable": True,
                                   "while_exists": str(switch),
                                   "inner": {"type": "webhook", "url": rx.url()}}}],
    })  # fmt: skip
    lot = ParkingLot(db.dsn, "walstream")
    lot.ensure()
    return cfg.sinks[0], lot, switch


def parked(key: str, n: int) -> Message:
    value = json.dumps({"key": key, "n": n}).encode()
    return Message(0x5000 + n * 64, 0, value, key.encode(), None, "public.t", "update",
                   group=f"public\x1ft\x1f{key}")  # fmt: skip


def park(lot: ParkingLot, messages: list[Message]) -> None:
    lot.park("files", [(m, PARKED, "failed in the batch", 1, 0.0) for m in messages])


def test_max_attempts_turns_the_group_into_dead_letters_and_unblocks_its_key(db, tmp_path, rx):
    sink, lot, _ = setup(db, tmp_path, rx)
    stuck = [parked("1", n) for n in range(3)]  # key 1 keeps failing
    fine = [parked("2", n) for n in range(3, 5)]  # key 2 is delivered
    park(lot, stuck + fine)
    retrier = Retrier([sink], lot, interval=0.05)

    def settled() -> bool:
        retrier.run_once()
        return lot.counts()["files"][PARKED] == 0

    wait_until(settled, 30, message=lambda: f"counts: {lot.counts()}")
    assert lot.counts()["files"] == {PARKED: 0, DEAD: 3}
    dead = lot.group("files", "public\x1ft\x1f1", status=DEAD)
    assert [p.message.value for p in dead] == [m.value for m in stuck]  # the whole group, in order
    head = dead[0]
    assert head.attempts == 3  # parked once by the batch, then failed twice more by the retrier
    assert [e["error"] for e in head.errors] == ["failed in the batch"] + [
        "injected failure (faulty sink) for key b'1' and 2 more"
    ] * 2
    assert lot.blocked("files") == (set(), 0)  # key 1 no longer holds back new changes
    assert received(rx) == [json.loads(m.value) for m in fine]


def test_a_standby_and_a_paused_sink_retry_nothing(db, tmp_path, rx):
    sink, lot, switch = setup(db, tmp_path, rx, max_attempts=100)
    switch.unlink()  # the destination takes everything now
    park(lot, [parked("1", 0), parked("1", 1)])
    standby = Retrier([sink], lot, leads=lambda source: False)
    assert standby.run_once() == 0
    lot.set_paused("files", True, "maintenance")
    assert Retrier([sink], lot).run_once() == 0
    assert lot.counts()["files"] == {PARKED: 2, DEAD: 0} and rx.requests == []
    lot.set_paused("files", False)
    assert Retrier([sink], lot).run_once() == 2
    assert [m["n"] for m in received(rx)] == [0, 1]
    assert lot.counts().get("files", {PARKED: 0})[PARKED] == 0


class Died(BaseException):
    """The process ends here (kill -9): nothing after it runs, no handler sees it."""


def test_dying_between_the_ack_and_the_delete_sends_that_chunk_again_and_no_more(
    db, tmp_path, rx, monkeypatch
):
    """The retrier deletes a chunk's parked rows after the destination took the chunk. Dying
    in between, the next start sends that chunk again (the same webhook-ids, so the
    destination can tell), and nothing else twice."""
    sink, lot, switch = setup(db, tmp_path, rx, max_attempts=100, batch_size=2)
    switch.unlink()
    park(lot, [parked("1", n) for n in range(5)])
    real = ParkingLot.delivered
    calls = []

    def dies_after_the_first_ack(self: ParkingLot, ids: list[int]) -> None:
        calls.append(ids)
        if len(calls) == 2:  # the second chunk was taken; its rows are not deleted
            raise Died
        real(self, ids)

    monkeypatch.setattr(ParkingLot, "delivered", dies_after_the_first_ack)
    with pytest.raises(Died):
        Retrier([sink], lot).run_once()
    assert [m["n"] for m in received(rx)] == [0, 1, 2, 3]
    assert lot.counts()["files"][PARKED] == 3  # the taken chunk is still parked
    monkeypatch.setattr(ParkingLot, "delivered", real)
    assert Retrier([sink], lot).run_once() == 3  # the next start
    assert [m["n"] for m in received(rx)] == [0, 1, 2, 3, 2, 3, 4]
    ids = [r.headers["webhook-id"] for r in rx.requests]
    assert ids[2:4] == ids[4:6] and len(set(ids)) == 5  # the repeat: same ids, that chunk only
    assert lot.counts().get("files", {PARKED: 0})[PARKED] == 0
