"""The web console in Debian's headless Chromium (driven by Playwright): a live sink from
/health alone, dead letters only with a token, a read token that cannot act, a dead
letter retried with the management token. Screenshots
are saved under $WALSTREAM_TEST_ARTIFACTS (default: test-artifacts/) as console-*.png."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import httpx
import pytest

from tests.conftest import unique
from tests.integration.test_server import AUTH, TOKEN, health, insert, sink, write_config
from walstream.config import load_config
from walstream.runtime import Runtime
from walstream.testing import supervised, wait_until
from walstream.verify.store import DONE, VerificationStore

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

READ_TOKEN = "console-read-token-0123456789"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
ARTIFACTS = Path(os.environ.get("WALSTREAM_TEST_ARTIFACTS", "test-artifacts"))


@pytest.fixture
def page():
    if not Path(CHROMIUM).exists():
        pytest.fail("Chromium is missing: `bin/setup test` installs Debian's chromium package")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        try:
            yield browser.new_page(viewport={"width": 1400, "height": 1000})
        finally:
            browser.close()


def test_console_shows_live_sinks_and_retries_a_dead_letter(spark, db, kafka, tmp_path, page):
    table = unique("orders")
    db.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v text)")
    switch = tmp_path / "refusing"
    switch.touch()
    cfg = load_config(write_config(tmp_path, db, kafka, table, switch, read_token=READ_TOKEN))
    runtime = Runtime(cfg, spark=spark).start()
    assert runtime.server is not None
    url = runtime.server.url
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with supervised(runtime):
        insert(db, table, range(20))
        wait_until(
            lambda: sink(health(url), "files")["delivered"] == 20
            and sink(health(url), "picky")["dead_letters"] == 1,
            120, message=lambda: f"health: {health(url)}",
        )  # fmt: skip
        (dead,) = httpx.get(f"{url}/api/dead-letters", headers=AUTH).json()["items"]
        switch.unlink()  # the destination takes key 3 again: a retry will go through

        page.goto(url)
        files = page.get_by_test_id("sink-files")
        files.get_by_test_id("sink-delivered").filter(has_text="20").wait_for(timeout=15_000)
        assert files.get_by_test_id("sink-status").inner_text() == "ok"
        picky = page.get_by_test_id("sink-picky")
        assert picky.get_by_test_id("sink-status").inner_text() == "warning"
        assert "1 dead letter(s)" in picky.inner_text()
        # Without a token: statuses from /health, no row values.
        assert "enter a read token" in page.locator("#dead").inner_text()
        assert page.get_by_test_id(f"dead-{dead['id']}").count() == 0

        # A wrong token: the page says why and shows nothing more.
        page.fill("#token", "wrong")
        page.dispatch_event("#token", "change")
        page.locator("#notice.bad").filter(has_text="missing or wrong read token").wait_for(
            timeout=10_000
        )
        assert page.get_by_test_id(f"dead-{dead['id']}").count() == 0

        # The read token shows the dead letter and its message, but cannot retry it.
        page.fill("#token", READ_TOKEN)
        page.dispatch_event("#token", "change")
        row = page.get_by_test_id(f"dead-{dead['id']}")
        row.wait_for(timeout=10_000)
        assert "injected failure" in row.inner_text()
        # The token is kept in this tab's session storage only: no cookie, no local storage.
        kept = page.evaluate(
            "[sessionStorage.getItem('walstream-token'), localStorage.length, document.cookie]"
        )
        assert kept == [READ_TOKEN, 0, ""]
        row.get_by_role("link", name=str(dead["id"])).click()
        assert '"id":3' in page.get_by_test_id("dl-message").inner_text(timeout=10_000)
        page.screenshot(path=str(ARTIFACTS / "console-dead-letter.png"), full_page=True)
        row.get_by_role("button", name="Retry").click()
        page.locator("#notice.bad").filter(has_text="missing or wrong bearer token").wait_for(
            timeout=10_000
        )
        assert (
            httpx.get(f"{url}/api/dead-letters/{dead['id']}", headers=AUTH).json()["status"]
            == "dead"
        )

        # The right token: retried, delivered by the retrier, gone from the list.
        page.fill("#token", TOKEN)
        page.dispatch_event("#token", "change")
        row.get_by_role("button", name="Retry").click()
        page.locator("#notice").filter(has_text=f"retry {dead['id']}: done").wait_for(
            timeout=10_000
        )
        wait_until(lambda: sink(health(url), "picky")["delivered"] == 20, 60,
                   message=lambda: f"health: {health(url)}")  # fmt: skip
        row.wait_for(state="detached", timeout=15_000)
        picky.get_by_test_id("sink-status").filter(has_text="ok").wait_for(timeout=15_000)
        page.get_by_test_id("overall").filter(has_text="ok").wait_for(timeout=15_000)
        page.screenshot(path=str(ARTIFACTS / "console-after-retry.png"), full_page=True)

        # A verification's result as `walstream verify` keeps it: the sink's verified column
        # and its status follow the newest one.
        verified = files.get_by_test_id("sink-verified")
        assert verified.inner_text() == "–"
        store = VerificationStore(cfg.state_dsn, cfg.state.schema_)
        found = {"table": f"public.{table}", "target": table, "equal": False, "missing": [[3]]}
        for result, rows in ((found, 1), (found | {"equal": True, "missing": []}, 0)):
            record = store.begin("files", [], None, "command")
            store.table_done(record.id, result, rows)
            store.finish(record.id, DONE)
            if rows:
                verified.filter(has_text=f"1 differ public.{table}").wait_for(timeout=15_000)
                files.get_by_test_id("sink-status").filter(has_text="warning").wait_for(
                    timeout=15_000
                )
                assert "found 1 row(s) that differ" in files.inner_text()
        verified.filter(has_text="equal 1 table(s)").wait_for(timeout=15_000)
        files.get_by_test_id("sink-status").filter(has_text="ok").wait_for(timeout=15_000)
    assert (ARTIFACTS / "console-after-retry.png").stat().st_size > 10_000
