"""The consoles every command prints to, and the colours of a status."""

from typing import Any

from rich.console import Console

console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)


def print_error(exc: Any) -> None:
    """A WalstreamError's problem and fix on stderr, as every command prints one."""
    from rich.markup import escape

    err_console.print(f"[bold red]error:[/] {escape(exc.problem)}")
    if exc.fix:
        err_console.print(f"[yellow]fix:[/] {escape(exc.fix)}")


#: A check's level, or a source's or sink's status.
STYLE = {
    "ok": "green",
    "warning": "yellow",
    "error": "bold red",
    "paused": "blue",
    "standby": "dim",
    "healthy": "green",
    "degraded": "yellow",
    "unhealthy": "bold red",
}
