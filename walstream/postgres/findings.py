"""What a setup check found: a level, its subject, what is wrong or right, and the fix."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Level = Literal["ok", "warning", "error"]


@dataclass(frozen=True, slots=True)
class Finding:
    level: Level
    subject: str
    message: str
    fix: str | None = None


def fetch_rows(conn: Any, query: str, *params: Any) -> list[tuple[Any, ...]]:
    return list(conn.execute(query, params or None).fetchall())
