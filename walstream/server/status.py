"""What the server reads from the process it serves: published status, and the stores.

The runtime implements `Control` (it publishes a `SourceStatus` per source and each
sink's `SinkProgress`); the server never sees Spark queries or the runtime's internals.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from walstream.backfill.store import BackfillStore
    from walstream.config import Plan
    from walstream.delivery.parking import ParkingLot
    from walstream.delivery.progress import SinkProgress
    from walstream.state.outbox import Outbox
    from walstream.streams.store import StreamStore
    from walstream.verify.store import VerificationStore


@dataclass(frozen=True)
class SourceStatus:
    """One source's pipeline as the runtime last saw it."""

    name: str
    slot: str
    dsn: str = field(repr=False)  # to look at the slot (may hold a password)
    leader: bool = True  # False: another walstream leads it (standby)
    streaming: bool = False  # its query is running
    failures: int = 0  # in a row
    restarts: int = 0  # since start
    last_error: str | None = None  # "Kind: message" (may quote row values: token holders only)
    last_error_kind: str | None = None  # "Kind" alone: what /health shows to anyone
    #: The last error stopped the query and it is not running now.
    failed: bool = False
    ingested: int = 0
    batches: int = 0
    last_batch_at: float = 0.0
    #: Sinks whose batches wait (e.g. on max_parked), and why.
    holding: Mapping[str, str] = field(default_factory=dict)


class Control(Protocol):
    """The process the server serves (`walstream run`'s Runtime)."""

    @property
    def config(self) -> Plan: ...

    @property
    def secrets(self) -> set[str]: ...

    @property
    def parking(self) -> ParkingLot | None: ...

    @property
    def backfills(self) -> BackfillStore | None: ...

    @property
    def streams(self) -> StreamStore | None: ...

    @property
    def outbox(self) -> Outbox | None: ...

    @property
    def verifications(self) -> VerificationStore | None: ...

    @property
    def rates(self) -> dict[str, float]: ...

    def sources(self) -> list[SourceStatus]:
        """Each source's status now."""
        ...

    def progress(self) -> dict[str, SinkProgress]:
        """Each sink's counts now (copies)."""
        ...
