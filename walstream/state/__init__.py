"""The state database: its connections, one statement runner, and the base of every store.

walstream keeps its own tables (the delivery ledger, parked messages, backfills,
pull-subscription messages, the event outbox) in one schema (`state.schema`) of a
Postgres database. `db.py` opens and reuses the connections and runs statements
with one retry policy; `store.py` is the base each of those stores builds on.
"""

from walstream.state.db import execute, state_connection
from walstream.state.store import Store

__all__ = ["Store", "execute", "state_connection"]
