"""What counts as a secret, and that texts, snapshots and log lines are cleaned of them."""

from __future__ import annotations

import logging

from walstream.config import parse_config, sink_snapshot
from walstream.errors import SinkError
from walstream.secrets import (
    MASK,
    guard_logs,
    safe_settings,
    scrub,
    scrubbed,
    secret_values,
)
from walstream.sinks.base import servers_for_messages, url_for_messages

SLACK = "https://hooks.slack.example/services/T0AAA/B0BBB/xoxSecretPath123"
PEM = "-----BEGIN PRIVATE KEY-----MIIEvQIBADANBgkqhkiG9w0B-----END PRIVATE KEY-----"


def config() -> object:
    return parse_config({
        "sources": [{"name": "app",
                     "dsn": "host=127.0.0.1 dbname=app user=u password=pgPass99 sslpassword=keyPass77"}],
        "sinks": [
            {"name": "slack", "source": "app", "destination": {"type": "webhook", "url": SLACK}},
            {"name": "kafka", "source": "app", "destination": {
                "type": "kafka", "bootstrap_servers": "b:9092", "topic": "t",
                "producer": {"acks": "all", "ssl.key.pem": PEM,
                             "sasl.oauthbearer.config": "clientSecret=oauthS3cret"}}},
            {"name": "nats", "source": "app", "destination": {
                "type": "nats", "subject": "s", "servers": "nats://natsuser:natsPw55@n1:4222,nats://n2"}},
        ],
    })  # fmt: skip


def test_every_kind_of_secret_is_found():
    found = secret_values(config())
    for planted in ("pgPass99", "keyPass77", "/services/T0AAA/B0BBB/xoxSecretPath123", PEM,
                    "clientSecret=oauthS3cret", "natsPw55", "natsuser"):  # fmt: skip
        assert planted in found, planted
    assert "all" not in found and "b:9092" not in found


def test_texts_are_scrubbed_also_in_their_url_encoded_form():
    values = secret_values(config())
    text = f"POST {SLACK} failed; dsn password=pgPass99; pem {PEM}; q=natsPw55%21"
    clean = scrub(text, values)
    for planted in ("xoxSecretPath123", "pgPass99", "PRIVATE KEY", "natsPw55"):
        assert planted not in clean
    assert "hooks.slack.example" in clean and clean.count(MASK) >= 4
    encoded = scrub("url https://x/?p=pg%21Pass", {"pg!Pass"})
    assert "pg%21Pass" not in encoded


def test_urls_in_messages_name_the_host_only():
    assert url_for_messages(SLACK) == "https://hooks.slack.example/…"
    assert url_for_messages("https://u:p@h.example:8443/") == "https://h.example:8443"
    assert url_for_messages("redis://:pw@r:6380/0", 6379) == "redis://r:6380/…"
    assert servers_for_messages("nats://a:b@n1:4222, nats://n2") == "nats://n1:4222,nats://n2"


def test_dead_letter_snapshots_keep_settings_but_no_secret():
    cfg = config()
    text = str([sink_snapshot(s) for s in cfg.sinks])  # type: ignore[attr-defined]
    for planted in ("xoxSecretPath123", "PRIVATE KEY", "oauthS3cret", "natsPw55", "pgPass99"):
        assert planted not in text, planted
    kafka = sink_snapshot(cfg.sinks[1])  # type: ignore[attr-defined]
    assert kafka["destination"]["producer"] == {
        "acks": "all", "ssl.key.pem": MASK, "sasl.oauthbearer.config": MASK,
    }  # fmt: skip
    assert safe_settings({"linger.ms": 5, "sasl.password": "x"}) == {
        "linger.ms": 5, "sasl.password": MASK,
    }  # fmt: skip


def test_sink_errors_and_log_lines_are_scrubbed():
    values = secret_values(config())
    exc = SinkError(f"webhook {SLACK}: 404", "check natsPw55", retryable=False, delivered={1})
    clean = scrubbed(exc, values)
    assert "xoxSecretPath123" not in str(clean) and "natsPw55" not in str(clean)
    assert clean.delivered == {1} and clean.retryable is False

    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(self.format(record))

    handler = Keep()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        guard_logs(values)
        logging.getLogger("walstream.test").warning("sent to %s with %s", SLACK, PEM)
        try:
            raise RuntimeError(f"boom pgPass99 {SLACK}")
        except RuntimeError:
            logging.getLogger("walstream.test").exception("failed")
    finally:
        root.removeHandler(handler)
    joined = "\n".join(records)
    assert "sent to" in joined and "boom" in joined
    for planted in ("xoxSecretPath123", "PRIVATE KEY", "pgPass99"):
        assert planted not in joined, planted
