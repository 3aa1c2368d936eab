"""Spooling in-progress transactions: streamed blocks, subtransaction aborts, the disk."""

from __future__ import annotations

import itertools
import os
import struct

import pytest

from walstream.capture.spool import Spools
from walstream.errors import SetupError

TOP, SUB1, SUB2 = 700, 701, 702


def start(xid: int, first: bool = False) -> bytes:
    return b"S" + struct.pack("!Ib", xid, 1 if first else 0)


def insert(xid: int, n: int) -> bytes:
    """An Insert as Postgres streams it: kind, xid, relation oid, a tuple of one value."""
    value = str(n).encode()
    return b"I" + struct.pack("!II", xid, 16384) + b"N" + struct.pack("!hbi", 1, 116, len(value)) + value  # fmt: skip


def plain(n: int) -> bytes:
    """The same Insert as an ordinary transaction carries it (no xid)."""
    value = str(n).encode()
    return b"I" + struct.pack("!I", 16384) + b"N" + struct.pack("!hbi", 1, 116, len(value)) + value  # fmt: skip


def commit(xid: int, lsn: int = 0x1000) -> bytes:
    return b"c" + struct.pack("!Ibqqq", xid, 0, lsn, lsn + 0x30, 12345)


def abort(xid: int, subxid: int) -> bytes:
    return b"A" + struct.pack("!II", xid, subxid)


_AT = itertools.count(0x5000, 0x28)  # each fed message's WAL position, rising


def feed(spools: Spools, *messages: bytes) -> list[int]:
    """Feed the messages, each at its own WAL position; the positions."""
    out = []
    for m in messages:
        out.append(next(_AT))
        assert spools.receive(m, out[-1]), m[:1]
    return out


def raws(replay: object) -> list[bytes]:
    return [raw for raw, _ in replay]  # type: ignore[attr-defined]


@pytest.mark.parametrize("budget", [1 << 20, 0], ids=["memory", "disk"])
def test_a_committed_streamed_transaction_comes_back_as_an_ordinary_one(budget, tmp_path):
    spools = Spools(budget, str(tmp_path))
    other = 800
    _, a1, a2, _ = feed(spools, start(TOP, first=True), insert(TOP, 1), insert(TOP, 2), b"E")
    feed(spools, start(other, first=True), insert(other, 99), b"E")
    _, a3, _ = feed(spools, start(TOP), insert(TOP, 3), b"E")
    assert not spools.receive(b"B" + bytes(20), 1)  # not a streaming message: the caller's
    replay = spools.commit(commit(TOP, 0x2000), 0x2030)
    out = list(replay)
    replay.close()
    assert out[0] == (b"B" + struct.pack("!qqI", 0x2000, 12345, TOP), 0x2030)
    # the other transaction's not among them; each change keeps its own WAL position
    assert out[1:-1] == [(plain(1), a1), (plain(2), a2), (plain(3), a3)]
    assert out[-1] == (b"C" + struct.pack("!bqqq", 0, 0x2000, 0x2030, 12345), 0x2030)
    assert replay.done and list(spools.open) == [other]
    assert (spools.spilled_bytes > 0) == (budget == 0)


@pytest.mark.parametrize("budget", [1 << 20, 0], ids=["memory", "disk"])
def test_a_rolled_back_savepoint_drops_its_changes_and_its_children(budget, tmp_path):
    spools = Spools(budget, str(tmp_path))
    feed(spools, start(TOP, first=True), insert(TOP, 1))
    feed(spools, insert(SUB1, 2), insert(SUB2, 3), insert(SUB1, 4), b"E")  # SUB2 inside SUB1
    feed(spools, abort(TOP, SUB1))  # ROLLBACK TO the savepoint that began SUB1
    feed(spools, start(TOP), insert(TOP, 5), b"E")
    feed(spools, abort(TOP, 999))  # a subtransaction that changed nothing
    out = raws(spools.commit(commit(TOP), 1))
    assert out[1:-1] == [plain(1), plain(5)]


def test_a_released_savepoint_keeps_its_changes_and_a_later_one_can_still_roll_back(tmp_path):
    spools = Spools(1 << 20, str(tmp_path))
    feed(spools, start(TOP, first=True), insert(SUB1, 1), insert(TOP, 2), insert(SUB2, 3), b"E")
    feed(spools, abort(TOP, SUB2))
    assert raws(spools.commit(commit(TOP), 1))[1:-1] == [plain(1), plain(2)]


def test_an_aborted_transaction_leaves_nothing(tmp_path):
    spools = Spools(0, str(tmp_path))
    feed(spools, start(TOP, first=True), insert(TOP, 1), b"E", abort(TOP, TOP))
    assert spools.open == {} and spools.memory_bytes == 0
    # A commit of a transaction whose changes were all filtered: Begin and Commit only.
    assert [m[:1] for m in raws(spools.commit(commit(TOP), 1))] == [b"B", b"C"]


def test_sent_again_from_its_start_replaces_what_was_spooled(tmp_path):
    spools = Spools(1 << 20, str(tmp_path))
    feed(spools, start(TOP, first=True), insert(TOP, 1), insert(TOP, 2), b"E")
    feed(spools, start(TOP, first=True), insert(TOP, 1), b"E")  # after a reconnect
    assert raws(spools.commit(commit(TOP), 1))[1:-1] == [plain(1)]


def test_memory_stays_within_the_budget_and_the_rest_goes_to_an_unnamed_file(tmp_path):
    budget = 4096
    spools = Spools(budget, str(tmp_path))
    feed(spools, start(TOP, first=True), start(800, first=True))
    for n in range(2000):
        xid = TOP if n % 2 else 800
        feed(spools, start(xid), insert(xid, n), b"E")
        assert spools.memory_bytes <= budget + len(insert(xid, n))
    assert spools.spilled_bytes > 0
    assert os.listdir(tmp_path) == []  # unlinked: a crash leaves nothing behind
    assert raws(spools.commit(commit(TOP), 1))[1:-1] == [plain(n) for n in range(1, 2000, 2)]
    assert raws(spools.commit(commit(800), 1))[1:-1] == [plain(n) for n in range(0, 2000, 2)]
    assert spools.memory_bytes == 0


def test_clear_forgets_every_open_transaction(tmp_path):
    spools = Spools(0, str(tmp_path))
    feed(spools, start(TOP, first=True), insert(TOP, 1))
    spools.clear()
    assert spools.open == {} and spools.xid is None
    assert not spools.receive(b"C" + bytes(25), 1)


def test_an_unwritable_spill_directory_is_a_setup_error_with_the_fix(tmp_path):
    with pytest.raises(SetupError) as err:
        Spools(1, str(tmp_path / "missing")).check()
    assert "missing" in err.value.problem and "spill_dir" in err.value.fix
