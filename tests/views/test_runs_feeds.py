"""An overview's feed is let go once no overview shows it (``widgets/_runs.py``): closing
the last overview of a store frees its feed and stops its thread, and a store nobody holds
any more takes its feeds with it."""

from __future__ import annotations

import gc
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import kernelext as kx
from kernelext._store import open_store
from kernelext.widgets._runs import _FEEDS, RunsOverview, feed_of


def _store(tmp_path: Path) -> Any:
    store = kx.open_store(str(tmp_path / "runs.duckdb"))

    @kx.agent(name="short")
    def short(run: kx.Run) -> None:
        with run.step("one"):
            pass

    assert short.start(run_id="one-run", store=store).wait(60) == "completed"
    return store


def test_a_closed_overview_lets_its_feed_go(tmp_path: Path) -> None:
    store = _store(tmp_path)
    try:
        first, second = RunsOverview(store), RunsOverview(store)
        assert first.feed is second.feed  # one feed a store and status
        feed = weakref.ref(first.feed)
        first.close()
        del first
        gc.collect()
        assert feed() is not None and feed_of(store, None) is feed()  # the other shows it
        second.close()
        assert not second.feed.throttle.running  # its thread ended
        del second
        assert _let_go(feed)
        assert store not in _FEEDS
        again = RunsOverview(store)  # a new overview reads and draws as before
        assert "one-run" in again.rows
        again.close()
    finally:
        store.close()


def _let_go(ref: weakref.ref[Any]) -> bool:
    """True once nothing holds ``ref``'s object. The store watch may be calling the closed
    feed's watcher at this instant (a poke its closed throttle ignores): that call ends."""
    for _ in range(200):
        gc.collect()
        if ref() is None:
            return True
        time.sleep(0.05)
    return False


def test_a_feed_closed_while_the_store_is_read_is_let_go(tmp_path: Path) -> None:
    """The watch may be in the middle of a slow read of the store (PostgreSQL under load, a
    long reader) when the last overview closes: it holds the feed only while calling it."""
    store = _store(tmp_path)
    reading, release = threading.Event(), threading.Event()
    original = store.change_signal

    def slow_signal() -> Any:
        if threading.current_thread().name == "kernelext-store-watch":
            reading.set()
            release.wait(30)
        return original()

    try:
        view = RunsOverview(store)
        feed = weakref.ref(view.feed)
        store.change_signal = slow_signal
        assert reading.wait(30)  # the watch is reading the store now
        view.close()
        del view
        gc.collect()
        assert feed() is None  # while the read still goes on
        assert store not in _FEEDS
    finally:
        release.set()
        del store.change_signal
        store.close()


def test_a_store_let_go_takes_its_feeds_with_it(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "runs.duckdb"))  # not the runtime's current store
    feed = weakref.ref(feed_of(store, "completed"))
    held = weakref.ref(store)
    store.close()
    del store
    gc.collect()  # the store, then (its registry entry gone) the feed's own cycle
    gc.collect()
    assert held() is None and feed() is None
