"""Other tools' configurations as walstream.yaml: `walstream import debezium|sequin`.

Each importer reads the tool's own file and returns an `Imported`: the walstream config
(a dict, written as YAML) and one `Line` for each setting it read, saying where it went
or why it could not be carried. Secrets are never copied: a password becomes a
`${VARIABLE}` the user exports.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Line:
    """What became of one setting of the imported file."""

    key: str
    carried: bool
    note: str  # where it went, or why not


@dataclass
class Imported:
    config: dict[str, Any]
    lines: list[Line] = field(default_factory=list)
    #: Environment variables the config reads (secrets left out of the file).
    variables: dict[str, str] = field(default_factory=dict)

    def carried(self, key: str, note: str) -> None:
        self.lines.append(Line(key, True, note))

    def left(self, key: str, note: str) -> None:
        self.lines.append(Line(key, False, note))
