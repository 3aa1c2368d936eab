"""The streaming-replication connection (psycopg2): opening it, pgoutput's options, and
reading what it holds in bursts. The capture thread (`reader.py`) is the production reader;
`read_messages` is a simple synchronous one for tools, tests and benchmarks."""

from __future__ import annotations

import select
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from walstream.decode.types import session_options
from walstream.errors import ConnectionFailed
from walstream.postgres.replication import safe_dsn


def replication_connection(dsn: str, extra_options: str = "") -> Any:
    """A psycopg2 LogicalReplicationConnection with walstream's session settings."""
    import psycopg2
    import psycopg2.extras

    try:
        return psycopg2.connect(
            dsn,
            connection_factory=psycopg2.extras.LogicalReplicationConnection,
            options=(session_options() + " " + extra_options).strip(),
        )
    except psycopg2.OperationalError as exc:
        raise ConnectionFailed(
            f"cannot open a replication connection to {safe_dsn(dsn)}: {str(exc).strip()}",
            "the role needs the REPLICATION attribute (ALTER ROLE ... WITH REPLICATION) and "
            "pg_hba.conf must allow it; wal_level must be logical",
        ) from exc


def max_protocol_version(version_num: int) -> int:
    """The newest pgoutput protocol this server speaks (4 needs 16+, 3 needs 15+)."""
    if version_num >= 160000:
        return 4
    if version_num >= 150000:
        return 3
    return 2 if version_num >= 140000 else 1


def start_options(
    publication: str, proto_version: int = 1, streaming: bool | str = False
) -> dict[str, str]:
    """pgoutput's options; `streaming`: True ("on") or "parallel" (protocol 4, 16+: Stream
    Abort then carries the abort's LSN and time) sends big transactions before they commit."""
    opts = {
        "proto_version": str(proto_version),
        "publication_names": publication,
        "messages": "true",
    }
    if streaming:
        opts["streaming"] = streaming if isinstance(streaming, str) else "on"
    return opts


@dataclass(frozen=True, slots=True)
class RawMessage:
    data_start: int
    wal_end: int
    payload: bytes


def read_messages(
    dsn: str,
    slot: str,
    publication: str,
    *,
    until_lsn: int,
    proto_version: int = 1,
    streaming: bool | str = False,
    extra_options: str = "",
    timeout: float = 60.0,
) -> Iterator[RawMessage]:
    """Read raw pgoutput messages from a slot until a Commit whose end reaches `until_lsn`.

    A simple synchronous reader for tools, tests and benchmarks; the Spark
    source's capture thread is the production reader. It confirms nothing.
    """
    conn = replication_connection(dsn, extra_options)
    try:
        cur = conn.cursor()
        cur.start_replication(
            slot_name=slot,
            decode=False,
            options=start_options(publication, proto_version, streaming),
        )
        deadline = time.monotonic() + timeout
        while True:
            msg = cur.read_message()
            if msg is None:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"slot {slot} did not reach LSN {until_lsn:X} within {timeout}s"
                    )
                select.select([cur], [], [], 1.0)
                continue
            payload = msg.payload
            yield RawMessage(msg.data_start, msg.wal_end, payload)
            kind = payload[:1]
            if kind in (b"C", b"c") and int.from_bytes(payload[-16:-8], "big") >= until_lsn:
                return
    finally:
        conn.close()


#: At most this many messages, or about this many bytes, are read in one burst: the
#: capture checks its buffer's bound between bursts.
BURST = 1000
BURST_BYTES = 1 << 20
#: When a drained connection becomes readable, what arrives is left to gather this long
#: before it is read: reading each message as it arrived cost the capture thread (and
#: the walsender) a wake-up and a few system calls per message, half the capture's CPU
#: (docs/performance-log.md, "the capture reads in bursts"). A change's latency grows by as much.
COALESCE = 0.002


def read_burst(cur: Any) -> tuple[list[bytes], list[int], int]:
    """The messages a replication cursor holds now (up to BURST or BURST_BYTES; none:
    nothing arrived), each one's WAL position (its XLogData's start: a change's own
    record LSN) and the highest of them."""
    out: list[bytes] = []
    at: list[int] = []
    read = cur.read_message
    received = size = 0
    while len(out) < BURST and size < BURST_BYTES:
        msg = read()
        if msg is None:
            break
        start = msg.data_start
        received = max(received, start)
        at.append(start)
        payload = msg.payload
        size += len(payload)
        out.append(payload)
    return out, at, received


def wait_for_messages(cur: Any, timeout: float) -> None:
    """Wait up to `timeout` seconds for a drained replication cursor to become readable,
    then COALESCE seconds more (see there)."""
    if select.select([cur], [], [], timeout)[0]:
        time.sleep(COALESCE)
