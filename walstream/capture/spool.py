"""In-progress transactions that Postgres streams before their commit (`streaming on`).

With protocol 2 streaming, Postgres sends a transaction larger than
`logical_decoding_work_mem` in pieces while it runs (Stream Start ... Stream Stop,
interleaved with other transactions), then a Stream Commit or a Stream Abort.
Nothing of it may be delivered before the commit, so each one is spooled here: in
memory while all spools together stay within a budget, else in an unnamed temporary
file (gone with the process, so a crash leaves nothing behind). A subtransaction's
abort (ROLLBACK TO SAVEPOINT) cuts the spool back to where that subtransaction's
first change was, as Postgres's own apply worker does: what came after it belongs
to it or to its children.

The messages are kept in the form of a transaction that is not streamed (the 4-byte
xid after the message kind removed), each with its WAL position (the change's own
LSN), so that at the commit they go through exactly the path an ordinary transaction
takes.
"""

from __future__ import annotations

import struct
import tempfile
from collections.abc import Iterator
from itertools import chain
from typing import IO

from walstream.decode.pgoutput import BEGIN_BODY, COMMIT_BODY, STREAM_COMMIT_BODY
from walstream.errors import SetupError

_LEN = struct.Struct("!I")
#: A spooled message's frame in the file: its length and its WAL position.
_FRAME = struct.Struct("!IQ")
_STREAM_START = struct.Struct("!Ib")
_STREAM_ABORT = struct.Struct("!II")
#: Message kinds that carry the (sub)transaction's xid inside a streamed block.
WITH_XID = frozenset(b"IUDTRYM")


class Spool:
    """One in-progress transaction's messages, in arrival order."""

    def __init__(self, xid: int, directory: str | None) -> None:
        self.xid = xid
        self._directory = directory
        self._memory: list[tuple[bytes, int]] = []
        self._memory_bytes = 0
        self._file: IO[bytes] | None = None
        self.count = 0  # messages held
        self.size = 0  # bytes they take as framed records (the file's length once spilled)
        self._first: dict[int, tuple[int, int]] = {}  # subxid → (count, size) before it

    @property
    def spilled(self) -> bool:
        return self._file is not None

    @property
    def memory_bytes(self) -> int:
        return self._memory_bytes

    def append(self, subxid: int, raw: bytes, lsn: int) -> None:
        if subxid != self.xid and subxid not in self._first:
            self._first[subxid] = (self.count, self.size)
        self.count += 1
        self.size += _FRAME.size + len(raw)
        if self._file is None:
            self._memory.append((raw, lsn))
            self._memory_bytes += len(raw)
        else:
            self._file.write(_FRAME.pack(len(raw), lsn))
            self._file.write(raw)

    def spill(self) -> None:
        """Move what is in memory to the file (from now on, everything goes there)."""
        if self._file is not None:
            return
        # open until the spool is closed (its owner closes it), so no `with`
        self._file = tempfile.TemporaryFile(dir=self._directory, prefix="walstream-txn-")  # noqa: SIM115
        for raw, lsn in self._memory:
            self._file.write(_FRAME.pack(len(raw), lsn))
            self._file.write(raw)
        self._memory = []
        self._memory_bytes = 0

    def abort(self, subxid: int) -> None:
        """Subtransaction `subxid` rolled back: drop its changes and everything after them."""
        first = self._first.get(subxid)
        if first is None:
            return  # it changed nothing we hold
        count, size = first
        self._first = {x: at for x, at in self._first.items() if at[0] < count}
        if self._file is None:
            self._memory_bytes -= sum(len(m) for m, _ in self._memory[count:])
            del self._memory[count:]
        else:
            self._file.truncate(size)
            self._file.seek(size)
        self.count, self.size = count, size

    def __iter__(self) -> Iterator[tuple[bytes, int]]:
        """The messages with their WAL positions, in order (once: the spool is closed
        after the commit)."""
        if self._file is None:
            yield from self._memory
            return
        f = self._file
        f.flush()
        f.seek(0)
        read = f.read
        for _ in range(self.count):
            n, lsn = _FRAME.unpack(read(_FRAME.size))
            yield read(n), lsn

    def close(self) -> None:
        self._memory = []
        self._memory_bytes = 0
        if self._file is not None:
            self._file.close()
            self._file = None


class Replay:
    """A committed streamed transaction as the messages of an ordinary one, each with its
    WAL position: its Begin, what the spool holds, its Commit (both at the Stream
    Commit's). Iterate it (in steps); `close` frees the spool."""

    def __init__(self, begin: bytes, spool: Spool | None, commit: bytes, lsn: int) -> None:
        self._spool = spool
        self._it = chain(((begin, lsn),), spool if spool is not None else (), ((commit, lsn),))
        self.done = False

    def __iter__(self) -> Iterator[tuple[bytes, int]]:
        return self

    def __next__(self) -> tuple[bytes, int]:
        try:
            return next(self._it)
        except StopIteration:
            self.done = True
            raise

    def close(self) -> None:
        self.done = True
        if self._spool is not None:
            self._spool.close()


class Spools:
    """The in-progress transactions of one replication connection.

    `memory_budget`: bytes all spools may hold in memory together; past it the spool
    being added to moves to disk. `directory`: where the files go (None: the system's
    temporary directory)."""

    def __init__(self, memory_budget: int, directory: str | None = None) -> None:
        self.memory_budget = memory_budget
        self.directory = directory
        self.open: dict[int, Spool] = {}
        self._memory = 0
        self.spilled_bytes = 0  # written to disk since start (for progress and tests)
        self.xid: int | None = None  # inside Stream Start ... Stream Stop: whose

    def check(self) -> None:
        """SetupError when the spill directory cannot take a file."""
        try:
            tempfile.TemporaryFile(dir=self.directory, prefix="walstream-txn-").close()
        except OSError as exc:
            where = self.directory or tempfile.gettempdir()
            raise SetupError(
                f"cannot spool in-progress transactions under {where}: {exc}",
                "set the source's spill_dir to a writable local directory with room for your "
                "largest transaction's changes, or set streaming: false",
            ) from exc

    def receive(self, raw: bytes, lsn: int) -> bool:
        """Take a Stream Start, Stop or Abort, or a message inside a streamed block (at WAL
        position `lsn`); False for any other message (Stream Commit is `commit`)."""
        kind = raw[:1]
        if kind == b"S":
            xid, first = _STREAM_START.unpack_from(raw, 1)
            self.start(xid, first == 1)
        elif kind == b"E":
            self.xid = None
        elif self.xid is not None:
            self.add(raw, lsn)
        elif kind == b"A":
            self.abort(*_STREAM_ABORT.unpack_from(raw, 1))
        else:
            return False
        return True

    def start(self, xid: int, first_segment: bool) -> None:
        """Stream Start: the next messages belong to `xid`."""
        if first_segment and xid in self.open:
            self._discard(xid)  # sent again from its start (after a reconnect)
        self.xid = xid
        if xid not in self.open:
            self.open[xid] = Spool(xid, self.directory)

    def add(self, raw: bytes, lsn: int) -> None:
        """A message inside the current streamed block, as Postgres sent it."""
        assert self.xid is not None
        spool = self.open[self.xid]
        if raw[0] in WITH_XID:
            (subxid,) = _LEN.unpack_from(raw, 1)
            plain = raw[:1] + raw[5:]
        else:  # Origin: no xid, nothing the commit needs
            return
        before = spool.memory_bytes
        spool.append(subxid, plain, lsn)
        self._memory += spool.memory_bytes - before
        if spool.spilled:
            self.spilled_bytes += _FRAME.size + len(plain)
        elif self._memory > self.memory_budget:
            self._memory -= spool.memory_bytes
            self.spilled_bytes += spool.size
            spool.spill()

    def abort(self, xid: int, subxid: int) -> None:
        """Stream Abort: the whole transaction, or one subtransaction of it."""
        spool = self.open.get(xid)
        if spool is None:
            return
        if subxid == xid:
            self._discard(xid)
            return
        before = spool.memory_bytes
        spool.abort(subxid)
        self._memory += spool.memory_bytes - before

    def commit(self, raw: bytes, lsn: int) -> Replay:
        """Stream Commit: the transaction, as Begin, its messages and Commit."""
        xid, flags, commit_lsn, end_lsn, ts = STREAM_COMMIT_BODY.unpack_from(raw, 1)
        spool = self.open.pop(xid, None)
        if spool is not None:
            self._memory -= spool.memory_bytes
        begin = b"B" + BEGIN_BODY.pack(commit_lsn, ts, xid)
        commit = b"C" + COMMIT_BODY.pack(flags, commit_lsn, end_lsn, ts)
        return Replay(begin, spool, commit, lsn)

    def _discard(self, xid: int) -> None:
        spool = self.open.pop(xid)
        self._memory -= spool.memory_bytes
        spool.close()

    def clear(self) -> None:
        """A new connection: Postgres streams every open transaction again from its start."""
        for xid in list(self.open):
            self._discard(xid)
        self.xid = None

    @property
    def memory_bytes(self) -> int:
        return self._memory
