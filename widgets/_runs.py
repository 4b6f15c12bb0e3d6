"""The live overview of a store's runs: what ``kx.runs()`` shows in a notebook.

One row a run (the latest ``overview.SHOWN``): its status badge, its progress (steps done
out of the total, or a ``run.map``'s items), the time left or the pending stop's estimate,
what it waits for (an approval, an answer, a decision on unknown effects, a resume) and
its deadline, Stop and Force stop (:class:`~._stop_buttons.StopButtons`: sent to the
notebook server, so they land while the kernel is busy; recorded with source
``overview``), and Panel, which opens the run's control panel under the table (what
``kx.panel(run_id)`` shows).

Following the store: one :class:`Feed` per store and status, shared by every overview
displayed of it, watches the whole store through its :class:`~._watch.StoreWatch`
(``watch_store``: on DuckDB the file's ``stat``, no query while nothing is committed) and
redraws through a :class:`~._throttle.Throttle`. A redraw first reads the runs' rows (one
query); when they are as before and no run is live, nothing more is read (so a commit
that changed nothing shown, or PostgreSQL's look every second, costs one query).
Otherwise :func:`kernelext._core.lifecycle.overview.read_overview` reads the rest, and while a run
is live the throttle ticks every second (the time left moves). The rows are texts from
the core; ``_runs_html.py`` draws them, and the same HTML is the saved copy.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from typing import Any

import ipywidgets as w

from kernelext._core.lifecycle import control
from kernelext._core.lifecycle.from_elsewhere import store_address
from kernelext._core.lifecycle.overview import Overview, RunRow, read_overview
from kernelext._core.process.runtime import get_store
from kernelext._shown import shows
from kernelext.status import LIVE

from ._panel import _PANELS, panel_for
from ._runs_html import COLUMNS, cells, header_html, overview_html, saved_overview_html
from ._static import SavedCopy
from ._stop_buttons import StopButtons, busy_hint, draw_stop_buttons
from ._style import FRAME, RUNS_STYLE, muted_html
from ._throttle import Throttle
from ._watch import watch_of

__all__ = ["Feed", "RunsOverview", "close_open_overviews", "feed_of", "runs_mimebundle"]

SOURCE = "overview"  # the source its stops are recorded with (from_elsewhere.SOURCES)
FULL_EVERY = 30.0  # seconds: at most this long between two full reads (deadlines move)
GRID = (  # run, status, progress, time left, waits for, the buttons (their answer wraps)
    "minmax(120px, max-content) max-content minmax(90px, max-content)"
    " minmax(90px, max-content) minmax(140px, 1fr) minmax(290px, 360px)"
)

_FEEDS: weakref.WeakKeyDictionary[Any, dict[str | None, Feed]] = weakref.WeakKeyDictionary()
_FEEDS_LOCK = threading.Lock()


def feed_of(store: Any, status: str | None) -> Feed:
    """The one feed of ``store``'s runs (of ``status``), made on first use."""
    with _FEEDS_LOCK:
        feeds = _FEEDS.setdefault(store, {})
        found = feeds.get(status)
        if found is None:
            found = feeds[status] = Feed(store, status)
        return found


def _forget(feed: Feed) -> None:
    """``feed`` has no view left: it leaves the registry (the next overview makes anew)."""
    with _FEEDS_LOCK:
        store = feed.store_ref()
        feeds = _FEEDS.get(store) if store is not None else None
        if feeds is not None and feeds.get(feed.status) is feed:
            del feeds[feed.status]
            if not feeds:
                del _FEEDS[store]


class Feed:
    """Reads the overview of a store's runs when the store changed; every view shows it.

    The store is held weakly (the registry's key is the store: a strong hold would keep
    both forever); its views hold it. A feed whose last view is closed leaves the registry
    and stops its thread."""

    def __init__(self, store: Any, status: str | None) -> None:
        self.store_ref = weakref.ref(store)
        self.status = status
        self.overview: Overview | None = None
        self.views: weakref.WeakSet[RunsOverview] = weakref.WeakSet()
        self.changes = 0  # times the store watch said the store changed
        self.reads = 0  # redraws that read the runs' rows
        self.full_reads = 0  # redraws that read the whole overview
        self._runs: list[dict[str, Any]] | None = None
        self._full_at = 0.0
        self._force = False
        self.error: Exception | None = None  # of the last read, if it failed
        self.throttle = Throttle(self._read, interval=0.25, tick=1.0, active=self._active)

    def attach(self, view: RunsOverview) -> None:
        if not self.views:  # again after its last view left (a close meanwhile)
            with _FEEDS_LOCK:
                _FEEDS.setdefault(self.store, {}).setdefault(self.status, self)
            if self.throttle.closed:
                self.throttle = Throttle(self._read, interval=0.25, tick=1.0, active=self._active)
        self.views.add(view)
        watch_of(self.store).watch_store(self._on_change)

    @property
    def store(self) -> Any:
        store = self.store_ref()
        if store is None:
            raise RuntimeError("the store of this overview was closed and let go")
        return store

    def detach(self, view: RunsOverview) -> None:
        self.views.discard(view)
        if not self.views:
            store = self.store_ref()
            if store is not None:
                watch_of(store).unwatch_store(self._on_change)
            _forget(self)
            self.throttle.close()

    def _on_change(self) -> None:
        """From the store watch's thread: something was committed."""
        self.changes += 1
        self.throttle.poke()

    def _active(self) -> bool:
        found = self.overview
        return bool(self.views) and found is not None and any(r.live for r in found.rows)

    def refresh(self) -> Overview:
        """Read everything now (main thread, a click) and redraw every view."""
        self._force = True
        self.throttle.refresh_now()
        if self.error is not None or self.overview is None:
            raise self.error or RuntimeError("the runs could not be read")
        return self.overview

    def _read(self) -> None:
        try:
            self._read_once()
            self.error = None
        except Exception as exc:  # kept for refresh(); the throttle goes on
            self.error = exc
            raise

    def _read_once(self) -> None:
        force, self._force = self._force, False
        runs = self.store.overview_runs(self.status)
        self.reads += 1
        same = runs == self._runs and self.overview is not None
        recent = time.monotonic() - self._full_at < FULL_EVERY
        if same and recent and not force and not self._active():
            return  # nothing shown changed
        overview = read_overview(self.store, self.status, rows=runs)
        self._runs, self._full_at, self.overview = runs, time.monotonic(), overview
        self.full_reads += 1
        for view in list(self.views):
            with contextlib.suppress(Exception):  # one view's failure spares the others
                view.show(overview)


class _Row:
    """The widgets of one row: five HTML cells, Stop / Force stop, Panel."""

    def __init__(self, owner: RunsOverview, run_id: str) -> None:
        self.run_id = run_id
        self.cells = [w.HTML() for _ in COLUMNS]
        self.buttons = StopButtons(
            lambda action: owner.on_action(run_id, action, self.buttons.epoch),
            run_id=run_id,
            store=owner.address,
            source=SOURCE,
            busy_hint=busy_hint(run_id),
        )
        self.open_button = w.Button(
            description="Panel",
            icon="external-link",
            tooltip=f"Open this run's control panel below (kx.panel({run_id!r}))",
            layout=w.Layout(width="auto"),
        )
        self.open_button.on_click(lambda _b: owner.open_panel(run_id))
        self.actions = w.HBox(
            [self.buttons, self.open_button], layout=w.Layout(flex_flow="row wrap")
        )
        self.actions.add_class("kernelext-row-actions")
        self.widgets = [*self.cells, self.actions]

    def show(self, row: RunRow, opened: bool) -> None:
        for cell, value in zip(self.cells, cells(row), strict=True):
            cell.value = value
        draw_stop_buttons(self.buttons, row.status, bool(row.stop_pending), row.cell, row.epoch)
        self.open_button.description = "Hide panel" if opened else "Panel"


class RunsOverview(w.VBox):
    """The runs of ``store`` (of ``status``), live: one row a run, with its buttons."""

    def __init__(self, store: Any, status: str | None = None, *, text: str = "") -> None:
        self.store, self.status, self.text = store, status, text
        self.address = store_address(store)
        self.header = w.HTML()
        self.head = [w.HTML(f"<b>{name}</b>") for name in (*COLUMNS, "")]
        for cell in self.head:
            cell.add_class("kernelext-runs-head")
        self.grid = w.GridBox(layout=w.Layout(grid_template_columns=GRID, grid_gap="0 12px"))
        self.grid.add_class("kernelext-runs-grid")
        self.notice = w.HTML()
        self.opened = w.VBox()  # the control panel opened from a row
        self.opened_run: str | None = None
        self._opened_panel: Any = None
        self._made_panel = False
        self.rows: dict[str, _Row] = {}
        self.overview: Overview | None = None
        self.saved = SavedCopy()
        self._lock = threading.RLock()  # the feed's thread and a click both draw
        super().__init__(
            children=[w.HTML(RUNS_STYLE), self.header, self.grid, self.notice, self.opened],
            layout=w.Layout(border=FRAME, padding="4px 10px"),
        )
        self.add_class("kernelext-runs")
        self.feed = feed_of(store, status)
        self.feed.attach(self)
        self.refresh()

    # -- drawing ------------------------------------------------------------------------
    def refresh(self) -> Overview:
        """Read the store now and redraw (every view of the same runs too)."""
        return self.feed.refresh()

    def show(self, overview: Overview) -> None:
        """Draw ``overview`` (from the feed, on any thread)."""
        with self._lock:
            self._show(overview)

    def _show(self, overview: Overview) -> None:
        self.header.value = header_html(overview, self.address)
        order = [row.run_id for row in overview.rows]
        for run_id in order:
            if run_id not in self.rows:
                self.rows[run_id] = _Row(self, run_id)
        for run_id in [r for r in self.rows if r not in set(order)]:
            self._drop(self.rows.pop(run_id))
        for row in overview.rows:
            self.rows[row.run_id].show(row, opened=row.run_id == self.opened_run)
        children = tuple(self.head) + tuple(c for r in order for c in self.rows[r].widgets)
        if not order:
            children = ()
        if self.grid.children != children:
            self.grid.children = children
        key = tuple((row.run_id, row.status) for row in overview.rows)
        self.saved.update_html(lambda: saved_overview_html(overview, self.address), key)
        self.overview = overview  # what is drawn

    @staticmethod
    def _drop(row: _Row) -> None:
        for widget in (*row.widgets, row.buttons, row.open_button):
            with contextlib.suppress(Exception):
                widget.close()

    # -- actions (in the kernel) ----------------------------------------------------------
    def on_action(self, run_id: str, action: str, epoch: int = -1) -> str | None:
        """A Stop or Force stop the notebook server could not take: recorded from here,
        fenced by the owner epoch the row showed (``-1``: none known)."""
        try:
            before = str(self.store.get_run(run_id)["status"])
            door = control.force_stop if action == "force" else control.stop
            fence = None if epoch < 0 else epoch
            status = door(run_id, source=SOURCE, store=self.store, epoch=fence)
            note = (
                f"{'Force stop' if action == 'force' else 'Stop'} recorded (runs overview): "
                f"run {run_id} is {status}."
                if before in LIVE
                else f"Run {run_id} is {before}: there is nothing to stop."
            )
        except Exception as exc:  # said where the click was made
            note = f"{type(exc).__name__}: {exc}"
        with contextlib.suppress(Exception):
            self.refresh()
        return note

    def open_panel(self, run_id: str) -> None:
        """Show run ``run_id``'s control panel under the table (again: hide it)."""
        with self._lock:
            self._open_panel(run_id)

    def _open_panel(self, run_id: str) -> None:
        self._close_panel()
        if self.opened_run == run_id:
            self.opened_run = None
        else:
            try:
                handle = control.handle_for(run_id, store=self.store)
                self._made_panel = handle not in _PANELS
                self._opened_panel = panel_for(handle)
                label = muted_html(f"panel of run {run_id} (also: kx.panel({run_id!r}))")
                self.opened.children = (w.HTML(label), self._opened_panel)
                self.opened_run = run_id
                self.notice.value = ""
            except Exception as exc:
                self.notice.value = muted_html(f"{type(exc).__name__}: {exc}")
                self.opened_run = None
        if self.overview is not None:
            self._show(self.overview)

    def _close_panel(self) -> None:
        panel, self._opened_panel = self._opened_panel, None
        self.opened.children = ()
        if panel is not None and self._made_panel:
            panel.detach()  # made for this overview: it stops following its run

    # -- display ------------------------------------------------------------------------------
    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        overview = self.refresh()
        key = tuple((row.run_id, row.status) for row in overview.rows)
        self.saved.show_html(saved_overview_html(overview, self.address), key)
        bundle: dict[str, Any] = dict(super()._repr_mimebundle_(**kwargs) or {})
        bundle["text/plain"] = self.text or overview.text()
        bundle["text/html"] = overview_html(overview, self.address)
        return bundle

    @shows
    def __repr__(self) -> str:
        return self.overview.text() if self.overview is not None else "<kernelext runs>"

    def detach(self) -> None:
        """Stop following the store (the widgets stay as last drawn)."""
        self._close_panel()
        self.feed.detach(self)

    def close(self) -> None:
        """Close the overview's widgets; it stops following the store (its feed, once no
        other overview shows it, is let go)."""
        self.detach()
        for row in list(self.rows.values()):
            self._drop(row)
        self.rows.clear()
        for widget in (*self.head, *self.children):
            with contextlib.suppress(Exception):
                widget.close()
        super().close()


def runs_mimebundle(frame: Any) -> dict[str, Any]:
    """What ``kx.runs()`` displays as with the extension: the live overview, the static
    HTML and the table's own text."""
    import pandas as pd

    store, status = frame.overview_of
    view = RunsOverview(get_store(store), status, text=pd.DataFrame.__repr__(frame))
    return view._repr_mimebundle_()


def close_open_overviews() -> None:
    """Every overview stops following its store (the extension is unloaded)."""
    with _FEEDS_LOCK:
        feeds = [feed for by_status in _FEEDS.values() for feed in by_status.values()]
        _FEEDS.clear()
    for feed in feeds:
        for view in list(feed.views):
            view.detach()
        feed.throttle.close()
