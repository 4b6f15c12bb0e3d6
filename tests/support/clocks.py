"""A fake UTC clock a test moves by hand, and the store fixture that reads its time from it."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.live import finish_live_runs

__all__ = ["T0", "TickingClock", "store_on_clock"]

T0 = dt.datetime(2031, 5, 1, 12, 0, 0)


class TickingClock:
    """Fake naive-UTC time: ``tick`` passes per reading (none by default: time stands
    still); ``advance`` jumps ahead and returns the new time."""

    def __init__(self, start: dt.datetime = T0, **tick: float) -> None:
        self.now = start
        self.tick = dt.timedelta(**tick)
        self._lock = threading.Lock()

    def __call__(self) -> dt.datetime:
        with self._lock:
            self.now += self.tick
            return self.now

    def advance(self, delta: dt.timedelta | None = None, **parts: float) -> dt.datetime:
        with self._lock:
            self.now += delta if delta is not None else dt.timedelta(**parts)
            return self.now


@pytest.fixture(name="store")
def store_on_clock(store_path: Path, clock: TickingClock) -> Iterator[Any]:
    """A real store on the module's ``clock``, also the default store for kx.* calls (the
    test's runtime forgets its options and kx.on_expire callbacks after the test)."""
    from kernelext._core.process.runtime import runtime
    from kernelext._store import open_store

    opened = open_store(str(store_path), clock=clock)
    runtime().settings.use_store(opened)
    yield opened
    finish_live_runs()
    runtime().close()
