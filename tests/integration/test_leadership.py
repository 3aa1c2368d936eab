"""The leader lock against a real Postgres: a leader whose lock session dies knows it at
its next check and stands down, a standby takes the lock over, and the old leader cannot
take it back while the new one holds it."""

from __future__ import annotations

from typing import Any

from walstream.state.leadership import Leadership


def test_a_leader_that_lost_its_lock_session_stands_down_and_a_standby_takes_over(db: Any) -> None:
    leader, standby = Leadership(db.dsn, "walstream", "app"), Leadership(db.dsn, "walstream", "app")
    try:
        assert leader.try_acquire() and leader.holds()
        assert not standby.try_acquire()
        pid = leader._conn.info.backend_pid
        db.execute("SELECT pg_terminate_backend(%s)", (pid,))  # the session is gone: the lock too
        assert not leader.holds()  # its next check says so
        assert not leader.held
        assert standby.try_acquire() and standby.holds()
        assert not leader.try_acquire()  # while the new leader holds it
        standby.release()
        assert leader.try_acquire()
    finally:
        leader.release()
        standby.release()
