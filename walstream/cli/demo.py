"""The embedded demo: `walstream run` on a private Postgres with a steady sample workload.

It starts (or reuses) a PostgreSQL server under HOME/postgres, creates the database
`walstream_demo` with `public.orders`, writes HOME/demo/walstream.yaml (one source,
one file sink), and runs the same runtime as `walstream run` while a background
writer inserts, updates and deletes orders at a steady rate. When the time is up the
writer stops, the runtime delivers what is left, and the demo checks that every
change it made arrived exactly once.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.markup import escape

from walstream.cli.output import console
from walstream.cli.progress import log_progress, progress_table
from walstream.config import Plan, parse_config
from walstream.postgres.embedded import EmbeddedPostgres, server_home
from walstream.postgres.replication import connect

DEMO_DB = "walstream_demo"
SCHEMA = """
CREATE TABLE IF NOT EXISTS public.orders (
    id bigint PRIMARY KEY, customer text NOT NULL, amount numeric(12,2), status text,
    tags text[], details jsonb, placed_at timestamptz DEFAULT now());
ALTER TABLE public.orders REPLICA IDENTITY FULL;
"""
STATUSES = ("new", "paid", "packed", "shipped")


@dataclass
class Workload:
    """Orders placed, moved through their statuses and sometimes cancelled, at `rate`/s."""

    dsn: str
    rate: float
    written: int = 0
    error: BaseException | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def start(self) -> Workload:
        self.thread = threading.Thread(target=self._run, name="demo-workload", daemon=True)
        self.thread.start()
        return self

    def finish(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(30)
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        rnd = random.Random()
        try:
            with connect(self.dsn, autocommit=True) as conn:
                row = conn.execute("SELECT coalesce(max(id), 0) FROM orders").fetchone()
                next_id = int(row[0]) + 1 if row else 1
                open_orders = [
                    int(r[0])
                    for r in conn.execute("SELECT id FROM orders WHERE status <> 'shipped'")
                ]
                t0 = time.monotonic()
                while not self.stop.is_set():
                    with conn.transaction():
                        if rnd.random() < 0.1:
                            conn.execute(
                                "SELECT pg_logical_emit_message(true, 'walstream:annotations', %s)",
                                (json.dumps({"username": "demo", "reason": "bulk order"}),),
                            )
                        for _ in range(rnd.choice((1, 1, 2, 5))):
                            self._change(conn, rnd, open_orders, next_id)
                            if open_orders and open_orders[-1] == next_id:
                                next_id += 1
                            self.written += 1
                    ahead = self.written / self.rate - (time.monotonic() - t0)
                    if ahead > 0:
                        self.stop.wait(ahead)
        except BaseException as exc:  # reported by finish()
            self.error = exc

    @staticmethod
    def _change(conn: Any, rnd: random.Random, open_orders: list[int], next_id: int) -> None:
        roll = rnd.random()
        if not open_orders or roll < 0.4:
            conn.execute(
                "INSERT INTO orders (id, customer, amount, status, tags, details) "
                "VALUES (%s, %s, %s, 'new', %s, %s)",
                (
                    next_id,
                    f"customer-{rnd.randrange(50)}",
                    f"{rnd.randrange(1, 500)}.{rnd.randrange(100):02d}",
                    ["demo", rnd.choice(("web", "app", "store"))],
                    json.dumps({"items": rnd.randrange(1, 6), "gift": rnd.random() < 0.2}),
                ),
            )
            open_orders.append(next_id)
        elif roll < 0.9:
            order = rnd.choice(open_orders)
            status = conn.execute(
                "UPDATE orders SET status = CASE status WHEN 'new' THEN 'paid' "
                "WHEN 'paid' THEN 'packed' ELSE 'shipped' END WHERE id = %s RETURNING status",
                (order,),
            ).fetchone()
            if status and status[0] == "shipped":
                open_orders.remove(order)
        else:
            order = open_orders.pop(rnd.randrange(len(open_orders)))
            conn.execute("DELETE FROM orders WHERE id = %s", (order,))


@dataclass
class DemoResult:
    config_path: Path
    output: Path
    written: int  # changes made in this run
    delivered: int  # messages delivered in this run
    total_files_messages: int  # messages in the output directory (all runs)
    sample: str | None


def prepare_demo(home: Path, pg: EmbeddedPostgres) -> tuple[Plan, Path]:
    """The demo database and HOME/demo/walstream.yaml (written once, then reused)."""
    with connect(pg.dsn(), autocommit=True) as admin:
        if not admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DEMO_DB,)).fetchone():
            admin.execute(f"CREATE DATABASE {DEMO_DB}")
    dsn = pg.dsn(DEMO_DB)
    with connect(dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)
    demo = (home / "demo").absolute()  # the written config works from any directory
    demo.mkdir(parents=True, exist_ok=True)
    raw = {
        "spark": {"master": "local[*]", "checkpoint_dir": str(demo / "checkpoints")},
        "sources": [
            {"name": "demo", "dsn": dsn, "tables": ["public.orders"], "heartbeat_interval": "2s"}
        ],
        "sinks": [
            {
                "name": "orders-to-files",
                "source": "demo",
                "format": "sequin",
                "destination": {"type": "file", "path": str(demo / "out")},
            }
        ],
    }
    path = demo / "walstream.yaml"
    path.write_text(
        "# Written by `walstream demo`: the embedded server's database into JSON-lines files.\n"
        f"# Run it yourself with: {command()} run -c {path}\n" + yaml.safe_dump(raw)
    )
    return parse_config(raw, str(path)), path


def command() -> str:
    """How to run this walstream again, as typed: `walstream` when that is this one on the
    PATH, else the checkout's `bin/walstream` (relative to here when it is below), else
    this program's full path (`.venv/bin/walstream` is not on a fresh PATH)."""
    me = Path(sys.argv[0]).resolve()
    found = shutil.which("walstream")
    if found and Path(found).resolve() == me:
        return "walstream"
    script = Path(__file__).resolve().parents[1] / "bin" / "walstream"
    if script.exists():
        relative = os.path.relpath(script)
        return relative if not relative.startswith("..") else str(script)
    return str(me) if me.name == "walstream" else f"{sys.executable} -m walstream.cli"


def run_demo(
    home: Path,
    seconds: float = 60.0,
    rate: float = 200.0,
    progress: Callable[[str], None] = print,
    on_tick: Callable[[Any], None] | None = None,
    spark: Any = None,
    stop: threading.Event | None = None,
) -> DemoResult:
    """Run the demo for `seconds` (0: until `stop` is set); see the module docstring.

    Setting `stop` ends the writing early; the runtime's `abandon` skips the final drain.
    """
    from walstream.runtime import Runtime

    home.mkdir(parents=True, exist_ok=True)
    pg = EmbeddedPostgres(base_dir=server_home(home / "postgres"))
    progress(f"starting embedded PostgreSQL ({pg.version()}) in {pg.base}")
    with pg:
        cfg, path = prepare_demo(home, pg)
        out = Path(cfg.sinks[0].destination.path)  # type: ignore[attr-defined]
        progress(f"config: {path}")
        progress(f"starting Spark ({cfg.spark.master}) and the stream into {out}")
        runtime = Runtime(cfg, spark=spark)
        if on_tick is not None:
            on_tick(runtime)
        runtime.start()
        workload = Workload(cfg.sources[0].dsn.get_secret_value(), rate).start()
        progress(
            f"writing about {rate:g} changes/s to public.orders"
            + (f" for {seconds:g}s" if seconds else " until Ctrl-C")
        )
        sink = cfg.sinks[0].name

        def delivered() -> int:
            p = runtime.progress().get(sink)
            return 0 if p is None else p.delivered + p.skipped

        try:
            runtime.supervise(time.monotonic() + seconds if seconds else None, on_tick, 0.5, stop)
            workload.finish()
            progress(f"stopped writing after {workload.written:,} changes; delivering the rest")
            drain = time.monotonic() + 120
            while (
                delivered() < workload.written
                and time.monotonic() < drain
                and runtime.fatal is None
                and not runtime.abandon.is_set()
            ):
                runtime.supervise(time.monotonic() + 0.5, on_tick, 0.5)
            if runtime.fatal is not None:
                raise runtime.fatal
        finally:
            workload.stop.set()
            runtime.stop()
        messages = cfg.sinks[0].destination.read_back()
        return DemoResult(
            path,
            out,
            workload.written,
            delivered(),
            len(messages),
            messages[-1].decode() if messages else None,
        )


def demo(
    home: Annotated[
        Path, typer.Option(help="Where the demo keeps its embedded server, config and output.")
    ] = Path(".walstream"),
    seconds: Annotated[
        float, typer.Option(help="How long to write changes; 0 runs until Ctrl-C.")
    ] = 60.0,
    rate: Annotated[
        float, typer.Option(help="Changes per second the sample writer makes.")
    ] = 200.0,
) -> None:
    """Run walstream on its embedded default: a private Postgres, a live workload, files.

    Starts a PostgreSQL server of its own (initdb under HOME/postgres on first use, a
    free loopback port), creates the database walstream_demo with public.orders, writes
    HOME/demo/walstream.yaml and runs `walstream run` on it with Spark local[*] while a
    sample writer changes orders at RATE per second. The changes arrive as sequin
    messages in HOME/demo/out. At the end it checks that every change arrived once.
    Ctrl-C stops writing early; a second Ctrl-C stops at once. Nothing outside HOME is
    touched; a second run continues where the first stopped.
    """
    import signal
    import threading

    from rich.live import Live

    stop = threading.Event()
    state: dict[str, object] = {}

    def on_signal(*_: object) -> None:
        rt = state.get("runtime")
        if stop.is_set() and rt is not None:
            rt.abandon.set()  # type: ignore[attr-defined]
            rt.stopping.set()  # type: ignore[attr-defined]
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    live: Live | None = None

    def on_tick(runtime: object) -> None:
        state["runtime"] = runtime
        if live is not None:
            live.update(progress_table(runtime))
        elif getattr(runtime, "queries", None):
            log_progress(runtime)

    say = lambda s: console.print(f"[dim]•[/] {escape(s)}")  # noqa: E731
    if console.is_interactive:
        live = Live(console=console, refresh_per_second=2, transient=False)
    try:
        if live is not None:
            say("Ctrl-C stops writing early; a second Ctrl-C stops at once")
            live.start()
        result = run_demo(home, seconds, rate, progress=say, on_tick=on_tick, stop=stop)
    finally:
        if live is not None:
            live.stop()
    # >=: changes left undelivered by an earlier, abandoned run arrive in this one
    ok = result.delivered >= result.written
    console.print(
        f"{'[green]ok[/]' if ok else '[bold red]incomplete[/]'}: {result.written:,} changes "
        f"written, {result.delivered:,} delivered this run; {result.total_files_messages:,} "
        f"messages in {escape(str(result.output))}"
    )
    if result.sample:
        console.print("the last message:")
        console.print_json(result.sample)
    console.print(
        f"next: `{escape(command())} run -c {escape(str(result.config_path))}` streams the same "
        "database; copy that file, set the source dsn to your database and add a Kafka sink "
        "(docs/configuration.md)."
    )
    if not ok:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command()(demo)
