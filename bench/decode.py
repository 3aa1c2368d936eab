"""Decoder throughput vs. raw pgoutput receive rate on the same slot data.

    .venv/bin/python -m bench.decode [--rows 1000000] [--txn-size 1000]

Starts a private PostgreSQL, writes ROWS inserts (plus a share of updates and
deletes) into a typical table, then
  1. receives the slot's pgoutput stream as fast as psycopg2 can (raw receive),
  2. decodes the same messages into canonical change rows on one core.
Prints both rates and their ratio; the target is decode ≥ 1.0× receive.
"""

from __future__ import annotations

import argparse
import gc
import resource
import subprocess
import time

from bench.results import figure
from walstream.change import format_lsn, parse_lsn
from walstream.decode.catalog import load_metadata
from walstream.decode.decoder import ChangeDecoder
from walstream.postgres.embedded import EmbeddedPostgres
from walstream.postgres.replication import connect

TABLE = """
CREATE TABLE orders (
    id bigint PRIMARY KEY, customer text NOT NULL, amount numeric(12,2), status text,
    paid boolean, placed_at timestamptz, details jsonb, tags text[]);
"""


def workload(conn, rows: int, txn_size: int) -> None:
    done = 0
    while done < rows:
        n = min(txn_size, rows - done)
        conn.execute(
            """INSERT INTO orders
               SELECT g, 'customer-' || (g %% 977), (g %% 10000) / 100.0, 'new', g %% 2 = 0,
                      '2024-01-01'::timestamptz + g * interval '1 second',
                      jsonb_build_object('items', g %% 7, 'note', 'n' || g), ARRAY['a', 'b' || (g %% 5)]
               FROM generate_series(%s::bigint, %s::bigint) g""",
            (done + 1, done + n),
        )
        done += n
    # a tenth as updates and deletes, so every message kind is in the mix
    conn.execute("UPDATE orders SET status = 'paid' WHERE id % 20 = 0")
    conn.execute("DELETE FROM orders WHERE id % 20 = 10")


def receive(dsn: str, slot: str, pub: str, until: int) -> tuple[float, list[bytes]]:
    """The leanest psycopg2 receive loop: read_message and keep the payload, nothing else."""
    import select

    from walstream.capture.stream import replication_connection, start_options

    payloads: list[bytes] = []
    append = payloads.append
    conn = replication_connection(dsn)
    cur = conn.cursor()
    t0 = time.perf_counter()
    cur.start_replication(slot_name=slot, decode=False, options=start_options(pub))
    read = cur.read_message
    while True:
        msg = read()
        if msg is None:
            select.select([cur], [], [], 1.0)
            continue
        p = msg.payload
        append(p)
        if p[:1] == b"C" and int.from_bytes(p[-16:-8], "big") >= until:
            break
    secs = time.perf_counter() - t0
    conn.close()
    return secs, payloads


def recvlogical(pg: EmbeddedPostgres, slot: str, pub: str, until: int) -> float | None:
    """pg_recvlogical (C) writing the same stream to /dev/null: what Postgres can send."""
    exe = pg.bin / "pg_recvlogical"
    if not exe.exists():
        return None
    # pg_recvlogical confirms what it wrote: give it a copy of the slot each time.
    copy = f"{slot}_copy"
    with connect(pg.dsn(), autocommit=True) as conn:
        conn.execute("SELECT pg_copy_logical_replication_slot(%s, %s)", (slot, copy))
    slot = copy
    t0 = time.perf_counter()
    subprocess.run(
        [
            str(exe), "-d", pg.dsn(), "-S", slot, "--start", "-f", "/dev/null",
            "-o", "proto_version=1", "-o", f"publication_names={pub}", "-o", "messages=true",
            "-E", format_lsn(until), "--no-loop",
        ],
        check=True, capture_output=True,
    )  # fmt: skip
    secs = time.perf_counter() - t0
    with connect(pg.dsn(), autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (copy,))
    return secs


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--txn-size", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3, help="best of N for each measurement")
    args = ap.parse_args()

    with EmbeddedPostgres(settings={"fsync": "off", "synchronous_commit": "off"}) as pg:
        dsn = pg.dsn()
        with connect(dsn, autocommit=True) as conn:
            conn.execute(TABLE)
            conn.execute("CREATE PUBLICATION bench FOR TABLE orders")
            conn.execute("SELECT pg_create_logical_replication_slot('bench', 'pgoutput')")
            t0 = time.perf_counter()
            workload(conn, args.rows, args.txn_size)
            row = conn.execute(
                "SELECT pg_logical_emit_message(true, 'bench:end', '')::text"
            ).fetchone()
            until = parse_lsn(row[0])  # type: ignore[index]
            print(
                f"workload: {args.rows:,} inserts + updates/deletes in {time.perf_counter() - t0:.1f}s"
            )
            meta = load_metadata(conn)

        best_rx = float("inf")
        payloads: list[bytes] = []
        for _ in range(args.repeat):
            secs, payloads = receive(dsn, "bench", "bench", until)
            best_rx = min(best_rx, secs)
        best_c = min(
            (
                s
                for s in (recvlogical(pg, "bench", "bench", until) for _ in range(args.repeat))
                if s
            ),
            default=None,
        )
        changes = sum(1 for p in payloads if p[:1] in b"IUDT")
        print(
            f"messages: {len(payloads):,} ({changes:,} changes), {sum(map(len, payloads)) / 1e6:.0f} MB"
        )

        best_dec = float("inf")
        decoded = 0
        for _ in range(args.repeat):
            decoder = ChangeDecoder("bench", meta.types, meta.primary_keys)
            gc.collect()
            gc.disable()
            t0 = time.perf_counter()
            decoded = 0
            for p in payloads:
                decoded += len(decoder.decode(p))
            best_dec = min(best_dec, time.perf_counter() - t0)
            gc.enable()
        assert decoded == changes, (decoded, changes)

    rx_rate = changes / best_rx
    dec_rate = changes / best_dec
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print()
    print(f"{'figure':<38}{'changes/s':>12}")
    if best_c:
        print(f"{'pg_recvlogical to /dev/null (C)':<38}{changes / best_c:>12,.0f}")
    print(f"{'raw pgoutput receive (psycopg2)':<38}{rx_rate:>12,.0f}")
    print(f"{'decode to canonical rows (1 core)':<38}{dec_rate:>12,.0f}")
    print(f"{'ratio decode / receive':<38}{dec_rate / rx_rate:>12.2f}x")
    print(f"{'peak RSS of this process':<38}{peak_mb:>10,.0f} MB")
    figure("decode", "raw pgoutput receive, psycopg2 (changes/s)", rx_rate, "/s",
           reference="pg_recvlogical to /dev/null" if best_c else None,
           reference_value=changes / best_c if best_c else None)  # fmt: skip
    figure("decode", "decode to canonical rows, 1 core (changes/s)", dec_rate, "/s",
           reference="raw pgoutput receive", reference_value=rx_rate, target=">= 1.0x")  # fmt: skip
    figure("decode", "peak RSS of the decoding process", peak_mb, "MB")


if __name__ == "__main__":
    main()
