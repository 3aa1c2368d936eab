"""HTTP webhook sink (`type: webhook`): httpx, keep-alive, Standard Webhooks signatures.

One request per message (the body is the formatted message), or with `batch: true`
one request per chunk and URL with the body `{"data": [message, ...]}`. Up to
`concurrency` requests run at once: messages are spread over that many lanes by
group key, and a lane sends its messages one after the other, so a group's
messages arrive in order. Once a message of a group fails, the lane sends no later
message of that group in this chunk.

Headers (https://www.standardwebhooks.com): `webhook-id` (the idempotency key,
base64 "lsn:seq"; for a batch, the first message's key and the count),
`webhook-timestamp` (unix seconds) and, with `secrets`, `webhook-signature`:
`v1,<base64 HMAC-SHA256 of "id.timestamp.body">` per secret, space-separated, so
receivers can rotate secrets. Plus the configured `headers`.

Answers: 2xx delivered. 408, 429, 5xx, timeouts and connection errors are
retryable (`Retry-After` honoured). 410 Gone pauses the sink. Other 4xx and 3xx are
not retryable: the message becomes a dead letter.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import hmac
import re
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from email.utils import parsedate_to_datetime
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator

from walstream.errors import SinkError, optional_import
from walstream.fields import Duration
from walstream.sinks.base import Message, MessageDestination, MessageSink, url_for_messages
from walstream.sinks.clients import Clients
from walstream.sinks.registry import register

#: Shortest signing secret accepted (bytes after base64; Standard Webhooks: 24 to 64).
MIN_WEBHOOK_SECRET = 24


class WebhookDestination(MessageDestination):
    """HTTP webhooks: one request per message, or per chunk with `batch: true`
    (`{"data": [...]}`), signed per the Standard Webhooks spec when `secrets` are set."""

    type: Literal["webhook"]
    url: str = Field(min_length=1)  # an http(s) URL, or a Spark SQL expression giving one
    method: Literal["POST", "PUT", "PATCH"] = "POST"
    headers: dict[str, SecretStr] = Field(default_factory=dict)  # e.g. Authorization
    timeout: Duration = 30.0  # per request
    batch: bool = False
    gzip: bool = False
    secrets: list[SecretStr] = Field(default_factory=list)  # whsec_...; several while rotating
    concurrency: int = Field(1, ge=1, le=256)  # requests at once (per task); order kept per group

    @field_validator("secrets")
    @classmethod
    def _whsec(cls, v: list[SecretStr]) -> list[SecretStr]:
        import base64
        import binascii

        generate = (
            'generate one with: python -c "import base64,os; '
            "print('whsec_' + base64.b64encode(os.urandom(32)).decode())\""
        )
        for s in v:
            raw = s.get_secret_value()
            try:
                key = base64.b64decode(raw.removeprefix("whsec_"), validate=True)
            except binascii.Error:
                raise ValueError(
                    "a signing secret is 'whsec_' followed by base64 (Standard Webhooks); "
                    + generate
                ) from None
            if len(key) < MIN_WEBHOOK_SECRET:
                raise ValueError(
                    f"a signing secret of {len(key)} bytes is too short to sign with: at least "
                    f"{MIN_WEBHOOK_SECRET} random bytes; " + generate
                )
        return v

    def route_expression(self) -> str | None:
        literal = re.match(r"^https?://[^\s'\"()`]+$", self.url)
        return None if literal else self.url


_CLIENTS: Clients[Any] = Clients()
_POOLS: Clients[ThreadPoolExecutor] = Clients()
_RETRYABLE = {408, 425, 429}


def _httpx() -> Any:
    return optional_import("httpx", "httpx (the webhook sink)", "webhook")


def client_for(timeout: float, connections: int) -> Any:
    """One pooled keep-alive client per settings per worker process (thread-safe)."""
    httpx = _httpx()
    return _CLIENTS.get(
        (timeout, connections),
        lambda: httpx.Client(
            timeout=timeout,
            limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
            follow_redirects=False,
        ),
    )


def _pool(n: int) -> ThreadPoolExecutor:
    return _POOLS.get(n, lambda: ThreadPoolExecutor(n, thread_name_prefix="walstream-webhook"))


def sign(secrets: Sequence[str], msg_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` header value for these secrets (Standard Webhooks, v1)."""
    content = f"{msg_id}.{timestamp}.".encode() + body
    sigs = []
    for secret in secrets:
        key = base64.b64decode(secret.removeprefix("whsec_"))
        digest = hmac.new(key, content, hashlib.sha256).digest()
        sigs.append("v1," + base64.b64encode(digest).decode())
    return " ".join(sigs)


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        return max(parsedate_to_datetime(value).timestamp() - time.time(), 0.0)
    except (TypeError, ValueError):
        return None


@register
class WebhookSink(MessageSink):
    settings_model = WebhookDestination
    extra = "webhook"
    config: WebhookDestination

    def __init__(self, config: WebhookDestination) -> None:
        super().__init__(config)
        self.secrets = [s.get_secret_value() for s in config.secrets]
        self.headers = {k: v.get_secret_value() for k, v in config.headers.items()}

    # -- one request --------------------------------------------------------------------------
    def _send(self, url: str, msg_id: str, body: bytes) -> SinkError | None:
        """POST one body; None when the receiver took it, else the classified error."""
        httpx = _httpx()
        ts = int(time.time())
        headers = {"content-type": "application/json", **self.headers}
        headers["webhook-id"] = msg_id
        headers["webhook-timestamp"] = str(ts)
        if self.secrets:
            headers["webhook-signature"] = sign(self.secrets, msg_id, ts, body)
        if self.config.gzip:
            body = gzip.compress(body, compresslevel=5)
            headers["content-encoding"] = "gzip"
        client = client_for(self.config.timeout, self.config.concurrency)
        try:
            r = client.request(self.config.method, url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            return SinkError(
                f"webhook {url_for_messages(url)}: {type(exc).__name__}: {exc or 'no answer'}",
                "check that the receiver is up and answers within destination.timeout",
                retryable=True,
            )
        code = r.status_code
        if 200 <= code < 300:
            return None
        text = r.text[:200].strip().replace("\n", " ")
        problem = f"webhook {url_for_messages(url)} answered {code} {r.reason_phrase}: {text!r}"
        if code == 410:
            return SinkError(
                problem,
                "the receiver is gone: fix destination.url, then `walstream resume` the sink "
                "(walstream paused it)",
                retryable=True,
                pause=True,
            )
        if code in _RETRYABLE or code >= 500:
            return SinkError(
                problem,
                "the receiver is failing or busy; walstream retries",
                retryable=True,
                retry_after=_retry_after(r.headers.get("retry-after")),
            )
        return SinkError(
            problem,
            "the receiver refuses this message: fix the receiver or the message "
            "(transform), then `walstream dead-letters retry`",
            retryable=False,
        )

    # -- lanes --------------------------------------------------------------------------------
    def _lane(self, messages: Sequence[Message], idx: list[int]) -> dict[int, SinkError]:
        """Send one lane's messages in order; the failures by index."""
        failed: dict[int, SinkError] = {}
        if self.config.batch:
            by_url: dict[str, list[int]] = {}
            for i in idx:
                by_url.setdefault(messages[i].route or self.config.url, []).append(i)
            for url, ids in by_url.items():
                first = messages[ids[0]]
                body = b'{"data":[' + b",".join(messages[i].value or b"null" for i in ids) + b"]}"
                err = self._send(url, f"{first.idempotency_key}.{len(ids)}", body)
                if err is not None:
                    failed.update(dict.fromkeys(ids, err))
            return failed
        stopped: dict[str, SinkError] = {}  # group -> the failure that stops it
        gone: SinkError | None = None  # a 410: nothing more from this lane
        for i in idx:
            m = messages[i]
            stop = gone or stopped.get(m.group)
            if stop is not None:
                failed[i] = stop
                continue
            err = self._send(m.route or self.config.url, m.idempotency_key, m.value or b"null")
            if err is not None:
                failed[i] = stopped[m.group] = err
                if err.pause:
                    gone = err
        return failed

    def deliver(self, messages: Sequence[Message]) -> None:
        if not messages:
            return
        n = min(self.config.concurrency, len(messages))
        lanes: list[list[int]] = [[] for _ in range(n)]
        for i, m in enumerate(messages):
            lanes[hash(m.group) % n if n > 1 else 0].append(i)
        lanes = [lane for lane in lanes if lane]
        if len(lanes) == 1:
            failed = self._lane(messages, lanes[0])
        else:
            failed = {}
            for part in _pool(self.config.concurrency).map(
                lambda lane: self._lane(messages, lane), lanes
            ):
                failed.update(part)
        if not failed:
            return
        first = min(failed)
        err = next((e for e in failed.values() if e.pause), failed[first])
        raise SinkError(
            f"{err.problem} ({len(failed)} of {len(messages)} messages not delivered)",
            err.fix,
            retryable=err.retryable,
            retry_after=err.retry_after,
            pause=err.pause,
            delivered=frozenset(range(len(messages))) - failed.keys(),
        )

    def test_connection(self) -> None:
        if self.config.route_expression() is not None:
            return  # the URL is computed per message: nothing fixed to reach
        httpx = _httpx()
        try:
            client_for(self.config.timeout, self.config.concurrency).request(
                "HEAD", self.config.url, headers=self.headers
            )
        except httpx.HTTPError as exc:
            raise SinkError(
                f"webhook {url_for_messages(self.config.url)}: cannot reach it: {type(exc).__name__}: {exc}",
                "check destination.url and that the receiver is up",
                retryable=True,
            ) from exc
