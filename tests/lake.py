"""Reading lake tables the way another engine would: DuckDB with its delta / iceberg extensions.

walstream writes with delta-rs and pyiceberg; these tests read with DuckDB (its own
Delta kernel and Iceberg reader, loaded offline from the extension wheels), and find
an Iceberg table's metadata file in the SQL catalog's table with plain SQL.
"""

from __future__ import annotations

import importlib
import json
import random
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg

from tests.servers import S3


def run_config(
    db: Any, tmp_path: Path, slot: str, pub: str, sinks: list[dict[str, Any]]
) -> dict[str, Any]:
    """A walstream.yaml (as data) of one source `app` and these sinks, server off."""
    return {
        "server": {"enabled": False},
        "spark": {"checkpoint_dir": str(tmp_path / "ckpt")},
        "sources": [{"name": "app", "dsn": db.dsn, "slot": slot, "publication": pub}],
        "sinks": sinks,
    }


@dataclass
class Place:
    """Where a test's lake tables are: under tmp_path on local disk, or under a prefix of
    the test S3 server's bucket (`s3`) named after tmp_path."""

    tmp_path: Path
    s3: S3 | None = None

    def root(self, sub: str) -> str:
        if self.s3 is None:
            return str(self.tmp_path / sub)
        return f"s3://{self.s3.bucket}/{self.tmp_path.name}/{sub}"

    def delta(self, table: str, sub: str = "d") -> str:
        """A Delta table's location."""
        return f"{self.root(sub)}/{table}"

    def delta_destination(self, sub: str = "d") -> dict[str, Any]:
        dest: dict[str, Any] = {"type": "delta", "path": self.delta("{table}", sub)}
        if self.s3 is not None:
            dest["storage_options"] = self.s3.delta
        return dest

    def iceberg_destination(self, namespace: str, sub: str = "w") -> dict[str, Any]:
        catalog: dict[str, Any] = {"warehouse": self.root(sub)}
        if self.s3 is not None:
            catalog["properties"] = self.s3.iceberg
        return {"type": "iceberg", "table": f"{namespace}.{{table}}", "catalog": catalog}

    def storage_options(self) -> dict[str, str] | None:
        return None if self.s3 is None else self.s3.delta

    def files(self, sub: str) -> list[str]:
        """The files under a folder of the place (relative to it), sorted."""
        if self.s3 is None:
            root = self.tmp_path / sub
            return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
        prefix = f"{self.tmp_path.name}/{sub}/"
        return [k.removeprefix(prefix) for k in self.s3.keys(prefix)]

    def read(self, sub: str, name: str) -> bytes:
        if self.s3 is None:
            return (self.tmp_path / sub / name).read_bytes()
        got = self.s3.client().get_object(
            Bucket=self.s3.bucket, Key=f"{self.tmp_path.name}/{sub}/{name}"
        )
        return bytes(got["Body"].read())


def race_to_create(store: Any, name: str, writers: int) -> int:
    """`writers` threads create `name` in a `storage.Store` at once; exactly one must win,
    and the file must hold what the winner wrote. The winner's number."""
    results: dict[int, bool] = {}
    start = threading.Barrier(writers)

    def race(i: int) -> None:
        start.wait()
        results[i] = store.create(name, f"writer {i}".encode())

    threads = [threading.Thread(target=race, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    (winner,) = [i for i, won in results.items() if won]
    assert store.read(name) == f"writer {winner}".encode()
    return winner


def lake_sink(
    db: Any, tmp_path: Path, kind: str, namespace: str, mode: str | None = None,
    place: Place | None = None, **extra: Any,
) -> Any:  # fmt: skip
    """A Delta (<place>/d/<table>) or Iceberg (`<namespace>.<table>` in <place>/w) sink
    named `lake`, in `mode` (None: the default), with `extra` destination settings, built
    from a config as `walstream run` does. `place`: local disk (tmp_path) by default."""
    from walstream.config import parse_config
    from walstream.sinks.registry import sink_for

    place = place or Place(tmp_path)
    dest = place.delta_destination() if kind == "delta" else place.iceberg_destination(namespace)
    if mode is not None:
        dest["mode"] = mode
    dest.update(extra)
    plan = parse_config(run_config(db, tmp_path, "s", "p", [
        {"name": "lake", "source": "app", "destination": dest},
    ]))  # fmt: skip
    return sink_for(plan.sink("lake").destination)


def duck(s3: S3 | None = None) -> Any:
    """A DuckDB connection with the delta and iceberg extensions loaded from their wheels
    (and httpfs with the test S3 server's credentials, given `s3`)."""
    import duckdb

    con = duckdb.connect()
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    for name in ("avro", "iceberg", "delta", "httpfs"):
        module = importlib.import_module(f"duckdb_extension_{name}")
        (path,) = Path(module.__file__).parent.glob("extensions/*/*.duckdb_extension")
        con.execute(f"LOAD '{path}'")
    con.execute("SET TimeZone = 'UTC'")
    if s3 is not None:
        con.execute(
            "CREATE SECRET test_s3 (TYPE s3, KEY_ID 'test-key-id', SECRET 'test-secret-key', "
            f"REGION 'us-east-1', ENDPOINT '127.0.0.1:{s3.service.port}', URL_STYLE 'path', "
            "USE_SSL false)"
        )
    return con


def rows_of(con: Any, query: str, *params: Any) -> list[dict[str, Any]]:
    cur = con.execute(query, list(params))
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def delta_rows(path: str | Path, s3: S3 | None = None) -> list[dict[str, Any]]:
    con = duck(s3)
    try:
        return rows_of(con, "SELECT * FROM delta_scan(?)", str(path))
    finally:
        con.close()


def iceberg_metadata(state_dsn: str, identifier: str, schema: str = "walstream") -> str | None:
    """The current metadata file of an Iceberg table, from the SQL catalog's own table."""
    namespace, table = identifier.rsplit(".", 1)
    with psycopg.connect(state_dsn) as conn:
        row = conn.execute(
            f'SELECT metadata_location FROM "{schema}".iceberg_tables '
            "WHERE table_namespace = %s AND table_name = %s",
            (namespace, table),
        ).fetchone()
    return None if row is None else str(row[0])


def iceberg_rows(state_dsn: str, identifier: str, s3: S3 | None = None) -> list[dict[str, Any]]:
    location = iceberg_metadata(state_dsn, identifier)
    assert location is not None, f"no Iceberg table {identifier} in the catalog"
    con = duck(s3)
    try:
        return rows_of(con, "SELECT * FROM iceberg_scan(?)", location.removeprefix("file://"))
    finally:
        con.close()


def norm(v: Any) -> Any:
    """One spelling of a value for comparing Postgres rows with lake rows."""
    if isinstance(v, UUID):
        return str(v)
    if isinstance(v, datetime) and v.tzinfo is not None:
        return v.astimezone(UTC)
    if isinstance(v, memoryview):
        return bytes(v)
    if isinstance(v, Decimal):
        return v.normalize()
    if isinstance(v, list):
        return [norm(x) for x in v]
    if isinstance(v, dict):
        return json.dumps(v, sort_keys=True)
    return v


def normalised(
    rows: list[dict[str, Any]], json_columns: tuple[str, ...] = ()
) -> list[tuple[Any, ...]]:
    """Rows as sorted tuples of normalised values (JSON text columns parsed; read a source's
    json columns as text, or a JSON null and a JSON string read like SQL NULL and text)."""
    out = []
    for r in rows:
        values = []
        for k in sorted(r):
            v = r[k]
            if k in json_columns and v is not None:
                # the JSON text parsed (a source read as Python values gives it parsed), and
                # told apart from SQL NULL: the JSON null is a value
                parsed = json.loads(v) if isinstance(v, str) else v
                v = "json:" + json.dumps(parsed, sort_keys=True, ensure_ascii=False)
            values.append((k, norm(v)))
        out.append(tuple(values))
    return sorted(out, key=repr)


def source_rows(dsn: str, table: str) -> list[dict[str, Any]]:
    with psycopg.connect(dsn) as conn:
        cur = conn.execute(f"SELECT * FROM {table}")
        names = [d.name for d in cur.description or ()]
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


# -- the kind of table users have ---------------------------------------------------------------
#: A composite key with a text part, a TOASTed text stored out of line (an update that leaves
#: it unchanged does not send it), an int array with NULL elements, jsonb holding strings,
#: numbers, `true` and the JSON null, an enum, a numeric and NULLs.
REAL_TABLE = """
CREATE TYPE mood AS ENUM ('ok', 'sad', 'très bien');
CREATE TABLE acct (
    region text NOT NULL, id int NOT NULL, big text, arr int[], doc jsonb, mood mood,
    price numeric(12,2), n int NOT NULL DEFAULT 0, at timestamptz,
    PRIMARY KEY (region, id)
);
ALTER TABLE acct ALTER COLUMN big SET STORAGE EXTERNAL;
"""
#: Its columns as a test reads them from the source: jsonb as its text (psycopg would turn
#: the JSON null into None, like SQL NULL).
REAL_SELECT = (
    "SELECT region, id, big, arr, doc::text AS doc, mood::text AS mood, price, n, at FROM acct"
)
REAL_JSON = ("doc",)
#: jsonb values as users have them: a JSON string that reads like a number or a boolean,
#: a number, true, the JSON null, SQL NULL, empty and nested containers, unicode.
DOCS = ('"text"', "null", None, '"123"', "123", '"true"', "true", "{}", "[]",
        '{"a": [1, null, "x"], "b": {"c": null}}', '"é\\n"',
        "-0.5e-3")  # fmt: skip
ARRS = ([1, None, 3], [], None, [None], [7])
MOODS = ("ok", "sad", "très bien", None)
REGIONS = ("eu", "us-east", "ap 1", "")


def big_text(k: int, v: int) -> str:
    """A value stored out of line (TOAST): ~6 kB, different per key and version."""
    return f"{k}:{v}:" + "x" * 6_000


def real_row(region: str, k: int, v: int = 0) -> tuple[Any, ...]:
    return (
        region, k, big_text(k, v), ARRS[k % len(ARRS)], DOCS[k % len(DOCS)],
        MOODS[k % len(MOODS)], None if k % 9 == 0 else f"{k}.{k % 100:02d}", v,
        None if k % 11 == 0 else datetime(2024, 1, 1, tzinfo=UTC),
    )  # fmt: skip


def fill_real(dsn: str, rows: int) -> list[tuple[str, int]]:
    """`rows` rows in acct; their keys."""
    keys = [(REGIONS[k % len(REGIONS)], k) for k in range(1, rows + 1)]
    copy = "COPY acct (region, id, big, arr, doc, mood, price, n, at) FROM STDIN"
    with psycopg.connect(dsn, autocommit=True) as conn, conn.cursor().copy(copy) as cp:
        for region, k in keys:
            cp.write_row(real_row(region, k))
    return keys


class RealWriter:
    """What applications do to such a table, at random, until stopped: updates that leave the
    TOASTed value unchanged (most of them), updates of it, primary-key changes (of the id and
    of the text part, the TOASTed value left unchanged), jsonb and array updates, deletes and
    inserts; a third of them several to a transaction."""

    def __init__(self, dsn: str, keys: list[tuple[str, int]], seed: int) -> None:
        self.dsn = dsn
        self.keys = list(keys)
        self.rng = random.Random(seed)
        self.next_id = 10_000_000 + seed * 1_000_000
        self.ops: dict[str, int] = {}
        self.replaced: list[tuple[str, int]] = []  # the old keys of key changes

    def step(self, conn: Any) -> None:
        rng = self.rng
        if not self.keys or rng.random() < 0.08:
            region, k = rng.choice(REGIONS), self.new_id()
            conn.execute("INSERT INTO acct VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                         real_row(region, k, 1))  # fmt: skip
            self.keys.append((region, k))
            self.count("insert")
            return
        i = rng.randrange(len(self.keys))
        region, k = self.keys[i]
        op = rng.random()
        where = "WHERE region = %s AND id = %s"
        if op < 0.45:
            conn.execute(f"UPDATE acct SET n = n + 1 {where}", (region, k))
            self.count("update, TOAST unchanged")
        elif op < 0.55:
            conn.execute(f"UPDATE acct SET big = %s, n = n + 1 {where}",
                         (big_text(k, rng.randrange(1000)), region, k))  # fmt: skip
            self.count("update of the TOASTed value")
        elif op < 0.65:
            new = self.new_id()
            conn.execute(f"UPDATE acct SET id = %s {where}", (new, region, k))
            self.replaced.append(self.keys[i])
            self.keys[i] = (region, new)
            self.count("key change")
        elif op < 0.70:
            other = rng.choice([r for r in REGIONS if r != region])
            new = self.new_id()
            conn.execute(f"UPDATE acct SET region = %s, id = %s {where}", (other, new, region, k))
            self.replaced.append(self.keys[i])
            self.keys[i] = (other, new)
            self.count("key change (text part)")
        elif op < 0.80:
            conn.execute(f"UPDATE acct SET doc = %s, arr = %s {where}",
                         (rng.choice(DOCS), rng.choice(ARRS), region, k))  # fmt: skip
            self.count("jsonb and array update")
        else:
            conn.execute(f"DELETE FROM acct {where}", (region, k))
            self.keys.pop(i)
            self.count("delete")

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def count(self, op: str) -> None:
        self.ops[op] = self.ops.get(op, 0) + 1

    def run(self, stop: threading.Event, pace: float = 0.003) -> None:
        """Write until `stop`, a transaction at a time (a third hold several changes)."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not stop.is_set():
                with conn.transaction():
                    for _ in range(self.rng.choice((1, 1, 4))):
                        self.step(conn)
                time.sleep(pace)  # pacing: a steady write load, not a flood the test must drain

    def write(self, transactions: int) -> None:
        """A fixed number of transactions, as fast as they go."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            for _ in range(transactions):
                with conn.transaction():
                    for _ in range(self.rng.choice((1, 1, 4))):
                        self.step(conn)


def real_source(dsn: str) -> list[tuple[Any, ...]]:
    """The source table, normalised for comparing with a lake table."""
    with psycopg.connect(dsn) as conn:
        cur = conn.execute(REAL_SELECT)
        names = [d.name for d in cur.description or ()]
        rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
    return normalised(rows, REAL_JSON)


def current_versions(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A history table's current rows without its version columns."""
    meta = ("_op", "_lsn", "_seq", "valid_from", "valid_to", "is_current")
    return [{k: v for k, v in r.items() if k not in meta} for r in rows if r["is_current"]]


def differences(
    got: list[tuple[Any, ...]], want: list[tuple[Any, ...]], key: tuple[str, ...]
) -> str:
    """What differs between two `normalised` row lists, by key: rows missing, extra, and the
    columns whose values differ (values cut short); empty when they are equal."""

    def by_key(rows: list[tuple[Any, ...]]) -> dict[Any, dict[str, Any]]:
        return {tuple(dict(r)[k] for k in key): dict(r) for r in rows}

    g, w = by_key(got), by_key(want)
    out = [f"missing {k}" for k in w.keys() - g.keys()]
    out += [f"extra {k}: {str(g[k])[:200]}" for k in g.keys() - w.keys()]
    for k in w.keys() & g.keys():
        diff = {
            c: (str(g[k].get(c))[:60], str(v)[:60]) for c, v in w[k].items() if g[k].get(c) != v
        }
        if diff:
            out.append(f"differs {k}: {diff} (lake, source)")
    if not out and len(got) != len(want):
        out.append(f"{len(got)} rows, {len(want)} in the source (a key twice)")
    return "\n".join(sorted(out)[:40]) + (f"\n... {len(out)} in all" if len(out) > 40 else "")


#: The modes a lake sink has, and the real table's key.
MODES = ("mirror", "history", "changelog")
REAL_KEY = ("region", "id")


def every_mode_sinks(tmp_path: Path) -> list[dict[str, Any]]:
    """A Delta and an Iceberg sink of source `app` in each mode: `delta-<mode>` under
    tmp_path/d-<mode>, `iceberg-<mode>` as `<mode>.<table>` in the warehouse tmp_path/w."""
    out: list[dict[str, Any]] = []
    for mode in MODES:
        out.append(
            {
                "name": f"delta-{mode}",
                "source": "app",
                "destination": {
                    "type": "delta",
                    "mode": mode,
                    "path": str(tmp_path / f"d-{mode}" / "{table}"),
                },
            }
        )
        out.append({"name": f"iceberg-{mode}", "source": "app", "destination": {
            "type": "iceberg", "mode": mode, "table": f"{mode}.{{table}}",
            "catalog": {"warehouse": str(tmp_path / "w")}}})  # fmt: skip
    return out


def every_mode_rows(state_dsn: str, tmp_path: Path, fmt: str, mode: str, table: str) -> list[Any]:
    """The rows of one of `every_mode_sinks`' tables, read with DuckDB."""
    if fmt == "delta":
        return delta_rows(tmp_path / f"d-{mode}" / table)
    return iceberg_rows(state_dsn, f"{mode}.{table}")
