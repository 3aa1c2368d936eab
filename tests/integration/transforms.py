"""Python transforms for tests (`transform: "tests.integration.transforms:shape"`)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any


def shape(message: dict[str, Any]) -> dict[str, Any]:
    """The item id, the action and the table, from a sequin message."""
    return {
        "item": message["record"]["id"],
        "op": message["action"],
        "table": message["metadata"]["table_name"],
    }


def poison_marker(table: str) -> Path:
    """While this file exists, `explode_on_7` raises for rows with n = 7 of `table`."""
    return Path(tempfile.gettempdir()) / f"walstream-poison-{table}"


def explode_on_7(message: dict[str, Any]) -> dict[str, Any]:
    """The row's id and n; raises for n = 7 while the table's poison marker exists."""
    record = message["record"]
    if record["n"] == 7 and poison_marker(message["metadata"]["table_name"]).exists():
        raise ValueError(f"cannot shape row {record['id']} with n = 7")
    return {"id": record["id"], "n": record["n"]}
