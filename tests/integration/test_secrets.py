"""Planted secrets never leave: `walstream run`'s log, /health, /metrics, the API, the
console, dead-letter config snapshots, `walstream status --json`, `dead-letters show`
and `walstream check` are searched for every one of them.

Planted: libpq `password` and `sslpassword` in a source DSN, a Slack-style webhook URL
whose path is the secret (its receiver refuses one row: a dead letter), Kafka producer
settings holding key material (the broker is down: its errors are logged again and
again), NATS credentials in a server URL (also down), and the API's tokens.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import yaml

from tests.integration.test_run_crash import Run
from tests.servers import WebhookReceiver
from walstream.testing import free_port, wait_until

PG_PASSWORD = "pgPlantedPw4821"
SSL_PASSWORD = "sslPlantedPw9034"
SLACK_PATH = "/services/T0PLANT/B0PLANT/slackPlantedPath7765"
OAUTH = "clientSecret=oauthPlanted3309"
KEY_PASSWORD = "kafkaKeyPlantedPw5521"
NATS_PASSWORD = "natsPlantedPw1187"
TOKEN = "apiPlantedToken-2b8e1f0a9c"
READ_TOKEN = "readPlantedToken-77c1d0e2aa"
PLANTED = [PG_PASSWORD, SSL_PASSWORD, SLACK_PATH, "slackPlantedPath7765", OAUTH,
           "oauthPlanted3309", KEY_PASSWORD, NATS_PASSWORD, TOKEN, READ_TOKEN]  # fmt: skip
_URL = re.compile(r"console at (http://\S+)")


def leaks(name: str, text: str) -> list[str]:
    found = []
    for secret in PLANTED:
        for form in {secret, quote(secret, safe=""), quote(secret)}:
            if form in text:
                found.append(f"{name}: {secret!r}")
    return found


def cli(*args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "walstream.cli", *args], capture_output=True,
                         text=True, timeout=180)  # fmt: skip
    return out.stdout + out.stderr


def test_planted_secrets_appear_in_no_output(db, other_db, tmp_path: Path) -> None:
    rx = WebhookReceiver().start()
    rx.answer = lambda path: 404 if path.endswith("refuse") else 200
    try:
        run_and_search(db, other_db, tmp_path, rx)
    finally:
        rx.stop()


def run_and_search(db: Any, other_db: Any, tmp_path: Path, rx: WebhookReceiver) -> None:
    db.execute("CREATE TABLE orders (id int PRIMARY KEY, kind text)")
    other_db.execute("CREATE TABLE events (id int PRIMARY KEY)")
    sep = "&" if "?" in db.dsn else "?"
    dsn = f"{db.dsn}{sep}password={PG_PASSWORD}&sslpassword={SSL_PASSWORD}"
    slack = f"http://127.0.0.1:{rx.port}{SLACK_PATH}"
    down = free_port()
    config = tmp_path / "walstream.yaml"
    config.write_text(yaml.safe_dump({
        "server": {"port": 0, "token": TOKEN, "read_token": READ_TOKEN},
        "spark": {"master": "local[2]", "checkpoint_dir": str(tmp_path / "ckpt")},
        "sources": [{"name": "shop", "dsn": dsn, "tables": ["public.orders"]},
                    {"name": "feed", "dsn": other_db.dsn, "tables": ["public.events"]}],
        "sinks": [
            # Rows of kind 'refuse' go to <slack URL>refuse, which answers 404: a dead letter.
            {"name": "slack", "source": "shop", "max_attempts": 1,
             "destination": {"type": "webhook", "timeout": "5s", "retry_timeout": "1s",
                             "url": f"concat('{slack}', get_json_object(record, '$.kind'))"}},
            {"name": "kafka", "source": "feed", "destination": {
                "type": "kafka", "bootstrap_servers": f"127.0.0.1:{down}", "topic": "t",
                "retry_timeout": "2s",
                "producer": {"sasl.oauthbearer.config": OAUTH, "ssl.key.password": KEY_PASSWORD,
                             "acks": "all"}}},
            {"name": "nats", "source": "feed", "destination": {
                "type": "nats", "subject": "s", "timeout": "2s",
                "servers": f"nats://natsuser:{NATS_PASSWORD}@127.0.0.1:{down}"}},
        ],
    }))  # fmt: skip
    db.slots.append("walstream_shop")
    other_db.slots.append("walstream_feed")
    auth = {"Authorization": f"Bearer {READ_TOKEN}"}
    run = Run(config, tmp_path)
    try:
        wait_until(lambda: bool(_URL.findall(run.output())) or run.proc.poll() is not None,
                   180, message=lambda: run.output()[-3000:])  # fmt: skip
        found = _URL.findall(run.output())
        assert found, run.output()[-3000:]
        url = found[0]
        for i, kind in enumerate(["ok", "ok", "refuse", "ok"]):
            db.execute("INSERT INTO orders VALUES (%s, %s)", (i, kind))
        other_db.execute("INSERT INTO events VALUES (1)")  # its sinks are down: errors

        def dead() -> list[dict[str, Any]]:
            r = httpx.get(f"{url}/api/dead-letters", headers=auth, timeout=10)
            return list(r.json()["items"]) if r.status_code == 200 else []

        wait_until(lambda: len(dead()) == 1 and len(rx.requests) == 3, 120,
                   message=lambda: f"{dead()} {len(rx.requests)}\n{run.output()[-3000:]}")  # fmt: skip
        wait_until(
            lambda: "kafka" in run.output().lower() and "NATS" in run.output(),
            120,
            message=lambda: run.output()[-3000:],
        )  # the down sinks' errors were logged
        (letter,) = dead()
        outputs = {
            "/health": httpx.get(f"{url}/health").text,
            "/metrics": httpx.get(f"{url}/metrics").text,
            "console": httpx.get(f"{url}/").text,
            "/api/sources": httpx.get(f"{url}/api/sources", headers=auth).text,
            "/api/sinks": httpx.get(f"{url}/api/sinks", headers=auth).text,
            "/api/dead-letters": httpx.get(f"{url}/api/dead-letters", headers=auth).text,
            "dead letter": httpx.get(f"{url}/api/dead-letters/{letter['id']}", headers=auth).text,
            "/api/backfills": httpx.get(f"{url}/api/backfills", headers=auth).text,
            "/openapi.json": httpx.get(f"{url}/openapi.json").text,
            "status --json": cli("status", "--url", url, "--json"),
            "status": cli("status", "--url", url),
            "dead-letters show": cli("dead-letters", "show", str(letter["id"]), "-c", str(config)),
            "dead-letters list": cli("dead-letters", "list", "-c", str(config)),
            "check": cli("check", "-c", str(config)),
        }
    finally:
        run.kill()
    outputs["walstream run's log"] = run.output()
    # What each output had to show, so the search below cannot pass on empty pages.
    shown = httpx.Response(200, text=outputs["dead letter"]).json()
    assert shown["sink_config"]["destination"]["type"] == "webhook"
    assert shown["sink"] == "slack" and "404" in shown["last_error"]
    assert "127.0.0.1" in outputs["dead letter"]  # the host is shown, not the path
    assert "sink slack" in outputs["check"] and "sink kafka" in outputs["check"]
    assert "Kafka" in outputs["walstream run's log"] and "NATS" in outputs["walstream run's log"]
    assert '"slack"' in outputs["status --json"]
    problems = [leak for name, text in outputs.items() for leak in leaks(name, text)]
    assert problems == [], "\n".join(problems)
