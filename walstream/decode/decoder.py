"""Turn a sequence of raw pgoutput messages into canonical change rows.

The decoder is a small state machine: it keeps the relations it has seen, the
current transaction's context (commit LSN, xid, commit time, next `seq`,
annotations) and, with protocol 2 streaming, the in-progress transactions'
messages until their Stream Commit. Its state is plain data (`TxnContext`,
`RelationInfo`) so a Spark partition that starts inside a transaction can be
decoded on an executor with the context the driver recorded.
"""

from __future__ import annotations

import json
import logging
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from walstream.change import PG_EPOCH_UNIX_US, ChangeRow
from walstream.decode import pgoutput as po
from walstream.decode.relations import CompiledRelation, RelationInfo
from walstream.decode.types import TypeRegistry
from walstream.errors import DecodeError

log = logging.getLogger(__name__)

__all__ = [
    "ANNOTATIONS_PREFIX",
    "WATERMARK",
    "WATERMARK_PREFIX",
    "ChangeDecoder",
    "RelationInfo",
    "TxnContext",
    "annotations_json",
]

ANNOTATIONS_PREFIX = "walstream:annotations"
#: Backfill watermarks (docs/architecture.md §6): a transactional logical message with this
#: prefix becomes a change row with action `watermark` and the message as `record`. No
#: sink selects that action; the pipeline reads them to place backfill chunks.
WATERMARK_PREFIX = "walstream:backfill"
WATERMARK = "watermark"

_U32 = struct.Struct("!I").unpack_from


@dataclass(slots=True)
class TxnContext:
    """Where we are inside a transaction: enough to decode its next change."""

    lsn: int
    xid: int | None
    committed_at_us: int  # Unix epoch microseconds
    seq: int = 0
    annotations: str | None = None
    #: The end LSN of the commit before this transaction in the stream (None: not known).
    last_commit_lsn: int | None = None


@dataclass(slots=True)
class _Stream:
    """An in-progress transaction streamed before its commit (protocol >= 2)."""

    messages: list[tuple[int | None, bytes, int | None]] = field(default_factory=list)


MessageHook = Callable[[po.Message, TxnContext | None], None]


class ChangeDecoder:
    """Decode raw pgoutput messages, in arrival order, into `ChangeRow`s.

    `primary_keys` maps (schema, table) to the primary-key column names from the
    catalog; without an entry the replica-identity columns are the key (under
    REPLICA IDENTITY FULL that is every column). `on_message` receives logical
    messages other than annotations (heartbeats, watermarks).
    """

    def __init__(
        self,
        source: str,
        types: TypeRegistry | None = None,
        primary_keys: Mapping[tuple[str, str], Sequence[str]] | None = None,
        on_message: MessageHook | None = None,
    ) -> None:
        self.source = source
        self.types = types or TypeRegistry()
        self.primary_keys = dict(primary_keys or {})
        self.on_message = on_message
        self.parser = po.PgOutputParser()
        self.relations: dict[int, CompiledRelation] = {}
        self._compiled: dict[RelationInfo, CompiledRelation] = {}
        self.txn: TxnContext | None = None
        self.streams: dict[int, _Stream] = {}
        self.type_names: dict[int, tuple[str, str]] = {}
        #: The WAL position of the message being decoded (its XLogData's start, which
        #: for a change is its own record's LSN): each row's `change_lsn` (`decode`'s
        #: `at`; None where it is not known).
        self.at: int | None = None
        #: The end LSN of the last Commit decoded (the next transaction's `last_commit_lsn`).
        self.last_commit_lsn: int | None = None

    # -- state ---------------------------------------------------------------------------
    def add_relation(self, info: RelationInfo) -> None:
        compiled = self._compiled.get(info)
        if compiled is None:
            compiled = self._compiled[info] = CompiledRelation(info, self.types)
        self.relations[info.oid] = compiled

    def set_relations(self, infos: Sequence[RelationInfo]) -> None:
        """Replace the known relations (compiled encoders are cached across calls)."""
        self.relations = {}
        for info in infos:
            self.add_relation(info)

    def relation_infos(self) -> list[RelationInfo]:
        return [c.info for c in self.relations.values()]

    def _relation(self, oid: int) -> CompiledRelation:
        rel = self.relations.get(oid)
        if rel is None:
            raise DecodeError(
                f"change for relation OID {oid} arrived before its Relation message",
                "the stream must be read from a transaction boundary with the relation metadata captured before it",
            )
        return rel

    # -- decoding ------------------------------------------------------------------------
    def decode(self, raw: bytes, at: int | None = None) -> list[ChangeRow]:
        """Decode one raw message (`at`: its WAL position, the XLogData's start); return the
        change rows it completes (often 0 or 1)."""
        self.at = at
        if self.parser.in_stream:
            if raw[:1] not in (b"S", b"E"):
                return self._buffer_streamed(raw)
        elif self.txn is not None:
            rows = self._fast_change(raw, 0)
            if rows is not None:
                return rows
        msg = self.parser.parse(raw)
        return self.apply(msg)

    def _fast_change(self, raw: bytes, off: int) -> list[ChangeRow] | None:
        """Fast path for the common messages: an Insert, an Update without old tuple, a
        Delete, parsed and encoded in one pass with no intermediate objects. `off` is 4
        when the message carries a streamed xid. None means: use the full parser."""
        kind = raw[0]
        if kind == 68:  # Delete: its old tuple, key-only ('K') or the whole row ('O')
            return self._fast_delete(raw, off)
        if not (kind == 73 or (kind == 85 and raw[off + 5] == 78)):
            return None
        rel = self.relations.get(_U32(raw, off + 1)[0])
        if rel is None:
            return None
        try:
            fast = rel.fast(raw, off + 6)
            if fast is None:
                record, pk, omitted, nulls = rel.fused(raw, off + 6)
            else:
                record, pk = fast
                omitted = nulls = None
        except (IndexError, struct.error, UnicodeDecodeError):
            return None  # the full parser reports what is wrong
        return [
            self._fast_row(
                rel, "insert" if kind == 73 else "update", pk, record, None, omitted, nulls
            )
        ]

    def _fast_delete(self, raw: bytes, off: int) -> list[ChangeRow] | None:
        """A Delete as `_change` makes it (`record` and `old` both the old tuple's JSON),
        or None for the full parser."""
        rel = self.relations.get(_U32(raw, off + 1)[0])
        if rel is None:
            return None
        try:
            tuple_kind = raw[off + 5]
            omitted = nulls = None
            if tuple_kind == 75:  # 'K': the key columns
                keyed = rel.keys_record(raw, off + 6)
                if keyed is None:
                    return None
                record, pk = keyed
            elif tuple_kind == 79:  # 'O': the whole old row (REPLICA IDENTITY FULL)
                fast = rel.fast(raw, off + 6)
                if fast is None:
                    record, pk, omitted, nulls = rel.fused(raw, off + 6)
                else:
                    record, pk = fast
            else:
                return None
        except (IndexError, struct.error, UnicodeDecodeError):
            return None  # the full parser reports what is wrong
        return [self._fast_row(rel, "delete", pk, record, record, omitted, nulls)]

    def _fast_row(
        self,
        rel: CompiledRelation,
        action: str,
        pk: list[str | None],
        record: str,
        old: str | None,
        omitted: list[str] | None,
        nulls: list[str] | None,
    ) -> ChangeRow:
        txn = self.txn
        assert txn is not None
        seq = txn.seq
        txn.seq = seq + 1
        info = rel.info
        return ChangeRow(
            self.source,
            txn.lsn,
            seq,
            txn.xid,
            txn.committed_at_us,
            action,
            info.schema,
            info.table,
            pk,
            record,
            old,
            txn.annotations,
            omitted,
            info.oid,
            nulls,
            self.at,
            txn.last_commit_lsn,
        )

    def apply(self, msg: po.PgOutputMessage) -> list[ChangeRow]:
        if isinstance(msg, po.Insert | po.Update | po.Delete | po.Truncate):
            return self._change(msg)
        if isinstance(msg, po.Begin):
            self.txn = TxnContext(
                msg.final_lsn,
                msg.xid,
                msg.commit_ts + PG_EPOCH_UNIX_US,
                last_commit_lsn=self.last_commit_lsn,
            )
            return []
        if isinstance(msg, po.Commit):
            if self.txn is not None and self.txn.lsn != msg.commit_lsn:
                raise DecodeError(
                    f"Commit LSN {msg.commit_lsn} does not match Begin's final LSN {self.txn.lsn}",
                    "the message stream is corrupted or out of order; restart from the slot",
                )
            self.txn = None
            self.last_commit_lsn = msg.end_lsn
            return []
        if isinstance(msg, po.Relation):
            pk = self.primary_keys.get((msg.schema, msg.name))
            self.add_relation(RelationInfo.from_message(msg, pk))
            return []
        if isinstance(msg, po.Message):
            return self._message(msg)
        if isinstance(msg, po.TypeInfo):
            self.type_names[msg.oid] = (msg.schema, msg.name)
            return []
        if isinstance(msg, po.StreamStart):
            self.streams.setdefault(msg.xid, _Stream())
            return []
        if isinstance(msg, po.StreamCommit):
            return self._stream_commit(msg)
        if isinstance(msg, po.StreamAbort):
            self._stream_abort(msg)
            return []
        return []  # Origin, StreamStop: nothing to emit

    def _message(self, msg: po.Message) -> list[ChangeRow]:
        txn = self.txn
        if msg.prefix == ANNOTATIONS_PREFIX and msg.transactional and txn is not None:
            txn.annotations = annotations_json(msg.content)
        elif msg.prefix == WATERMARK_PREFIX and msg.transactional and txn is not None:
            seq = txn.seq
            txn.seq = seq + 1
            content = msg.content.decode("utf-8", errors="replace")
            row = ChangeRow(
                self.source,
                txn.lsn,
                seq,
                txn.xid,
                txn.committed_at_us,
                WATERMARK,
                "",
                "",
                [],
                content,
                None,
                None,
                None,
                None,
                None,
                self.at,
                txn.last_commit_lsn,
            )
            return [row]
        elif self.on_message is not None:
            self.on_message(msg, txn)
        return []

    def _next(self) -> TxnContext:
        txn = self.txn
        if txn is None:
            raise DecodeError(
                "a change arrived outside a transaction",
                "the stream must be read from a transaction boundary (Begin message)",
            )
        return txn

    def _change(self, msg: po.Insert | po.Update | po.Delete | po.Truncate) -> list[ChangeRow]:
        txn = self._next()
        if isinstance(msg, po.Truncate):
            rows = []
            for oid in msg.relation_oids:
                info = self._relation(oid).info
                rows.append(self._row(txn, "truncate", info, [], None, None, None))
            return rows
        rel = self._relation(msg.relation_oid)
        info = rel.info
        if isinstance(msg, po.Insert):
            record, omitted, nulls = rel.record(msg.new)
            return [self._row(txn, "insert", info, rel.pk(msg.new), record, None, omitted, nulls)]
        if isinstance(msg, po.Update):
            old_json = None
            fill = None
            if msg.old is not None:
                only_keys = msg.old_kind == "K"
                old_json, _, _ = rel.record(msg.old, only_keys=only_keys)
                fill = None if only_keys else msg.old
            record, omitted, nulls = rel.record(msg.new, fill=fill)
            pk = rel.pk(msg.new, fallback=msg.old)
            return [self._row(txn, "update", info, pk, record, old_json, omitted, nulls)]
        only_keys = msg.old_kind == "K"
        old_json, omitted, nulls = rel.record(msg.old, only_keys=only_keys)
        pk = rel.pk(msg.old)
        return [self._row(txn, "delete", info, pk, old_json, old_json, omitted, nulls)]

    def _row(
        self,
        txn: TxnContext,
        action: str,
        info: RelationInfo,
        pk: list[str | None],
        record: str | None,
        old: str | None,
        omitted: list[str] | None,
        nulls: list[str] | None = None,
    ) -> ChangeRow:
        seq = txn.seq
        txn.seq = seq + 1
        return ChangeRow(
            self.source,
            txn.lsn,
            seq,
            txn.xid,
            txn.committed_at_us,
            action,
            info.schema,
            info.table,
            pk,
            record,
            old,
            txn.annotations,
            omitted,
            info.oid,
            nulls,
            self.at,
            txn.last_commit_lsn,
        )

    # -- protocol 2 streaming ------------------------------------------------------------------
    def _buffer_streamed(self, raw: bytes) -> list[ChangeRow]:
        top = self.parser.stream_xid
        assert top is not None
        kind = raw[:1]
        if kind == b"M" and not raw[5] & 1:
            # Non-transactional message inside a stream block: handle it now.
            self._message(_parse_streamed(raw))  # type: ignore[arg-type]
            return []
        subxid = int.from_bytes(raw[1:5], "big") if kind in b"IUDTRYM" else None
        self.streams.setdefault(top, _Stream()).messages.append((subxid, raw, self.at))
        return []

    def _stream_abort(self, msg: po.StreamAbort) -> None:
        stream = self.streams.get(msg.xid)
        if stream is None:
            return
        if msg.subxid == msg.xid:
            del self.streams[msg.xid]
        else:
            stream.messages = [m for m in stream.messages if m[0] != msg.subxid]

    def _stream_commit(self, msg: po.StreamCommit) -> list[ChangeRow]:
        stream = self.streams.pop(msg.xid, _Stream())
        saved, at = self.txn, self.at
        self.txn = TxnContext(
            msg.commit_lsn,
            msg.xid,
            msg.commit_ts + PG_EPOCH_UNIX_US,
            last_commit_lsn=self.last_commit_lsn,
        )
        replay = po.PgOutputParser(in_stream=True, stream_xid=msg.xid)
        rows: list[ChangeRow] = []
        try:
            for _, raw, self.at in stream.messages:
                fast = self._fast_change(raw, 4)
                rows.extend(fast if fast is not None else self.apply(replay.parse(raw)))
        finally:
            self.txn, self.at = saved, at
        self.last_commit_lsn = msg.end_lsn
        return rows


def _parse_streamed(raw: bytes) -> po.PgOutputMessage:
    return po.PgOutputParser(in_stream=True).parse(raw)


def annotations_json(content: bytes) -> str:
    """Annotations must be JSON; anything else is kept as a JSON string, never dropped."""
    text = content.decode("utf-8", errors="replace")
    try:
        json.loads(text)
        return text
    except ValueError:
        log.warning("transaction annotations are not JSON; passing them on as a string")
        return json.dumps(text)
