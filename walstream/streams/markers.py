"""Progress markers: where a consumer is in a stream, one WAL cursor per source.

A marker is base64url (no padding) of compact JSON `{"v": 1, "s": stream, "p": {source:
[lsn, seq]}}`. It is opaque to consumers: they pass back the one they last processed.
A source missing from a marker is read from its first kept message.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Collection, Mapping

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


#: A marker is an object of an object of pairs: anything deeper is not one.
MAX_DEPTH = 3


def decode(stream: str, marker: str, sources: Collection[str] | None = None) -> dict[str, Cursor]:
    """The positions of a marker of `stream`; BadMarker says what is wrong. `sources`: the
    stream's sources (a marker naming another is refused)."""
    try:
        raw = base64.urlsafe_b64decode(marker + "=" * (-len(marker) % 4))
    except (binascii.Error, ValueError):
        raise BadMarker(
            "not a progress marker (it is not the text a message's `progress` carried)"
        ) from None
    if _depth(raw) > MAX_DEPTH:
        raise BadMarker(f"not a progress marker (nested deeper than {MAX_DEPTH} levels)")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
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
    unknown = sorted(set(out) - set(sources)) if sources is not None else []
    if unknown:
        raise BadMarker(
            f"the marker names source(s) {', '.join(repr(u[:100]) for u in unknown[:5])} that "
            f"stream {stream!r} does not have"
        )
    return out


def _depth(raw: bytes) -> int:
    """How deep `[` and `{` nest in JSON text (outside strings), without parsing it."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):  # ] }
            depth -= 1
    return deepest


def furthest(a: Mapping[str, Cursor], b: Mapping[str, Cursor]) -> dict[str, Cursor]:
    """Per source, the later of two positions (a consumer group's checkpoint never goes back)."""
    return {k: max(a.get(k, START), b.get(k, START)) for k in {*a, *b}}
