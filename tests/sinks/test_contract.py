"""The sink contract (walstream/sinks/base.py), run against every sink and its real server.

Every sink: delivers a group's messages in order and passes each message's
idempotency key on in its system's native place (the Postgres mirror keeps rows, not
messages: each row ends at its group's last change, and the table's stored cursor is
the last message's key); a replayed batch leaves no
visible duplicate where the system can drop them (file, NATS) and exactly one
copy of each replayed message where it cannot; a destination that refuses a
message for good raises a non-retryable SinkError, one that is down a retryable
one, and `test_connection` tells them apart.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter

from tests.conftest import unique
from tests.sinks.conftest import Harness, values
from walstream.change import idempotency_key
from walstream.config import Destination
from walstream.errors import SinkError
from walstream.sinks.base import BatchInfo, Message, SinkContext
from walstream.sinks.registry import sink_for

GROUPS, PER_GROUP, CHUNK = 6, 100, 150


def workload(groups: int = GROUPS, per_group: int = PER_GROUP) -> list[Message]:
    """Messages of several groups interleaved, in WAL order (two per transaction)."""
    out = []
    for i in range(groups * per_group):
        g, n = i % groups, i // groups
        value = json.dumps({"group": g, "n": n}).encode()
        out.append(
            Message(0x1000000 + i // 2 * 64, i % 2, value, str(g).encode(), None,
                    "public.items", "update", group=f"public\x1fitems\x1f{g}")
        )  # fmt: skip
    return out


def make_sink(dest: dict[str, Any], context: SinkContext | None = None) -> Any:
    """The sink for `dest`, resolved for `context` as the config's plan does (the stream
    sink needs it: its state database)."""
    settings = TypeAdapter(Destination).validate_python(dest)
    return sink_for(settings.resolved(context) if context is not None else settings)


def run_batch(
    dest: dict[str, Any], messages: list[Message], batch_id: int = 1,
    context: SinkContext | None = None,
) -> None:  # fmt: skip
    """What a Spark task does with a sink: begin, deliver chunk by chunk, finish, close."""
    sink = make_sink(dest, context)
    sink.prepare_batch("contract", batch_id, 1)
    sink.begin(BatchInfo("contract", batch_id, 0, 1))
    try:
        for i in range(0, len(messages), CHUNK):
            sink.deliver(messages[i : i + CHUNK])
        sink.finish()
    finally:
        sink.close()


def test_a_group_arrives_in_order_with_its_idempotency_keys(harness: Harness) -> None:
    route = unique("contract")
    sent = harness.prepare(route, workload())
    run_batch(harness.destination(route), sent, context=harness.context)
    if harness.state_only:  # each group's row holds its last change; the cursor the last key
        got = harness.read(route, GROUPS)
        assert [json.loads(g.value) for g in got] == [
            {"group": g, "n": PER_GROUP - 1} for g in range(GROUPS)
        ]
        assert {g.idempotency_key for g in got} == {idempotency_key(sent[-1].lsn, sent[-1].seq)}
        return
    got = harness.read(route, len(sent))
    assert len(got) == len(sent)
    by_group: dict[int, list[int]] = defaultdict(list)
    for v in values(got):
        by_group[v["group"]].append(v["n"])
    assert by_group == {g: list(range(PER_GROUP)) for g in range(GROUPS)}
    # each message carries its own idempotency key
    keys = {m.value: idempotency_key(m.lsn, m.seq) for m in sent}
    assert all(g.idempotency_key == keys[g.value] for g in got)
    assert len({g.idempotency_key for g in got}) == len(sent)


def test_a_replayed_batch_is_dropped_where_the_system_can_dedupe(harness: Harness) -> None:
    route = unique("replay")
    sent = harness.prepare(route, workload(3, 20))
    dest = harness.destination(route)
    run_batch(dest, sent, context=harness.context)
    run_batch(dest, sent, context=harness.context)  # again, as after a crash before the commit
    if harness.state_only:  # and an older slice after it: no row moves backwards
        run_batch(dest, sent[:5], context=harness.context)
        assert values(harness.read(route, 3)) == [{"group": g, "n": 19} for g in range(3)]
    elif harness.dedupes:
        got = harness.read(route, len(sent))
        assert sorted(values(got), key=str) == sorted((json.loads(m.value) for m in sent), key=str)  # type: ignore[arg-type]
    else:  # one more copy of each, recognisable by its idempotency key
        got = harness.read(route, 2 * len(sent))
        counts: dict[str, int] = defaultdict(int)
        for g in got:
            counts[g.idempotency_key] += 1
        assert counts == {idempotency_key(m.lsn, m.seq): 2 for m in sent}


def test_a_message_refused_for_good_is_not_retryable(harness: Harness) -> None:
    if harness.name == "file":
        pytest.skip("a file sink refuses no message")
    route = unique("refused")
    dest, bad = harness.refusing(route)
    good = workload(1, 1)[0]
    with pytest.raises(SinkError) as err:
        run_batch(dest, [good._replace(value=bad, lsn=good.lsn + 1)], context=harness.context)
    assert err.value.retryable is False, err.value
    assert err.value.fix, "every error says what to do"
    print(f"{harness.name}: {err.value}")
    assert err.value.delivered == frozenset()


def test_a_destination_that_is_down_is_retryable(harness: Harness) -> None:
    if harness.name == "file":
        pytest.skip("a file sink has no server")
    dest = harness.unreachable()
    with pytest.raises(SinkError) as err:
        run_batch(dest, workload(1, 3), context=harness.unreachable_context())
    assert err.value.retryable is True, err.value
    print(f"{harness.name}: {err.value}")
    with pytest.raises(SinkError):
        make_sink(dest, harness.unreachable_context()).test_connection()


def test_test_connection_passes_against_the_running_server(harness: Harness) -> None:
    sink = make_sink(harness.destination(unique("probe")), harness.context)
    assert sink.test_connection() is None  # it raises SinkError when it cannot reach it


def test_a_file_destination_that_cannot_be_written_fails_test_connection(tmp_path: Path) -> None:
    """The file sink's counterpart of a server that is down: a path it cannot create."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    dest = {"type": "file", "path": str(blocker / "out")}
    with pytest.raises(SinkError) as err:
        sink_for(TypeAdapter(Destination).validate_python(dest)).test_connection()
    assert not err.value.retryable
    assert err.value.problem.startswith(f"cannot write to {blocker / 'out'}: ")
    assert err.value.fix == "choose a writable directory for destination.path"
