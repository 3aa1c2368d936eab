"""Before capture starts: check the database, then create the publication and slot if missing."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from walstream.change import parse_lsn
from walstream.errors import SetupError
from walstream.postgres.publication import NO_OPTIONS, PublicationOptions
from walstream.postgres.replication import connect, current_lsn, ensure_publication
from walstream.postgres.setup import check_database
from walstream.postgres.slots import check_not_lost
from walstream.postgres.standby import create_slot, in_recovery, wait_replayed

log = logging.getLogger(__name__)


def prepare_capture(
    dsn: str,
    slot: str,
    publication: str,
    tables: Sequence[str],
    name: str,
    standby: bool = False,
    resume_from: int | None = None,
    primary: str | None = None,
    options: PublicationOptions = NO_OPTIONS,
) -> int:
    """Fail with every setup error and its fix, or make slot and publication exist.

    Returns the slot's confirmed LSN. From the moment this returns, every change
    committed to the published tables is kept by the slot until confirmed.
    `standby`: another walstream leads this source, so its slot being in use is
    expected, not an error. `resume_from`: the LSN the source's checkpoint resumes
    from (None: it starts fresh); then a missing slot is not created but raises
    `SlotLost`, like an invalidated one always does (`slots.py`). `primary`: the
    primary's DSN when `dsn` is a physical standby (the publication is made there).
    `options`: the source's choices for its publication.
    """
    findings = check_database(dsn, slot, publication, tables, primary=primary, options=options)
    if not any(f.subject == "connection" for f in findings):
        with connect(dsn, autocommit=True) as conn:
            check_not_lost(conn, slot, name, resume_from)  # before the rest: it says more
    errors = [f for f in findings if f.level == "error"]
    busy = [f for f in findings if f.subject == f"slot {slot}" and "in use" in f.message]
    if busy and not standby and not slot_free_soon(dsn, slot):
        errors += busy
    if errors:
        raise SetupError(
            f"source {name!r} cannot start: "
            + "; ".join(f"{f.subject}: {f.message}" for f in errors),
            " | ".join(f.fix for f in errors if f.fix),
        )
    if primary is not None:
        with connect(primary, autocommit=True) as conn:
            if ensure_publication(conn, publication, tables, options):
                log.info("created publication %s on the primary", publication)
            written = current_lsn(conn)
    with connect(dsn, autocommit=True) as conn:
        if primary is not None and in_recovery(conn):  # the slot decodes with the publication
            wait_replayed(conn, written, 60)
        if primary is None and ensure_publication(conn, publication, tables, options):
            log.info("created publication %s", publication)
        if resume_from is not None:
            check_not_lost(conn, slot, name, resume_from)  # dropped since? never re-create
        elif create_slot(conn, slot, primary):
            log.info("created replication slot %s (pgoutput)", slot)
        row = conn.execute(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
            (slot,),
        ).fetchone()
        assert row is not None
        return parse_lsn(row[0])


def slot_free_soon(dsn: str, slot: str, wait: float = 10.0) -> bool:
    """A just-stopped walsender can hold the slot for a moment: wait for it to let go."""
    deadline = time.monotonic() + wait
    with connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,)
            ).fetchone()
            if row is None or not row[0]:
                return True
            time.sleep(0.2)
    return False
