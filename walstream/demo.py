"""The embedded demo: a private Postgres, a sample table, its changes decoded to a JSON-lines file."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from walstream.change import ChangeRow, format_lsn
from walstream.postgres.decoder import ChangeDecoder
from walstream.postgres.embedded import EmbeddedPostgres, server_home
from walstream.postgres.replication import (
    connect,
    ensure_publication,
    ensure_slot,
    read_messages,
)
from walstream.postgres.setup import Finding, check_database
from walstream.postgres.types import TypeRegistry, load_types

DEMO_DB = "walstream_demo"
SLOT = "walstream_demo"
PUBLICATION = "walstream_demo"

WORKLOAD = """
CREATE TABLE IF NOT EXISTS public.orders (
    id bigint PRIMARY KEY, customer text NOT NULL, amount numeric(12,2), status text,
    tags text[], details jsonb, placed_at timestamptz DEFAULT now());
ALTER TABLE public.orders REPLICA IDENTITY FULL;
"""


@dataclass
class DemoResult:
    findings: list[Finding]
    changes: list[ChangeRow]
    output: Path
    dsn: str


def run_demo(home: Path, progress: Callable[[str], None] = print) -> DemoResult:
    """Start (or reuse) the embedded server under `home`, make changes, decode them to a file."""
    home.mkdir(parents=True, exist_ok=True)
    pg = EmbeddedPostgres(base_dir=server_home(home / "postgres"))
    progress(f"starting embedded PostgreSQL ({pg.version()}) in {pg.base}")
    with pg:
        admin = connect(pg.dsn(), autocommit=True)
        with admin:
            if not admin.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (DEMO_DB,)
            ).fetchone():
                admin.execute(f"CREATE DATABASE {DEMO_DB}")
        dsn = pg.dsn(DEMO_DB)
        with connect(dsn, autocommit=True) as conn:
            conn.execute(WORKLOAD)
            ensure_publication(conn, PUBLICATION, ["public.orders"])
            ensure_slot(conn, SLOT)
            findings = check_database(dsn, SLOT, PUBLICATION, ["public.orders"])
            progress("making changes: 3 inserts, 1 update, 1 delete, 1 truncate")
            base = int(conn.execute("SELECT coalesce(max(id), 0) FROM orders").fetchone()[0])  # type: ignore[index]
            with conn.transaction():
                conn.execute(
                    "SELECT pg_logical_emit_message(true, 'walstream:annotations', %s)",
                    (json.dumps({"username": "demo", "reason": "walstream demo"}),),
                )
                for i in range(1, 4):
                    conn.execute(
                        "INSERT INTO orders (id, customer, amount, status, tags, details) "
                        "VALUES (%s, %s, %s, 'new', %s, %s)",
                        (base + i, f"customer-{i}", f"{i * 10}.50", ["demo", f"n{i}"],
                         json.dumps({"items": i, "gift": i % 2 == 0})),
                    )  # fmt: skip
            conn.execute("UPDATE orders SET status = 'paid' WHERE id = %s", (base + 1,))
            conn.execute("DELETE FROM orders WHERE id = %s", (base + 2,))
            conn.execute("TRUNCATE orders")
            mark = conn.execute("SELECT pg_logical_emit_message(true, 'walstream:mark', '')::text")
            until = _lsn(mark.fetchone()[0])  # type: ignore[index]
            oids = [r[0] for r in conn.execute(
                "SELECT atttypid::int8 FROM pg_attribute WHERE attrelid = 'public.orders'::regclass AND attnum > 0"
            )]  # fmt: skip
            types = TypeRegistry(load_types(conn, oids))
        decoder = ChangeDecoder("demo", types, primary_keys={("public", "orders"): ["id"]})
        changes: list[ChangeRow] = []
        for msg in read_messages(dsn, SLOT, PUBLICATION, until_lsn=until):
            changes.extend(decoder.decode(msg.payload))
        with connect(dsn, autocommit=True) as conn:
            # The demo re-reads from the start next time only what it has not confirmed.
            conn.execute(
                "SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (SLOT, format_lsn(until))
            )
    output = home / "demo" / "changes.jsonl"
    output.parent.mkdir(parents=True, exist_ok=True)
    with output.open("w") as f:
        for c in changes:
            f.write(json.dumps(row_to_json(c)) + "\n")
    return DemoResult(findings, changes, output, dsn)


def row_to_json(c: ChangeRow) -> dict[str, object]:
    return {
        "source": c.source,
        "lsn": format_lsn(c.lsn),
        "seq": c.seq,
        "idempotency_key": c.cursor.idempotency_key,
        "xid": c.xid,
        "committed_at": c.committed_at.isoformat(),
        "action": c.action,
        "schema": c.schema,
        "table": c.table,
        "pk": c.pk,
        "record": json.loads(c.record) if c.record else None,
        "old": json.loads(c.old) if c.old else None,
        "annotations": json.loads(c.annotations) if c.annotations else None,
        "unchanged_toast": c.unchanged_toast,
    }


def _lsn(text: str) -> int:
    from walstream.change import parse_lsn

    return parse_lsn(text)
