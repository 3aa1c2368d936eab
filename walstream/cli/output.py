"""The consoles every command prints to, and the colours of a status."""

from rich.console import Console

console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)
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
