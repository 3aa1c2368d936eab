"""The backfill reader's pure parts: COPY text lines back to values, and the row encoder
that must build the same record and pk as the decoder's tuple encoder."""

from __future__ import annotations

import struct

from walstream.values import codecs as c
from walstream.values.codecs import array_codec
from walstream.values.rows import compile_fields_encoder, compile_tuple_encoder


def tuple_bytes(values: list[bytes | None]) -> bytes:
    out = struct.pack("!h", len(values))
    for v in values:
        out += b"n" if v is None else b"t" + struct.pack("!i", len(v)) + v
    return out


def test_the_fields_encoder_builds_what_the_tuple_encoder_builds():
    names = ["id", "name", "ok", "amount", "doc", "raw", "tags", 'we"ird']
    codecs = [c.INT, c.TEXT, c.BOOL, c.NUMERIC, c.JSON, c.BYTEA, array_codec(c.TEXT), c.TEXT]
    rows = [
        [
            b"1",
            'é "q" \\'.encode(),
            b"t",
            b"1.50",
            b'{"a": [1, null]}',
            b"\\x00ff",
            b'{a,"b c",NULL}',
            b"x",
        ],
        [b"2", None, None, None, None, None, None, None],
    ]
    by_fields = compile_fields_encoder(names, codecs, [0, 7])
    by_tuple = compile_tuple_encoder(names, codecs, [0, 7])
    for row in rows:
        assert by_fields(row) == by_tuple(tuple_bytes(row), 0)
    assert by_fields(rows[1]) == (
        '{"id":2,"name":null,"ok":null,"amount":null,"doc":null,"raw":null,"tags":null,'
        '"we\\"ird":null}', ["2", None],
    )  # fmt: skip


def test_read_ahead_keeps_order_raises_the_readers_error_and_closes_on_an_early_stop():
    import threading

    import pytest

    from walstream.backfill.read import read_ahead

    assert list(read_ahead(iter(range(50)), depth=2)) == list(range(50))

    closed = threading.Event()

    def rows(fail_at: int | None):
        try:
            for i in range(100):
                if i == fail_at:
                    raise ValueError("the server went away")
                yield i
        finally:  # as fetch_batches ends its transaction
            closed.set()

    seen = []
    with pytest.raises(ValueError, match="went away"):
        for i in read_ahead(rows(fail_at=7)):
            seen.append(i)
    assert seen == list(range(7)) and closed.is_set()

    closed.clear()
    reader = read_ahead(rows(fail_at=None), depth=1)
    assert [next(reader), next(reader)] == [0, 1]
    reader.close()  # the writer failed: the reading stops, its generator is closed
    assert closed.wait(5)
    assert not any(t.name == "walstream-chunk-read" for t in threading.enumerate())
