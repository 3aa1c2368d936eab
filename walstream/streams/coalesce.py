"""Catch-up coalescing: a window of a stream's changes collapsed to one per row.

Per (source, table, key), in window order:

- insert (or read) then update(s)   -> insert (read) with the latest row
- insert (or read) then delete      -> nothing
- update(s) then delete             -> delete
- update then update                -> the latest update
- delete then insert                -> update with the latest row (the row existed before)

A truncate wipes the table's earlier entries of the window and stays in its place.
Changes without a key, and actions other than these, pass through as they are. The
result is ordered by each entry's last change, so per-source order holds and a consumer
that applies the entries in order ends in the same state as one that applied every
change. Coalescing assumes keys do not change: an update that moves a row to another
key counts as a change of the new key only.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

_ROW = ("insert", "read", "update", "delete")


class Change(Protocol):
    @property
    def source(self) -> str: ...
    @property
    def table(self) -> str: ...
    @property
    def action(self) -> str: ...
    @property
    def key(self) -> str | None: ...


@dataclass(frozen=True)
class Coalesced:
    last: int  # index in the window of the entry's latest change (its message and position)
    action: str  # the net action
    count: int  # changes of the window it stands for


def coalesce(window: Sequence[Change]) -> list[Coalesced]:
    """The window's entries (see the module docstring), ordered by their latest change."""
    open_: dict[tuple[str, str, str], tuple[str, int, int]] = {}  # key -> (first, last, n)
    done: list[Coalesced] = []
    for i, c in enumerate(window):
        if c.action == "truncate":
            wiped = 0
            for k in [k for k in open_ if k[0] == c.source and k[1] == c.table]:
                wiped += open_.pop(k)[2]
            done.append(Coalesced(i, "truncate", 1 + wiped))
        elif c.action in _ROW and c.key is not None:
            k = (c.source, c.table, c.key)
            first, _, n = open_.get(k, (c.action, i, 0))
            open_[k] = (first, i, n + 1)
        else:
            done.append(Coalesced(i, c.action, 1))
    for first, last, n in open_.values():
        action = net(first, window[last].action)
        if action is not None:
            done.append(Coalesced(last, action, n))
    done.sort(key=lambda e: e.last)
    return done


def net(first: str, last: str) -> str | None:
    """The net action of a row's changes from `first` to `last` (None: no change at all)."""
    if first in ("insert", "read"):
        return None if last == "delete" else first
    if last == "delete":
        return "delete"
    return "update"


def rewrite(message: str, fmt: str, action: str, original: str) -> str:
    """A message whose net action differs from its own action, in the net action's form
    (sequin's `action`); other formats carry no action and stay as they are (a pull
    stream takes no `format: debezium`: one change can be several of its records)."""
    if action == original or fmt != "sequin":
        return message
    body = json.loads(message)
    if not isinstance(body, dict):
        return message
    body["action"] = action
    body["changes"] = None  # what changed across the coalesced changes is not known
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"))
