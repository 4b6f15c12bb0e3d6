"""Open panels follow their runs in the store, whoever changes them.

A change may come from this kernel, another kernel, the command line (``kernelext
approve``, ``kernelext stop``) or a decision made in ``kx.approvals()``: the panel learns
of it here, not from the run's listeners alone. One :class:`StoreWatch` per store, shared
by every panel on it, checks about once a second while panels are open:

1. the store's free change signal (``Store.change_signal``: on DuckDB the ``stat`` of the
   file and its WAL, no query); unchanged, nothing else happens;
2. otherwise (and on every check where the backend has no such signal, PostgreSQL) one
   query for every watched run (``Store.run_versions``); the watchers of each run whose
   version moved are called (a panel pokes its throttle, which redraws it).

Runs in a final status are asked about every ``final_every`` checks only where a query
is the signal, so a page of finished panels costs almost nothing on PostgreSQL either.
A view of every run (the overview ``kx.runs()`` shows) watches the whole store
(``watch_store``): it is called whenever the signal moved (DuckDB), or at every check
where there is none (PostgreSQL), and reads what it shows itself.
The thread ends when nothing is watched. ``check()`` makes one check now (tests).
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Hashable
from typing import Any

from kernelext.status import FINAL

__all__ = ["StoreWatch", "watch_of"]

INTERVAL = 0.5  # seconds between two looks at the store's change signal (a stop made
# elsewhere shows within a second: a look, then one redraw)
FINAL_EVERY = 10  # checks between two queries about runs that are final (no free signal)
_UNSEEN = object()

_WATCHES: weakref.WeakKeyDictionary[Any, StoreWatch] = weakref.WeakKeyDictionary()
_WATCHES_LOCK = threading.Lock()


def watch_of(store: Any) -> StoreWatch:
    """The one watch of ``store`` (made on first use)."""
    with _WATCHES_LOCK:
        found = _WATCHES.get(store)
        if found is None:
            found = _WATCHES[store] = StoreWatch(store)
        return found


class StoreWatch:
    """Calls ``callback()`` (from its own thread) whenever the watched run changed."""

    def __init__(self, store: Any, *, interval: float = INTERVAL) -> None:
        self._store = weakref.ref(store)
        self.interval = interval
        self.checks = 0  # looks at the change signal
        self.queries = 0  # run_versions queries made
        self.changes = 0  # runs found changed
        self.quiet = 0  # looks in a row that found nothing committed (no query made)
        self.moved = 0  # looks that found something committed (or had no signal to read)
        self._watchers: dict[str, list[weakref.WeakMethod[Callable[[], None]]]] = {}
        self._everything: list[weakref.WeakMethod[Callable[[], None]]] = []
        self._versions: dict[str, Any] = {}
        self._signal: Any = _UNSEEN
        self._lock = threading.Lock()
        self._check_lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    # -- watching -------------------------------------------------------------------
    def watch(self, run_id: str, callback: Callable[[], None]) -> None:
        """Call ``callback`` (a bound method; held weakly) when run ``run_id`` changes."""
        ref = weakref.WeakMethod(callback)
        with self._lock:
            refs = self._watchers.setdefault(run_id, [])
            if not any(r() == callback for r in refs):
                refs.append(ref)
            self._versions.setdefault(run_id, _UNSEEN)
            self._signal = _UNSEEN  # the new run is asked about at the next check
            self._start()

    def watch_store(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (a bound method; held weakly) whenever anything may have
        changed in the store (any run, a new run)."""
        with self._lock:
            if not any(r() == callback for r in self._everything):
                self._everything.append(weakref.WeakMethod(callback))
            self._start()

    def unwatch_store(self, callback: Callable[[], None]) -> None:
        with self._lock:
            self._everything = [r for r in self._everything if r() not in (None, callback)]
        self._wake.set()

    def _start(self) -> None:
        """Start the thread if it is not running (the lock held)."""
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(
                target=self._loop, daemon=True, name="kernelext-store-watch"
            )
            self._thread.start()

    def unwatch(self, run_id: str, callback: Callable[[], None]) -> None:
        with self._lock:
            refs = [r for r in self._watchers.get(run_id, []) if r() not in (None, callback)]
            if refs:
                self._watchers[run_id] = refs
            else:
                self._watchers.pop(run_id, None)
                self._versions.pop(run_id, None)
        self._wake.set()

    @property
    def watched(self) -> list[str]:
        with self._lock:
            return sorted(self._watchers)

    # -- checking -------------------------------------------------------------------
    def check(self) -> list[str]:
        """Look once; returns the runs found changed (their watchers were called)."""
        with self._check_lock:
            return self._check()

    def _check(self) -> list[str]:
        store = self._store()
        if store is None or store.closed:
            with self._lock:  # nothing more to learn: the thread ends
                self._watchers.clear()
                self._versions.clear()
                self._everything.clear()
            return []
        self.checks += 1
        with self._lock:
            self._prune()
            versions = dict(self._versions)
            everything = list(self._everything)  # weak: a view closed meanwhile is let go
        if not versions and not everything:
            return []
        signal: Hashable | None = store.change_signal()
        if signal is not None and signal == self._signal:
            self.quiet += 1
            return []  # nothing committed anywhere since the last look
        self.quiet = 0
        self.moved += 1
        if not versions:
            with self._lock:
                self._signal = signal if signal is not None else _UNSEEN
        _call_each(everything)
        if not versions:
            return []
        asked = [
            run_id
            for run_id, version in versions.items()
            if signal is not None
            or version is _UNSEEN
            or not _final(version)
            or self.checks % FINAL_EVERY == 0
        ]
        if not asked:
            return []
        self.queries += 1
        found = store.run_versions(asked)
        changed = []
        with self._lock:
            self._signal = signal if signal is not None else _UNSEEN
            for run_id in asked:
                version = found.get(run_id)
                if run_id in self._versions and self._versions[run_id] != version:
                    # first seen too: what changed between the panel's draw and now
                    changed.append(run_id)
                    self._versions[run_id] = version
            callbacks = [r for run_id in changed for r in self._watchers.get(run_id, [])]
        self.changes += len(changed)
        _call_each(callbacks)
        return changed

    def _prune(self) -> None:
        self._everything = [r for r in self._everything if r() is not None]
        for run_id in list(self._watchers):
            alive = [r for r in self._watchers[run_id] if r() is not None]
            if alive:
                self._watchers[run_id] = alive
            else:
                self._watchers.pop(run_id)
                self._versions.pop(run_id, None)

    def _loop(self) -> None:
        while True:
            self._wake.wait(self.interval)
            self._wake.clear()
            with contextlib.suppress(Exception):  # a store closed or busy: look again next time
                self.check()
            with self._lock:
                self._prune()
                if not self._watchers and not self._everything:
                    self._thread = None
                    return


def _call_each(refs: list[weakref.WeakMethod[Callable[[], None]]]) -> None:
    """Call each watcher still alive, holding it only while it runs: a view closed while
    the store is read (a slow query) or while another watcher runs is let go at once."""
    for ref in refs:
        callback = ref()
        if callback is not None:
            callback()
        del callback


def _final(version: Any) -> bool:
    return version is None or (isinstance(version, tuple) and version[0] in FINAL)
