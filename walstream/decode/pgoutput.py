"""Parse pgoutput logical replication messages (protocol versions 1-4) into typed records.

Reference: "Logical Replication Message Formats" in the PostgreSQL manual.
Inside a streamed block (between Stream Start and Stream Stop, protocol >= 2)
every data message carries the xid of the (sub)transaction it belongs to, so
the parser is stateful: feed it messages in arrival order.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from walstream.errors import DecodeError

_I8 = struct.Struct("!q")
_I32 = struct.Struct("!i")
_U32 = struct.Struct("!I")
_I16 = struct.Struct("!h")
#: The fields after the kind byte (the capture and the spool read and write them too).
BEGIN_BODY = struct.Struct("!qqI")  # final lsn, commit ts, xid
COMMIT_BODY = struct.Struct("!bqqq")  # flags, commit lsn, end lsn, ts
STREAM_COMMIT_BODY = struct.Struct("!Ibqqq")  # xid, then as Commit
_MSG_HEAD = struct.Struct("!bq")  # flags, lsn

NULL = None
#: Marker for a TOASTed value Postgres did not send because the update left it unchanged.
UNCHANGED_TOAST = b"\x00unchanged-toast"  # a sentinel no text value can equal (contains NUL)

# A tuple is a list of column values: None (SQL NULL), UNCHANGED_TOAST, or the
# raw bytes of the text (or binary) representation.
TupleData = list[bytes | None]


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type_oid: int
    type_modifier: int
    is_key: bool


@dataclass(frozen=True, slots=True)
class Relation:
    oid: int
    schema: str
    name: str
    replica_identity: str  # d default, n nothing, f full, i index
    columns: tuple[Column, ...]
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Begin:
    final_lsn: int
    commit_ts: int  # microseconds since 2000-01-01 UTC
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_ts: int


@dataclass(frozen=True, slots=True)
class Origin:
    commit_lsn: int
    name: str


@dataclass(frozen=True, slots=True)
class TypeInfo:
    oid: int
    schema: str
    name: str
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Insert:
    relation_oid: int
    new: TupleData
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Update:
    relation_oid: int
    old_kind: str | None  # 'K' key columns only, 'O' whole old row, None not sent
    old: TupleData | None
    new: TupleData
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Delete:
    relation_oid: int
    old_kind: str  # 'K' or 'O'
    old: TupleData
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Truncate:
    relation_oids: tuple[int, ...]
    cascade: bool
    restart_identity: bool
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Message:
    transactional: bool
    lsn: int
    prefix: str
    content: bytes
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class StreamStart:
    xid: int
    first_segment: bool


@dataclass(frozen=True, slots=True)
class StreamStop:
    pass


@dataclass(frozen=True, slots=True)
class StreamCommit:
    xid: int
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_ts: int


@dataclass(frozen=True, slots=True)
class StreamAbort:
    xid: int
    subxid: int


PgOutputMessage = (
    Begin
    | Commit
    | Origin
    | Relation
    | TypeInfo
    | Insert
    | Update
    | Delete
    | Truncate
    | Message
    | StreamStart
    | StreamStop
    | StreamCommit
    | StreamAbort
)


def read_cstring(buf: bytes, pos: int) -> tuple[str, int]:
    end = buf.index(b"\x00", pos)
    return buf[pos:end].decode("utf-8"), end + 1


def read_tuple(buf: bytes, pos: int) -> tuple[TupleData, int]:
    """Read TupleData at `pos`; return the values and the position after them."""
    (ncols,) = _I16.unpack_from(buf, pos)
    pos += 2
    values: TupleData = []
    append = values.append
    unpack_len = _I32.unpack_from
    for _ in range(ncols):
        kind = buf[pos]
        pos += 1
        if kind == 116 or kind == 98:  # 't' text, 'b' binary
            (n,) = unpack_len(buf, pos)
            pos += 4
            append(buf[pos : pos + n])
            pos += n
        elif kind == 110:  # 'n'
            append(None)
        elif kind == 117:  # 'u'
            append(UNCHANGED_TOAST)
        else:
            raise DecodeError(
                f"unknown tuple column kind {chr(kind)!r} in pgoutput data",
                "this pgoutput version is newer than walstream understands; upgrade walstream",
            )
    return values, pos


@dataclass(slots=True)
class PgOutputParser:
    """Stateful parser: tracks whether we are inside a streamed block."""

    in_stream: bool = False
    stream_xid: int | None = field(default=None)

    def parse(self, buf: bytes) -> PgOutputMessage:
        try:
            return self._parse(buf)
        except DecodeError:
            raise
        except (struct.error, IndexError, ValueError, UnicodeDecodeError) as exc:
            kind = chr(buf[0]) if buf else "?"
            raise DecodeError(
                f"malformed pgoutput message {kind!r} ({len(buf)} bytes): {exc}",
                "check that the slot uses the pgoutput plugin and the protocol version walstream requested",
            ) from exc

    def _xid(self, buf: bytes, pos: int) -> tuple[int | None, int]:
        if self.in_stream:
            return _U32.unpack_from(buf, pos)[0], pos + 4
        return None, pos

    def _relation(self, buf: bytes) -> Relation:
        xid, pos = self._xid(buf, 1)
        (oid,) = _U32.unpack_from(buf, pos)
        schema, pos = read_cstring(buf, pos + 4)
        name, pos = read_cstring(buf, pos)
        ident = chr(buf[pos])
        (ncols,) = _I16.unpack_from(buf, pos + 1)
        pos += 3
        cols = []
        for _ in range(ncols):
            flags = buf[pos]
            cname, pos = read_cstring(buf, pos + 1)
            type_oid, typmod = struct.unpack_from("!Ii", buf, pos)
            pos += 8
            cols.append(Column(cname, type_oid, typmod, bool(flags & 1)))
        return Relation(oid, schema, name, ident, tuple(cols), xid)

    def _parse(self, buf: bytes) -> PgOutputMessage:
        kind = buf[0:1]
        if kind == b"B":
            lsn, ts, xid = BEGIN_BODY.unpack_from(buf, 1)
            return Begin(lsn, ts, xid)
        if kind == b"C":
            flags, commit_lsn, end_lsn, ts = COMMIT_BODY.unpack_from(buf, 1)
            return Commit(flags, commit_lsn, end_lsn, ts)
        if kind == b"I":
            xid, pos = self._xid(buf, 1)
            (oid,) = _U32.unpack_from(buf, pos)
            if buf[pos + 4] != 78:  # 'N'
                raise DecodeError(f"Insert without new tuple (got {buf[pos + 4 : pos + 5]!r})")
            new, _ = read_tuple(buf, pos + 5)
            return Insert(oid, new, xid)
        if kind == b"U":
            xid, pos = self._xid(buf, 1)
            (oid,) = _U32.unpack_from(buf, pos)
            pos += 4
            old_kind: str | None = None
            old: TupleData | None = None
            if buf[pos] in (75, 79):  # 'K' or 'O'
                old_kind = chr(buf[pos])
                old, pos = read_tuple(buf, pos + 1)
            if buf[pos] != 78:
                raise DecodeError(f"Update without new tuple (got {buf[pos : pos + 1]!r})")
            new, _ = read_tuple(buf, pos + 1)
            return Update(oid, old_kind, old, new, xid)
        if kind == b"D":
            xid, pos = self._xid(buf, 1)
            (oid,) = _U32.unpack_from(buf, pos)
            old_kind = chr(buf[pos + 4])
            old, _ = read_tuple(buf, pos + 5)
            return Delete(oid, old_kind, old, xid)
        if kind == b"R":
            return self._relation(buf)
        if kind == b"Y":
            xid, pos = self._xid(buf, 1)
            (oid,) = _U32.unpack_from(buf, pos)
            schema, pos = read_cstring(buf, pos + 4)
            name, pos = read_cstring(buf, pos)
            return TypeInfo(oid, schema, name, xid)
        if kind == b"T":
            xid, pos = self._xid(buf, 1)
            (n,) = _I32.unpack_from(buf, pos)
            options = buf[pos + 4]
            oids = struct.unpack_from(f"!{n}I", buf, pos + 5)
            return Truncate(tuple(oids), bool(options & 1), bool(options & 2), xid)
        if kind == b"M":
            xid, pos = self._xid(buf, 1)
            flags, lsn = _MSG_HEAD.unpack_from(buf, pos)
            prefix, pos = read_cstring(buf, pos + 9)
            (n,) = _I32.unpack_from(buf, pos)
            content = bytes(buf[pos + 4 : pos + 4 + n])
            return Message(bool(flags & 1), lsn, prefix, content, xid)
        if kind == b"O":
            (lsn,) = _I8.unpack_from(buf, 1)
            name, _ = read_cstring(buf, 9)
            return Origin(lsn, name)
        if kind == b"S":
            xid, first = struct.unpack_from("!Ib", buf, 1)
            self.in_stream = True
            self.stream_xid = xid
            return StreamStart(xid, first == 1)
        if kind == b"E":
            self.in_stream = False
            self.stream_xid = None
            return StreamStop()
        if kind == b"c":
            xid, flags, commit_lsn, end_lsn, ts = STREAM_COMMIT_BODY.unpack_from(buf, 1)
            return StreamCommit(xid, flags, commit_lsn, end_lsn, ts)
        if kind == b"A":
            xid, subxid = struct.unpack_from("!II", buf, 1)
            return StreamAbort(xid, subxid)
        raise DecodeError(
            f"unsupported pgoutput message type {kind!r}",
            "walstream does not request two-phase decoding; recreate the slot without two_phase",
        )
