"""The heartbeat of the ``run.map`` item attempts a worker process is running.

While an attempt runs, its step's ``heartbeat_at`` is renewed every ``BEAT_SECONDS`` by one
thread per process (``_store/heartbeats.py`` says what reads it): the first beat is written
before the attempt records anything, so a take-over that finds an intent of the item also
finds its worker's heartbeat while that worker lives. A beat that cannot be written (the
store unreachable for a moment) is skipped; the next one tries again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import uuid
from collections.abc import Iterator

from ..._store import Store

__all__ = ["BEAT_SECONDS", "HEARTBEAT", "Heartbeat"]

BEAT_SECONDS = 3.0  # well inside HEARTBEAT_LAPSE_SECONDS (15 s)
_log = logging.getLogger("kernelext")


class Heartbeat:
    """Renews the heartbeat of every attempt registered with ``beating``; its thread runs
    only while some attempt is registered."""

    def __init__(self, every: float = BEAT_SECONDS) -> None:
        self.every = every
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._attempts: dict[object, tuple[Store, str, uuid.UUID]] = {}
        self._thread: threading.Thread | None = None
        self.missed = 0  # beats that could not be written

    @contextlib.contextmanager
    def beating(self, store: Store, run_id: str, step_id: uuid.UUID) -> Iterator[None]:
        """Beat for step attempt ``step_id`` of ``run_id`` from now until the block ends."""
        store.beat_steps(run_id, [step_id])  # before the attempt records anything
        token = object()
        with self._lock:
            self._attempts[token] = (store, run_id, step_id)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, name="kernelext-item-heartbeat", daemon=True
                )
                self._thread.start()
        try:
            yield
        finally:
            with self._lock:
                del self._attempts[token]

    def _forget(self) -> None:
        """In a forked child: the parent's attempts and thread are not this process's."""
        self._lock = threading.Lock()
        self._attempts = {}
        self._thread = None

    def _loop(self) -> None:
        while not self._wake.wait(self.every):
            with self._lock:
                if not self._attempts:
                    self._thread = None
                    return
                groups: dict[tuple[int, str], tuple[Store, list[uuid.UUID]]] = {}
                for store, run_id, step_id in self._attempts.values():
                    groups.setdefault((id(store), run_id), (store, []))[1].append(step_id)
            for (_, run_id), (store, ids) in groups.items():
                try:
                    store.beat_steps(run_id, ids)
                except Exception as exc:  # the next beat tries again
                    self.missed += 1
                    _log.debug("kernelext: heartbeat of run %r not written: %s", run_id, exc)


HEARTBEAT = Heartbeat()
os.register_at_fork(after_in_child=HEARTBEAT._forget)
