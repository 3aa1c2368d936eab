"""A Delete decoded on the fast path is the row the full parser makes of it."""

from __future__ import annotations

import struct

import pytest

from tests.unit.decode.test_pgoutput import begin, relation, tuple_data
from walstream.decode.decoder import ChangeDecoder
from walstream.errors import DecodeError


def delete(oid: int, kind: bytes, *values: bytes | str | None) -> bytes:
    return b"D" + struct.pack("!I", oid) + kind + tuple_data(*values)


class NoParser:
    """In a decoder's place of the full parser: fails the test when used."""

    in_stream = False

    def parse(self, raw: bytes) -> None:
        pytest.fail(f"the full parser decoded {raw[:1]!r}")


def both(raw: bytes, parsed: bool = False, keys: list[str] | None = None) -> tuple[list, list]:
    """The rows `decode` makes of `raw` in a transaction, and those the full parser makes;
    `parsed`: whether `decode` may use the full parser (else it must not)."""
    out = []
    for fast in (True, False):
        d = ChangeDecoder("s", primary_keys={("public", "t"): keys} if keys else None)
        d.decode(relation(1))  # id int (key), note text
        d.decode(begin(100, 9))
        if fast and not parsed:
            d.parser = NoParser()  # type: ignore[assignment]
        out.append(d.decode(raw) if fast else d.apply(d.parser.parse(raw)))
    return out[0], out[1]


@pytest.mark.parametrize(
    ("kind", "values", "record"),
    [
        (b"K", (b"7", None), '{"id":7}'),  # REPLICA IDENTITY DEFAULT: the key only
        (b"O", (b"7", b'a "note"'), '{"id":7,"note":"a \\"note\\""}'),  # FULL: the old row
        (b"O", (b"7", None), '{"id":7,"note":null}'),
        (b"K", (None, None), '{"id":null}'),
    ],
)
def test_a_delete_is_the_row_the_full_parser_makes(kind, values, record):
    fast, full = both(delete(1, kind, *values))
    assert fast == full
    (row,) = fast
    assert (row.action, row.record, row.old, row.seq) == ("delete", record, record, 0)
    assert row.pk == [None if values[0] is None else values[0].decode()]


def test_what_the_fast_path_does_not_take_goes_to_the_full_parser():
    # unchanged TOAST in an old row: the full parser lists it
    fast, full = both(delete(1, b"O", b"7", "u"), parsed=True)
    assert fast == full and fast[0].unchanged_toast == ["note"]
    fast, full = both(delete(1, b"K", b"7", "u"), parsed=True)
    assert fast == full
    d = ChangeDecoder("s")
    d.decode(relation(1))
    d.decode(begin(100, 9))
    with pytest.raises(DecodeError):  # cut short: the full parser says what is wrong
        d.decode(delete(1, b"K", b"7", None)[:-3])


def test_a_composite_key_in_another_order_than_the_columns():
    """The key (note, id): the record's columns in the table's order, the pk in the key's."""
    fast, full = both(delete(1, b"K", b"7", b"x"), keys=["note", "id"])
    assert fast == full
    assert (fast[0].record, fast[0].pk) == ('{"id":7,"note":"x"}', ["x", "7"])
