"""A run's process takes the stop requests other processes posted beside a busy store.

While a process keeps the DuckDB file (a long ``kx.sql``), a ``kernelext stop`` or a
panel's Stop elsewhere cannot write the run's row; it journals the request in a file of
its own beside the store (``Store.post_stop_if_busy``). The process that executes the
run reads those files (never the store) from the run's monitor, each tick, and at each
``%%agent`` boundary: the request is queued into this process's own journal first (so it
is folded before the suspension it causes), then the run's stop flag goes up, and a
forced one is forced as ``Handle.force_stop`` forces it.
"""

from __future__ import annotations

import contextlib
import time

from ..._store import Store
from ..process.runtime import runtime
from .run_engine import RunEngine

__all__ = ["POSTED_POLL_SECONDS", "PostedStops"]

POSTED_POLL_SECONDS = 0.2  # how often a run's monitor looks beside the store


class PostedStops:
    """The stop requests posted for one run executing in this process."""

    def __init__(self, store: Store, run: RunEngine) -> None:
        self.store = store
        self.run = run
        self.reader = store.foreign_stops()
        self.since = store.now()  # a request older than this execution is not for it
        self._due = 0.0

    def take(self, *, every: float = 0.0) -> bool:
        """Look (at most every ``every`` seconds); True when a stop was taken now."""
        if self.reader is None or time.monotonic() < self._due:
            return False
        self._due = time.monotonic() + every
        try:
            found = self.reader.poll((self.run.id,), self.since)
        except Exception:  # never break the monitor (it renews the lease): look again later
            return False
        run = self.run
        for data in found:
            source = str(data.get("source") or "external")
            # If it cannot be queued, its own file keeps it: folded at the store's next open.
            with contextlib.suppress(Exception):
                self.store.take_foreign_stop(data)
            if run.stop_source is None:
                run.stop_source = source
            run.stop_event.set()
            run.notify("stop", source)
            if data.get("force"):
                run.force.want(runtime().settings.force_call_grace)
                run.notify("force", source)
        return bool(found)
