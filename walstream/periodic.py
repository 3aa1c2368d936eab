"""A task that runs again and again on its own thread: retries, backfills, heartbeats, retention."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class Periodic:
    """Calls `step()` on a daemon thread until `stop()`.

    `step` returns the seconds to wait before its next call, or None for `interval`.
    The first call comes after `first` seconds (default `interval`). An exception is
    logged at `level` — once while the same message repeats, again when it changes —
    and the next call comes after `on_error` seconds (default `interval`). A step that
    succeeds after failures clears the repeat filter. `cleanup()` runs on the thread
    when it ends (closing what the steps opened).
    """

    def __init__(
        self,
        name: str,
        step: Callable[[], float | None],
        interval: float,
        *,
        first: float | None = None,
        on_error: float | None = None,
        level: int = logging.ERROR,
        what: str = "",
        cleanup: Callable[[], object] | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        self.name = name
        self.step = step
        self.interval = interval
        self.first = interval if first is None else first
        self.on_error = interval if on_error is None else on_error
        self.level = level
        self.what = what or name
        self.cleanup = cleanup
        self.log = logger or log  # the owner's logger: operators filter by it
        self.stopping = threading.Event()
        self.last_error: str | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> Periodic:
        self._thread.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self.stopping.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def run_once(self) -> float:
        """One step, with the error policy above; the seconds until the next one."""
        try:
            wait = self.step()
        except Exception as exc:
            if self.stopping.is_set():
                return 0.0
            text = str(exc)
            if text != self.last_error:
                self.log.log(self.level, "%s: %s", self.what, text)
                self.log.debug("%s failed", self.what, exc_info=True)
            self.last_error = text
            return self.on_error
        self.last_error = None
        return self.interval if wait is None else wait

    def _run(self) -> None:
        wait = self.first
        try:
            while not self.stopping.wait(wait):
                wait = self.run_once()
        finally:
            if self.cleanup is not None:
                self.cleanup()
