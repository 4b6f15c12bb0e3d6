"""Process-wide settings and the default store."""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable
from typing import Any

from ..expiry_policy import POLICY
from ..store import Store, default_store_path, open_store

__all__ = ["SETTINGS", "Settings", "get_store"]


class Settings:
    def __init__(self) -> None:
        self.store_location: str | None = None
        self.expiry = POLICY  # the store reads the same object (waiting deadlines)
        self.retention_seconds: float = 30 * 24 * 3600.0
        self.check_timeout: float = 10.0
        self.max_step_seconds: float | None = None  # default bound of %%agent cells
        self.soft_interrupt: bool = True  # the interrupt button stops a live agent softly
        self.interrupt_window: float = 2.0  # a second press within it forces the stop
        self.allow_files: bool = False  # %%ledger may read files outside the store
        self.handle_renderer: Callable[[Any], Any] | None = None
        self.reconcile_renderer: Callable[[Any], Any] | None = None
        self.approvals_renderer: Callable[[Any], Any] | None = None
        self.revalidation_renderer: Callable[[Any], Any] | None = None
        self._store: Store | None = None
        self._lock = threading.Lock()

    def store(self) -> Store:
        with self._lock:
            if self._store is None or self._store.closed:
                self._store = open_store(self.store_location or default_store_path())
            return self._store

    def use_store(self, location: str | Store | None) -> Store | None:
        """Switch the default store (closing the previous one if this process opened it)."""
        with self._lock:
            old = self._store
            if isinstance(location, Store):
                self._store = location
                self.store_location = location.location
            else:
                self._store = None
                self.store_location = location
        if old is not None and old is not location and not isinstance(location, Store):
            old.close()
        return self._store

    def close(self) -> None:
        with self._lock:
            store, self._store = self._store, None
        if store is not None:
            store.close()


SETTINGS = Settings()
atexit.register(SETTINGS.close)


def get_store(store: Store | None = None) -> Store:
    return store if store is not None else SETTINGS.store()
