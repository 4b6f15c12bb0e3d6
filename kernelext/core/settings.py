"""Process-wide settings and the default store."""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable
from typing import Any

from ..store import Store, default_store_path, open_store
from .expiry_policy import ExpiryPolicy

__all__ = ["SETTINGS", "Settings", "get_store"]


class Settings:
    def __init__(self) -> None:
        self.store_location: str | None = None
        self.expiry = ExpiryPolicy()
        self.retention_seconds: float = 30 * 24 * 3600.0
        self.check_timeout: float = 10.0
        self.handle_renderer: Callable[[Any], Any] | None = None
        self.reconcile_renderer: Callable[[Any], Any] | None = None
        self.revalidation_renderer: Callable[[Any], Any] | None = None
        self._store: Store | None = None
        self._lock = threading.Lock()

    def waiting_fields(self, store: Store) -> dict[str, Any]:
        """Run fields for entering ``needs_decision``: a deadline from the ``decision``
        policy, so a run nobody decides on expires like any other pause."""
        return {"deadline": self.expiry.deadline("decision", store.now())}

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
