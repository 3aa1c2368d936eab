"""The console's management buttons in Debian's headless Chromium, on a real server over a
real state database, without Spark: Pause and Resume of a sink, Cancel of a backfill,
each done with the management token and seen in the state the pipeline reads."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.test_console import page  # noqa: F401  (the fixture)
from tests.serving import StoreOnly
from walstream.backfill.requests import request
from walstream.backfill.store import BackfillStore
from walstream.config import parse_config
from walstream.delivery.parking import ParkingLot
from walstream.server import Server
from walstream.server.metrics import Metrics
from walstream.server.monitor import Monitor
from walstream.testing import wait_until

TOKEN = "console-api-token-0123456789"


@pytest.fixture
def served(db: Any, tmp_path: Any) -> Iterator[tuple[str, ParkingLot, BackfillStore, int]]:
    db.execute("CREATE TABLE big (id int PRIMARY KEY)")
    cfg = parse_config({
        "server": {"port": 0, "token": TOKEN},
        "spark": {"checkpoint_dir": str(tmp_path / "ckpt")},
        "sources": [{"name": "app", "dsn": db.dsn, "slot": db.create_slot(),
                     "publication": db.create_publication("big")}],
        "sinks": [{"name": "hook", "source": "app",
                   "destination": {"type": "webhook", "url": "http://127.0.0.1:9/h"}}],
    })  # fmt: skip
    lot = ParkingLot(db.dsn, "walstream")
    lot.ensure()
    store = BackfillStore(cfg.state_dsn)
    store.ensure()
    (backfill,) = request(cfg, store, "hook", ["public.big"])
    control = StoreOnly(cfg, parking=lot, backfills=store)
    server = Server(control, Monitor(control, ttl=0), Metrics()).start()  # type: ignore[arg-type]
    try:
        yield server.url, lot, store, backfill.id
    finally:
        server.stop()


def test_pause_resume_and_cancel_from_the_console(served, page):  # noqa: F811
    url, lot, store, backfill = served
    page.goto(url)
    hook = page.get_by_test_id("sink-hook")
    hook.get_by_test_id("sink-status").filter(has_text="ok").wait_for(timeout=15_000)
    page.fill("#token", TOKEN)
    page.dispatch_event("#token", "change")

    hook.get_by_role("button", name="Pause").click()
    page.locator("#notice").filter(has_text="pause hook: done").wait_for(timeout=10_000)
    assert "hook" in lot.paused()  # what the pipeline and the retrier read
    hook.get_by_test_id("sink-status").filter(has_text="paused").wait_for(timeout=10_000)
    hook.get_by_role("button", name="Resume").click()
    page.locator("#notice").filter(has_text="resume hook: done").wait_for(timeout=10_000)
    wait_until(lambda: "hook" not in lot.paused(), 10)
    hook.get_by_test_id("sink-status").filter(has_text="ok").wait_for(timeout=10_000)

    row = page.get_by_test_id(f"backfill-{backfill}")
    row.filter(has_text="pending").wait_for(timeout=10_000)
    row.get_by_role("button", name="Cancel").click()
    page.locator("#notice").filter(has_text=f"cancel backfill {backfill}: done").wait_for(
        timeout=10_000
    )
    assert store.get(backfill).status == "cancelled"  # type: ignore[union-attr]
    row.filter(has_text="cancelled").wait_for(timeout=10_000)
    assert row.get_by_role("button", name="Cancel").count() == 0
