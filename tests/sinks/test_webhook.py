"""The webhook sink against a real HTTP server: signatures, the retry matrix, batches.

Signatures are checked with the `standardwebhooks` package (the spec authors'
library), not with walstream's code.
"""

from __future__ import annotations

import base64
import json
import os
from collections import defaultdict

import pytest
from standardwebhooks import Webhook

from tests.servers import WebhookReceiver
from tests.sinks.test_contract import run_batch, workload
from walstream.change import idempotency_key
from walstream.errors import SinkError


def secret() -> str:
    return "whsec_" + base64.b64encode(os.urandom(24)).decode()


@pytest.fixture
def rx() -> WebhookReceiver:
    r = WebhookReceiver().start()
    yield r
    r.stop()


def test_every_request_is_signed_for_each_secret_and_verifies(rx: WebhookReceiver) -> None:
    old, new = secret(), secret()
    sent = workload(2, 5)
    run_batch({"type": "webhook", "url": rx.url(), "secrets": [old, new]}, sent)
    assert len(rx.requests) == len(sent)
    for req, m in zip(rx.requests, sent, strict=True):
        assert req.headers["webhook-id"] == idempotency_key(m.lsn, m.seq)
        assert len(req.headers["webhook-signature"].split(" ")) == 2
        for s in (old, new):  # a receiver on either side of a rotation accepts it
            assert Webhook(s).verify(req.body, req.headers) == json.loads(m.value)
        with pytest.raises(Exception, match="No matching signature"):
            Webhook(secret()).verify(req.body, req.headers)


def test_a_gzipped_request_verifies_on_the_bytes_the_receiver_gets(rx: WebhookReceiver) -> None:
    """One message per request, gzip on: the receiver undoes Content-Encoding (as HTTP
    receivers do) and the standardwebhooks verifier accepts exactly those bytes; the wire
    bytes themselves are compressed, not JSON."""
    key = secret()
    sent = workload(1, 6)
    run_batch({"type": "webhook", "url": rx.url(), "gzip": True, "secrets": [key]}, sent)
    assert len(rx.requests) == len(sent)
    for req, m in zip(rx.requests, sent, strict=True):
        assert req.headers["content-encoding"] == "gzip" and req.body[:2] == b"\x1f\x8b"
        assert req.decoded() == m.value
        assert Webhook(key).verify(req.decoded(), req.headers) == json.loads(m.value)
        with pytest.raises(Exception, match="No matching signature"):
            Webhook(key).verify(req.decoded().replace(b"{", b"{ ", 1), req.headers)


@pytest.mark.parametrize(
    ("status", "retryable", "pause"),
    [(408, True, False), (429, True, False), (500, True, False), (503, True, False),
     (400, False, False), (404, False, False), (422, False, False), (302, False, False),
     (410, True, True)],
)  # fmt: skip
def test_the_answer_decides_retry_dead_letter_or_pause(
    rx: WebhookReceiver, status: int, retryable: bool, pause: bool
) -> None:
    rx.answer = lambda path: status
    rx.retry_after = "7"
    with pytest.raises(SinkError) as err:
        run_batch({"type": "webhook", "url": rx.url()}, workload(1, 2))
    e = err.value
    assert (e.retryable, e.pause) == (retryable, pause), e
    assert f"answered {status}" in e.problem
    assert e.delivered == frozenset()
    assert e.retry_after == (7.0 if retryable and not pause else None)
    # a failed message stops its group: the second was never sent
    assert [s for s, _ in rx.refused] == [status]


def test_a_failing_group_stops_only_itself(rx: WebhookReceiver) -> None:
    sent = workload(3, 4)  # groups 0, 1, 2 interleaved
    bad = sent[4]  # group 1, n 1: routed to a path the receiver fails
    rx.answer = lambda path: 500 if path == "/bad" else 200
    msgs = [m._replace(route=rx.url("/bad")) if m is bad else m for m in sent]
    with pytest.raises(SinkError) as err:
        run_batch({"type": "webhook", "url": rx.url(), "concurrency": 1, "retry_timeout": 0}, msgs)
    got = [json.loads(r.body) for r in rx.requests]
    assert {json.dumps(json.loads(sent[i].value)) for i in err.value.delivered} == {
        json.dumps(v) for v in got
    }
    by_group: dict[int, list[int]] = defaultdict(list)
    for v in got:
        by_group[v["group"]].append(v["n"])
    # group 1 stops at its failed message; groups 0 and 2 go on
    assert by_group == {0: [0, 1, 2, 3], 1: [0], 2: [0, 1, 2, 3]}
    assert len(rx.refused) == 1


def test_batches_carry_a_chunk_in_order_gzipped_over_few_connections(rx: WebhookReceiver) -> None:
    sent = workload(8, 50)
    run_batch(
        {"type": "webhook", "url": rx.url(), "batch": True, "gzip": True, "concurrency": 4,
         "secrets": [key := secret()]},
        sent,
    )  # fmt: skip
    assert all(r.headers["content-encoding"] == "gzip" for r in rx.requests)
    by_group: dict[int, list[int]] = defaultdict(list)
    for r in rx.requests:
        body = r.json()
        assert list(body) == ["data"] and body["data"]
        # signed over the JSON, before compression (what a receiver reads once decoded)
        assert Webhook(key).verify(r.decoded(), r.headers) == body
        for v in body["data"]:
            by_group[v["group"]].append(v["n"])
    assert by_group == {g: list(range(50)) for g in range(8)}
    # 400 messages in chunks of 150, 4 lanes each: at most 12 requests, kept-alive connections
    assert len(rx.requests) <= 12
    assert len(rx.connections) <= 4


def test_one_message_per_request_in_order_per_group_at_concurrency_8(rx: WebhookReceiver) -> None:
    sent = workload(16, 20)
    run_batch({"type": "webhook", "url": rx.url(), "concurrency": 8}, sent)
    by_group: dict[int, list[int]] = defaultdict(list)
    for r in rx.requests:
        v = json.loads(r.body)
        by_group[v["group"]].append(v["n"])
    assert by_group == {g: list(range(20)) for g in range(16)}
    assert len(rx.connections) <= 8  # keep-alive: connections are reused


@pytest.mark.parametrize("method", ["PUT", "PATCH"])
def test_the_configured_method_and_headers_are_sent_and_kept_out_of_errors(
    rx: WebhookReceiver, method: str
) -> None:
    sent = workload(1, 3)
    headers = {"Authorization": "Bearer hook-secret-42", "X-Tenant": "acme"}
    run_batch({"type": "webhook", "url": rx.url(), "method": method, "headers": headers}, sent)
    assert [r.method for r in rx.requests] == [method] * 3
    assert [r.body for r in rx.requests] == [m.value for m in sent]
    for r in rx.requests:
        assert r.headers["authorization"] == "Bearer hook-secret-42"
        assert r.headers["x-tenant"] == "acme"
    rx.answer = lambda path: 500
    with pytest.raises(SinkError) as err:
        run_batch({"type": "webhook", "url": rx.url(), "method": method, "headers": headers,
                   "retry_timeout": 0}, sent)  # fmt: skip
    assert "hook-secret-42" not in str(err.value)  # a header's value is a secret


def test_425_is_retried_and_a_retry_after_date_is_honoured(rx: WebhookReceiver) -> None:
    from email.utils import formatdate
    from time import time

    rx.answer = lambda path: 425
    rx.retry_after = formatdate(time() + 120, usegmt=True)  # an HTTP date, two minutes on
    with pytest.raises(SinkError) as err:
        run_batch({"type": "webhook", "url": rx.url(), "retry_timeout": 0}, workload(1, 1))
    assert err.value.retryable and not err.value.pause
    assert err.value.retry_after is not None and 110 <= err.value.retry_after <= 120
    rx.retry_after = formatdate(time() - 60, usegmt=True)  # a date already past: at once
    with pytest.raises(SinkError) as err:
        run_batch({"type": "webhook", "url": rx.url(), "retry_timeout": 0}, workload(1, 1))
    assert err.value.retry_after == 0.0
