"""A Python consumer of walstream's pull streams (`type: stream` sinks).

    from walstream.client import subscribe

    with subscribe("http://127.0.0.1:8376", "orders", token="...",
                   progress_file="orders.progress") as sub:
        for m in sub:
            apply(m.action, m.table, m.key, m.message)

The subscription long-polls `GET /v1/streams/{stream}/messages`. A message counts as
processed once the loop asks for the next one, or leaves the `with` block without an
exception; the progress marker of the last processed message is saved to
`progress_file` (atomically) and/or acknowledged for the consumer `group`, after each
page of messages and when the block is left. A restarted consumer resumes right after
it: nothing is skipped, and what is received twice is at most the page in flight when
the process died (every message has its `idempotency_key`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from walstream.backoff import Backoff

_RETRY = Backoff(0.2, 5.0)  # between attempts of a failed read or save


class StreamError(Exception):
    """The server refused a read: `status`, `problem` and what to do (`fix`)."""

    def __init__(self, status: int, problem: str, fix: str | None = None) -> None:
        super().__init__(f"{problem} (HTTP {status})" + (f" — fix: {fix}" if fix else ""))
        self.status, self.problem, self.fix = status, problem, fix


class Gap(StreamError):
    """HTTP 410: messages after the consumer's position were deleted by the stream's
    retention. Rebuild the consumer's state, then subscribe from now (no position)."""


@dataclass(frozen=True)
class StreamMessage:
    source: str
    table: str
    action: str  # with coalescing: the net action of the changes it stands for
    key: str | None
    lsn: int
    seq: int
    idempotency_key: str
    progress: str  # resume right after this message: pass it as `after`
    message: Any  # the formatted change (the sink's format), parsed JSON
    coalesced: int | None = None  # with coalescing: how many changes it stands for


class Subscription:
    """An iterator of StreamMessages that saves its progress (see the module docstring)."""

    def __init__(
        self,
        url: str,
        stream: str,
        *,
        token: str | None = None,
        after: str | None = None,
        group: str | None = None,
        progress_file: str | Path | None = None,
        limit: int = 500,
        wait: float = 30.0,
        coalesce: bool = False,
        retry_for: float = 60.0,
    ) -> None:
        self.stream = stream
        self.group = group
        self.progress_file = Path(progress_file) if progress_file is not None else None
        self.limit, self.wait, self.coalesce, self.retry_for = limit, wait, coalesce, retry_for
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(
            base_url=url.rstrip("/"), headers=headers, timeout=httpx.Timeout(wait + 30.0)
        )
        saved = None
        if self.progress_file is not None and self.progress_file.exists():
            saved = self.progress_file.read_text().strip() or None
        #: Where the next read starts, as sent: a marker, `group:<name>`, or "" (now).
        self._next = after or saved or (f"group:{group}" if group else "")
        #: The marker after the last processed message (None: nothing processed yet).
        self.progress: str | None = after or saved
        self._saved = self.progress
        self._pending: str | None = None  # the message handed out, not yet known processed

    def __iter__(self) -> Iterator[StreamMessage]:
        while True:
            page = self._read()
            for m in page["messages"]:
                self._pending = m["progress"]
                yield StreamMessage(**m)
                self.progress, self._pending = m["progress"], None
            self.progress = self._next = page["progress"]
            self.save()

    def _read(self) -> dict[str, Any]:
        params: dict[str, str | int] = {
            "after": self._next,
            "limit": self.limit,
            "wait": f"{self.wait:g}s",
            "coalesce": str(self.coalesce).lower(),
        }
        deadline = time.monotonic() + self.retry_for
        tries = 0
        while True:
            try:
                r = self.http.get(f"/v1/streams/{self.stream}/messages", params=params)
            except httpx.TransportError as exc:
                problem: Any = f"cannot reach walstream: {exc}"
            else:
                if r.status_code == 200:
                    return dict(r.json())
                if r.status_code < 500 and r.status_code != 429:
                    raise _error(r)
                problem = _error(r)
            tries += 1
            if time.monotonic() >= deadline:
                raise problem if isinstance(problem, StreamError) else StreamError(503, problem)
            time.sleep(_RETRY.delay(tries + 1))

    def save(self) -> None:
        """Store the progress: `progress_file` (atomically) and the group's checkpoint."""
        if self.progress is None or self.progress == self._saved:
            return
        if self.progress_file is not None:
            tmp = self.progress_file.with_name(self.progress_file.name + ".tmp")
            with open(tmp, "w") as f:
                f.write(self.progress)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.progress_file)
        if self.group is not None:
            r = self.http.post(
                f"/v1/streams/{self.stream}/groups/{self.group}/ack",
                json={"progress": self.progress},
            )
            if r.status_code != 200:
                raise _error(r)
        self._saved = self.progress

    def __enter__(self) -> Subscription:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if kind is None and self._pending is not None:  # left the loop after processing it
                self.progress, self._pending = self._pending, None
            self.save()
        finally:
            self.http.close()

    def close(self) -> None:
        """Save the progress of the messages known processed, and close the connection."""
        try:
            self.save()
        finally:
            self.http.close()


def subscribe(url: str, stream: str, **kw: Any) -> Subscription:
    """A Subscription to `stream` of the walstream server at `url`; see Subscription."""
    return Subscription(url, stream, **kw)


def _error(r: httpx.Response) -> StreamError:
    try:
        detail = r.json().get("detail")
    except ValueError:
        detail = None
    if isinstance(detail, dict):
        problem, fix = str(detail.get("problem")), detail.get("fix")
    else:
        problem, fix = (str(detail) if detail else r.text[:300] or r.reason_phrase), None
    return (Gap if r.status_code == 410 else StreamError)(r.status_code, problem, fix)
