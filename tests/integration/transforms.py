"""A Python transform for tests (`transform: "tests.integration.transforms:shape"`)."""

from __future__ import annotations

from typing import Any


def shape(message: dict[str, Any]) -> dict[str, Any]:
    """The item id, the action and the table, from a sequin message."""
    return {
        "item": message["record"]["id"],
        "op": message["action"],
        "table": message["metadata"]["table_name"],
    }
