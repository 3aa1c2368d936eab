"""Progress markers: where a consumer is in a stream, one WAL cursor per source.

A marker is base64url (no padding) of compact JSON `{"v": 1, "s": stream, "p": {source:
[lsn, seq]}}`. It is opaque to consumers: they pass back the one they last processed.
A source missing from a marker is read from its first kept message.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping

Cursor = tuple[int, int]
#: Before any message: a source missing from a marker is read from its start.
START: Cursor = (-1, -1)


class BadMarker(ValueError):
    """Not a progress marker of this stream."""


def encode(stream: str, positions: Mapping[str, Cursor]) -> str:
    body = {
        "v": 1,
        "s": stream,
        "p": {k: [int(c[0]), int(c[1])] for k, c in sorted(positions.items()) if c != START},
    }
    raw = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def decode(stream: str, marker: str) -> dict[str, Cursor]:
    """The positions of a marker of `stream`; BadMarker says what is wrong."""
    try:
        raw = base64.urlsafe_b64decode(marker + "=" * (-len(marker) % 4))
        body = json.loads(raw)
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise BadMarker(
            "not a progress marker (it is not the text a message's `progress` carried)"
        ) from None
    if not isinstance(body, dict) or body.get("v") != 1 or not isinstance(body.get("p"), dict):
        raise BadMarker("not a progress marker (unknown layout)")
    if body.get("s") != stream:
        raise BadMarker(f"a progress marker of stream {body.get('s')!r}, not of {stream!r}")
    out: dict[str, Cursor] = {}
    for source, cursor in body["p"].items():
        if (
            not isinstance(source, str)
            or not isinstance(cursor, list)
            or len(cursor) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in cursor)
            or not (0 <= cursor[0] < 2**63 and 0 <= cursor[1] < 2**31)
        ):
            raise BadMarker("not a progress marker (a position is malformed)")
        out[source] = (cursor[0], cursor[1])
    return out


def furthest(a: Mapping[str, Cursor], b: Mapping[str, Cursor]) -> dict[str, Cursor]:
    """Per source, the later of two positions (a consumer group's checkpoint never goes back)."""
    return {k: max(a.get(k, START), b.get(k, START)) for k in {*a, *b}}
