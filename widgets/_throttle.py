"""Coalesce updates from worker threads: at most one refresh per interval.

A run's worker thread reports every step and effect; a fast agent would flood the
front end if each report redrew the panel. :class:`Throttle` turns any number of
:meth:`~Throttle.poke` calls into at most one refresh per ``interval`` seconds, made
by one short-lived daemon thread, which also ticks every ``tick`` seconds while
``active()`` is true (so the time spent in the current step keeps moving).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

__all__ = ["Throttle"]


class Throttle:
    def __init__(
        self,
        refresh: Callable[[], None],
        *,
        interval: float = 0.1,
        tick: float = 0.5,
        active: Callable[[], bool] = lambda: False,
    ) -> None:
        self._refresh = refresh
        self.interval = interval
        self.tick = tick
        self.active = active
        self.pokes = 0
        self.refreshes = 0
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._refresh_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._last = 0.0

    def poke(self) -> None:
        """Ask for a refresh soon (safe from any thread, cheap)."""
        self.pokes += 1
        self._wake.set()
        with self._lock:
            if self._closed:
                return
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, daemon=True, name="kernelext-panel-updates"
                )
                self._thread.start()

    def refresh_now(self) -> None:
        """Refresh synchronously (button clicks, the end of a cell)."""
        self._do_refresh()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            thread = self._thread
        self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(2.0)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def running(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    def _loop(self) -> None:
        while True:
            woke = self._wake.wait(self.tick)
            if self._closed:
                return
            wait = self.interval - (time.monotonic() - self._last)
            if wait > 0:
                time.sleep(wait)  # whatever arrives meanwhile is drawn by the same refresh
            self._wake.clear()
            self._do_refresh()
            if woke or self.active():
                continue
            with self._lock:
                if self._wake.is_set() and not self._closed:
                    continue
                self._thread = None
                return

    def _do_refresh(self) -> None:
        with self._refresh_lock:
            self._last = time.monotonic()
            self.refreshes += 1
            with contextlib.suppress(Exception):  # a drawing error must not kill the updater
                self._refresh()
