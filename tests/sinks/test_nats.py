"""The NATS JetStream sink against its own nats-server with a user, a password and a small
max_payload: wrong credentials, a message too large, a stream that is not the expected one."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.servers import Service, _binary, _start
from tests.sinks.test_contract import run_batch, workload
from walstream.errors import SinkError
from walstream.postgres.embedded import free_port

nats = pytest.importorskip("nats")

USER, PASSWORD, MAX_PAYLOAD = "walstream", "nats-secret-17", 4096


@pytest.fixture(scope="module")
def server() -> Iterator[Service]:
    port, workdir = free_port(), Path(tempfile.mkdtemp(prefix="walstream-nats-"))
    (workdir / "nats.conf").write_text(
        f'listen: "127.0.0.1:{port}"\nmax_payload: {MAX_PAYLOAD}\n'
        f'jetstream {{ store_dir: "{workdir / "js"}" }}\n'
        f'authorization {{ user: "{USER}", password: "{PASSWORD}" }}\n'
    )
    svc = _start("nats", [_binary("nats-server", "nats-server"), "-c", str(workdir / "nats.conf")],
                 port, workdir)  # fmt: skip
    yield svc
    svc.stop()


def dest(server: Service, **more: Any) -> dict[str, Any]:
    return {"type": "nats", "servers": f"nats://127.0.0.1:{server.port}", "subject": "app.changes",
            "stream": "app", "create_stream": True, "user": USER, "password": PASSWORD,
            "timeout": 5, **more}  # fmt: skip


def stored(server: Service, stream: str) -> list[bytes]:
    async def fetch() -> list[bytes]:
        nc = await nats.connect(f"nats://127.0.0.1:{server.port}", user=USER, password=PASSWORD)
        try:
            js = nc.jetstream()
            info = await js.stream_info(stream)
            return [
                (await js.get_msg(stream, seq)).data
                for seq in range(info.state.first_seq, info.state.last_seq + 1)
            ] if info.state.messages else []  # fmt: skip
        finally:
            await nc.close()

    return asyncio.run(fetch())


def test_wrong_credentials_are_not_retried_and_the_password_is_not_shown(server):
    with pytest.raises(SinkError) as err:
        run_batch(dest(server, password="wrong-password-99"), workload(1, 1))
    e = err.value
    assert not e.retryable and "authorization failed" in e.problem
    assert "Authorization Violation" in e.problem and "destination.user and password" in e.fix
    assert "wrong-password-99" not in str(e) and PASSWORD not in str(e)
    sent = workload(1, 3)
    run_batch(dest(server), sent)  # the right ones
    assert stored(server, "app")[-3:] == [m.value for m in sent]


def test_a_message_over_max_payload_stops_its_chunk_there_and_is_not_retried(server):
    sent = workload(1, 4)
    big = sent[2]._replace(value=b'{"pad": "' + b"x" * MAX_PAYLOAD + b'"}')
    with pytest.raises(SinkError) as err:
        run_batch(dest(server, subject="big.changes", stream="big"), [*sent[:2], big, sent[3]])
    e = err.value
    assert not e.retryable and "larger than the server's max_payload" in e.problem
    assert "raise max_payload" in e.fix
    assert 2 not in e.delivered and {0, 1} <= e.delivered
    assert stored(server, "big")[:2] == [sent[0].value, sent[1].value]


def test_a_subject_held_by_another_stream_than_the_expected_one_is_not_retried(server):
    run_batch(dest(server, subject="orders.changes", stream="orders"), workload(1, 1))
    with pytest.raises(SinkError) as err:
        run_batch(dest(server, subject="orders.changes", stream="elsewhere", create_stream=False),
                  workload(1, 1))  # fmt: skip
    e = err.value
    assert not e.retryable and "JetStream refused a message on 'orders.changes'" in e.problem
    assert "expected stream does not match" in e.problem
    assert e.fix == "check destination.stream against the stream that holds the subject"
