"""`walstream status`: what a running walstream reports at /health."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from walstream.cli.output import STYLE, console, err_console


def status(
    config: Annotated[
        Path,
        typer.Option(
            "--config", "-c", envvar="WALSTREAM_CONFIG", help="The walstream.yaml of the run."
        ),
    ] = Path("walstream.yaml"),
    url: Annotated[
        str | None,
        typer.Option(help="The server's address (default: server.host and server.port)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print /health's JSON as it is.")] = False,
) -> None:
    """What a running `walstream run` reports at /health: each source and sink, its
    status (ok, warning, error, paused, standby) and why, and over all of them whether
    walstream is healthy, degraded (a warning, a paused sink) or unhealthy (an error).
    Exits 1 when unhealthy, 2 when the server cannot be reached."""
    import json

    import httpx

    if url is None:
        from walstream.config import load_config

        server = load_config(config).server
        host = "127.0.0.1" if server.host in ("0.0.0.0", "::") else server.host
        url = f"http://{host}:{server.port}"
    try:
        r = httpx.get(f"{url.rstrip('/')}/health", timeout=10)
        data = r.json()
    except (httpx.HTTPError, ValueError) as exc:
        err_console.print(
            f"[bold red]error:[/] cannot read {escape(url)}/health: {escape(str(exc))}"
        )
        err_console.print(
            "[yellow]fix:[/] start `walstream run` with this config (it serves /health on "
            "server.port, 8376 by default), or pass --url"
        )
        raise typer.Exit(2) from None
    if as_json:
        console.print_json(json.dumps(data))
    else:
        _print_health(data, url)
    if data["status"] == "error":
        raise typer.Exit(1)


def _print_health(data: dict[str, Any], url: str) -> None:
    """/health's answer as two tables, sources and sinks."""

    def badge(s: str) -> str:
        return f"[{STYLE.get(s, 'white')}]{s}[/]"

    health = data.get("health", data["status"])
    up = data.get("uptime_seconds")
    console.print(
        f"walstream {escape(str(data.get('version', '')))} at {escape(url)}: "
        f"{badge(health)} ({data['status']}" + (f", up {_seconds(up)})" if up is not None else ")")
    )
    t = Table(title="sources", title_justify="left")
    for col in (
        "source",
        "status",
        "role",
        "slot lag",
        "WAL kept",
        "last report",
        "ingested",
        "why",
    ):
        t.add_column(col)
    for src in data["sources"]:
        t.add_row(
            escape(src["name"]),
            badge(src["status"]),
            src["role"],
            _bytes(src["lag_bytes"]),
            _bytes(src["retained_wal_bytes"]),
            _seconds(src["last_report_age_seconds"]),
            f"{src['ingested']:,}",
            escape("; ".join(src["reasons"])),
        )
    console.print(t)
    t = Table(title="sinks", title_justify="left")
    for col in (
        "sink",
        "type",
        "status",
        "delivered",
        "rate/s",
        "parked",
        "dead letters",
        "why",
    ):
        t.add_column(col)
    for k in data["sinks"]:
        t.add_row(
            escape(k["name"]),
            k["type"],
            badge(k["status"]),
            f"{k['delivered']:,}",
            f"{k['rate_per_second']:,.0f}",
            f"{k['parked']:,}",
            f"{k['dead_letters']:,}",
            escape("; ".join(k["reasons"])),
        )
    console.print(t)


def _bytes(n: int | None) -> str:
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:,.0f} {unit}" if unit == "B" else f"{size:,.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _seconds(s: float | None) -> str:
    return "-" if s is None else f"{s:.1f}s"


def register(app: typer.Typer) -> None:
    app.command()(status)
