"""Parser behaviour on hand-built messages (the integration suite covers real server output)."""

from __future__ import annotations

import struct

import pytest

from walstream.decode import pgoutput as po
from walstream.decode.decoder import ChangeDecoder
from walstream.errors import DecodeError


def tuple_data(*values: bytes | str | None) -> bytes:
    out = struct.pack("!h", len(values))
    for v in values:
        if v is None:
            out += b"n"
        elif v == "u":
            out += b"u"
        else:
            assert isinstance(v, bytes)
            out += b"t" + struct.pack("!i", len(v)) + v
    return out


def relation(oid: int, xid: int | None = None) -> bytes:
    head = b"R" + (struct.pack("!I", xid) if xid is not None else b"")
    cols = b"".join(
        struct.pack("!b", flag) + name + b"\0" + struct.pack("!Ii", typ, -1)
        for flag, name, typ in ((1, b"id", 23), (0, b"note", 25))
    )
    return head + struct.pack("!I", oid) + b"public\0t\0d" + struct.pack("!h", 2) + cols


def begin(lsn: int, xid: int) -> bytes:
    return b"B" + struct.pack("!qqI", lsn, 0, xid)


def commit(lsn: int) -> bytes:
    return b"C" + struct.pack("!bqqq", 0, lsn, lsn + 8, 0)


def insert(oid: int, *values, xid: int | None = None) -> bytes:
    head = b"I" + (struct.pack("!I", xid) if xid is not None else b"")
    return head + struct.pack("!I", oid) + b"N" + tuple_data(*values)


def test_parse_relation_and_insert():
    p = po.PgOutputParser()
    rel = p.parse(relation(16384))
    assert rel == po.Relation(
        16384, "public", "t", "d", (po.Column("id", 23, -1, True), po.Column("note", 25, -1, False))
    )
    ins = p.parse(insert(16384, b"1", None))
    assert ins == po.Insert(16384, [b"1", None])
    upd = p.parse(
        b"U"
        + struct.pack("!I", 16384)
        + b"K"
        + tuple_data(b"1", None)
        + b"N"
        + tuple_data(b"2", "u")
    )
    assert upd == po.Update(16384, "K", [b"1", None], [b"2", po.UNCHANGED_TOAST])


def test_truncate_and_message_and_origin():
    p = po.PgOutputParser()
    assert p.parse(b"T" + struct.pack("!ib", 2, 3) + struct.pack("!II", 1, 2)) == po.Truncate(
        (1, 2), True, True
    )
    msg = p.parse(b"M" + struct.pack("!bq", 1, 99) + b"pfx\0" + struct.pack("!i", 3) + b"abc")
    assert msg == po.Message(True, 99, "pfx", b"abc")
    assert p.parse(b"O" + struct.pack("!q", 5) + b"upstream\0") == po.Origin(5, "upstream")


def test_stream_messages_carry_xids_only_inside_a_block():
    p = po.PgOutputParser()
    assert p.parse(b"S" + struct.pack("!Ib", 700, 1)) == po.StreamStart(700, True)
    assert p.in_stream
    assert p.parse(insert(1, b"5", None, xid=701)) == po.Insert(1, [b"5", None], 701)
    assert p.parse(b"E") == po.StreamStop()
    assert p.parse(insert(1, b"6", None)) == po.Insert(1, [b"6", None], None)
    assert p.parse(b"A" + struct.pack("!II", 700, 701)) == po.StreamAbort(700, 701)


def test_garbage_is_a_decode_error_with_a_fix():
    p = po.PgOutputParser()
    with pytest.raises(DecodeError, match="unsupported pgoutput message type b'Z'"):
        p.parse(b"Z123")
    with pytest.raises(DecodeError, match="malformed pgoutput message 'I'") as e:
        p.parse(b"I\x00\x00")
    assert e.value.fix
    with pytest.raises(DecodeError, match="unknown tuple column kind 'x'"):
        p.parse(b"I" + struct.pack("!I", 1) + b"N" + struct.pack("!h", 1) + b"x")


def test_decoder_interleaves_streamed_and_plain_transactions_in_commit_order():
    d = ChangeDecoder("s")
    out = []
    for raw in [
        relation(1),
        b"S" + struct.pack("!Ib", 700, 1),
        relation(1, xid=700),
        insert(1, b"1", b"streamed-a", xid=700),
        b"E",
        begin(200, 800),
        insert(1, b"9", b"plain"),
        commit(200),
        b"S" + struct.pack("!Ib", 700, 0),
        insert(1, b"2", b"sub-aborted", xid=701),
        insert(1, b"3", b"streamed-b", xid=700),
        b"E",
        b"A" + struct.pack("!II", 700, 701),
        b"c" + struct.pack("!Ibqqq", 700, 0, 300, 308, 0),
    ]:
        out.extend(d.decode(raw))
    assert [(r.lsn, r.seq, r.xid, r.pk) for r in out] == [
        (200, 0, 800, ["9"]),
        (300, 0, 700, ["1"]),
        (300, 1, 700, ["3"]),
    ]
    assert not d.streams


def test_change_before_relation_is_a_clear_error():
    d = ChangeDecoder("s")
    d.decode(begin(10, 1))
    with pytest.raises(DecodeError, match="before its Relation message"):
        d.decode(insert(5, b"1", None))
