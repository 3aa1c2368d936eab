"""One asyncio event loop per worker process, for sinks whose clients are asyncio-only.

The loop runs on a daemon thread and keeps the clients' connections between
tasks; a sink's `deliver` submits a coroutine and waits for it with a deadline.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

T = TypeVar("T")

_LOOP: asyncio.AbstractEventLoop | None = None
_LOCK = threading.Lock()


def loop() -> asyncio.AbstractEventLoop:
    global _LOOP
    with _LOCK:
        if _LOOP is None or _LOOP.is_closed():
            new = asyncio.new_event_loop()
            threading.Thread(target=new.run_forever, name="walstream-aio", daemon=True).start()
            _LOOP = new
        return _LOOP


def run(coro: Coroutine[Any, Any, T], timeout: float) -> T:
    """Run `coro` on the loop; TimeoutError (after cancelling it) past `timeout` seconds."""
    fut = asyncio.run_coroutine_threadsafe(coro, loop())
    try:
        return fut.result(timeout)
    except FutureTimeout:
        fut.cancel()
        raise TimeoutError(f"no answer within {timeout:.0f}s") from None
