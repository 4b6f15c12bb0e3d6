"""The control panel a run handle displays as: live status, Stop / Resume / Force stop.

The panel is a view of the run in the store. Reports from the run's worker thread arrive
through ``run.listeners``; changes made anywhere else (another kernel, the command line,
a decision in ``kx.approvals()``) are noticed by the store's :class:`~._watch.StoreWatch`
(about once a second, nothing read while nothing changed). Both are drawn by one
:class:`~.throttle.Throttle` (at most ten redraws a second, whatever the agent's pace),
and every redraw reads the run, its last effects and their counts from the store, so a
resume here or elsewhere keeps them. Button clicks run in the kernel's main thread and
redraw at once. The buttons sit under the header line and never move; what grows (the
effects, the timeline, the plan, collapsed by default) comes after them. Every button
is enabled only when its action makes sense, and a second click is harmless: the core
records a repeated stop without a second transition, and a resume of a run already
executing is refused with a notice.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable
from typing import Any

import ipywidgets as w

from kernelext._core.batch.view import BatchCounts, batch_counts
from kernelext._core.lifecycle import control
from kernelext._core.lifecycle.from_elsewhere import store_address
from kernelext._core.lifecycle.run import engine_of
from kernelext._core.process.runtime import runtime
from kernelext._core.views.colours import BAD
from kernelext._formatting import duration_text
from kernelext._shown import shown_html, shows
from kernelext.status import LIVE, RESUMABLE, Status

from ._batch import batch_html
from ._conversation import conversation_html
from ._panel_buttons import PanelButtons, action_buttons
from ._render import (
    PanelView,
    effect_label,
    effects_html,
    header_html,
    outcome_html,
    stop_html,
    to_html,
    to_text,
    view_of,
)
from ._static import SavedCopy
from ._stop_buttons import StopButtons, busy_hint, draw_stop_buttons
from ._style import FRAME, PANEL_STYLE, muted_html
from ._throttle import Throttle
from ._watch import watch_of

__all__ = [
    "NEEDS_DECISION_WIDGETS",
    "PANEL_ADDONS",
    "ControlPanel",
    "close_open_panels",
    "panel_for",
    "panel_mimebundle",
    "refresh_open_panels",
    "reset_decision_slots",
]

# Factories for the needs_decision slot: each is called with the panel (``panel.handle``
# is the run) and returns a widget (e.g. the revalidation or reconciliation widget) or
# None when it does not apply. Called again whenever the reason changes.
NEEDS_DECISION_WIDGETS: list[Callable[[ControlPanel], Any]] = []
# Factories for add-ons shown under the status (e.g. the expired-run banner): called
# with the panel once per followed run; an add-on's ``refresh()`` (if any) is called on
# every redraw. ``panel.follow(new_handle)`` makes the panel show another run.
PANEL_ADDONS: list[Callable[[ControlPanel], Any]] = []

EFFECTS_SHOWN = 5
BATCH_INTERVAL = 0.2  # seconds between redraws at most while a batch runs
OVERRUNNING = "overrunning, cannot be interrupted"
SWALLOWED = {
    "stop_swallowed": "the agent's code caught the stop and went on; it is raised again",
    "force_swallowed": "the agent's code caught the forced stop and went on; it is raised again",
}
# The runs the Resume button offers: waiting or failed ones. A live run whose owner is
# gone is resumable too (kx.resume takes it over), but its panel shows it as running.
RESUME_OFFERED = RESUMABLE - LIVE

_PANELS: weakref.WeakKeyDictionary[Any, ControlPanel] = weakref.WeakKeyDictionary()
_OPEN: weakref.WeakSet[ControlPanel] = weakref.WeakSet()


class ControlPanel(PanelButtons, w.VBox):
    """Live view and controls of one run. ``stop_button.click()`` etc. work from code."""

    def __init__(self, handle: Any, *, interval: float = 0.1, tick: float = 0.5) -> None:
        self.handle = handle
        self.header = w.HTML()
        self.progress = w.IntProgress(min=0, max=1, value=0, layout=w.Layout(width="60%"))
        self.batch = w.HTML()  # a run.map: its bar and counts (widgets/_batch.py)
        self.step = w.HTML()
        self.stop_badge = w.HTML()
        self.effects = w.HTML()
        self.outcome = w.HTML()
        self.decision_slot = w.VBox()  # filled when the run needs a decision
        self.addons = w.VBox()  # PANEL_ADDONS
        self.notice = w.HTML()
        self.stop_button, self.resume_button, self.force_button = action_buttons()
        # Shown: Stop and Force stop sent through the notebook server (never stuck behind
        # queued cells), then Resume, which runs in this kernel. stop_button and
        # force_button stay for code (``panel.stop_button.click()``) and for a click the
        # server could not take (StopButtons hands it here).
        self.remote = StopButtons(
            self._on_remote_action,
            run_id=handle.run_id,
            store=store_address(handle.store),
            busy_hint=busy_hint(handle.run_id),
        )
        buttons = w.HBox([self.remote, self.resume_button])
        buttons.add_class("kernelext-buttons")
        self.requests = w.VBox()  # add-ons marked at_top: what waits for a person, first
        super().__init__(
            children=[
                w.HTML(PANEL_STYLE),
                self.header,
                self.requests,  # an approval or a question waiting: the first thing shown
                self.decision_slot,  # unknown effects or changed facts to decide
                buttons,  # then the buttons: nothing between them and the header grows
                self.notice,
                self.progress,
                self.batch,
                self.step,
                self.stop_badge,
                self.outcome,
                self.effects,
                self.addons,
            ],
            layout=w.Layout(border=FRAME, padding="4px 10px"),
        )
        self.add_class("kernelext-panel")
        self.store_changes = 0  # changes of the run the store watch reported
        self._watched: tuple[Any, str] | None = None
        self._effects: dict[Any, tuple[str, str]] = {}
        self._notice: str | None = None
        self._decision_for: str | None = None
        self._batch_end: BatchCounts | None = None  # the last batch's counts when it ended
        self._interval = interval
        self._busy = threading.Lock()
        self._listened: Any = None
        self.view: PanelView | None = None
        self.saved = SavedCopy()  # the static copy a saved notebook shows (_static.py)
        self.throttle = Throttle(self._draw, interval=interval, tick=tick, active=self._active)
        self.stop_button.on_click(self._on_stop)
        self.resume_button.on_click(self._on_resume)
        self.force_button.on_click(self._on_force)
        self.follow(handle)
        _OPEN.add(self)
        self.refresh()

    # -- following a run -----------------------------------------------------------------
    def follow(self, handle: Any) -> None:
        """Show (and listen to) ``handle``'s run from now on."""
        old = self._listened
        if old is not None and self._on_run_event in old.listeners:
            old.listeners.remove(self._on_run_event)
        self.handle = handle
        _PANELS[handle] = self
        self._watch(handle)
        self.remote.run_id = handle.run_id
        self.remote.store = store_address(handle.store)
        self.remote.busy_hint = busy_hint(handle.run_id)
        run = engine_of(handle.run)
        if run is not old:
            self._effects = {}
            self._batch_end = None
        if self._on_run_event not in run.listeners:
            run.listeners.append(self._on_run_event)
        self._listened = run
        self._decision_for = None
        old_addons = (*self.requests.children, *self.addons.children)
        made = self._made(PANEL_ADDONS, "add-on")
        self.requests.children = tuple(a for a in made if getattr(a, "at_top", False))
        self.addons.children = tuple(a for a in made if not getattr(a, "at_top", False))
        for addon in old_addons:  # they followed the previous handle
            detach = getattr(addon, "detach", None)
            if callable(detach):
                with contextlib.suppress(Exception):
                    detach()

    def _watch(self, handle: Any) -> None:
        """Follow the run in the store: changes from any process redraw the panel."""
        wanted = (handle.store, handle.run_id)
        if self._watched == wanted:
            return
        self._unwatch()
        watch_of(handle.store).watch(handle.run_id, self._on_store_change)
        self._watched = wanted

    def _unwatch(self) -> None:
        if self._watched is not None:
            store, run_id = self._watched
            watch_of(store).unwatch(run_id, self._on_store_change)
            self._watched = None

    def _on_store_change(self) -> None:
        """From the store watch's thread: the run changed in the store."""
        self.store_changes += 1
        self.throttle.poke()

    def _newest_handle(self) -> None:
        """A resume in this process (a decision in ``kx.approvals()``, ``kx.resume``)
        executes the run under a newer handle: the panel follows it."""
        live = runtime().live_handle(self.handle.run_id)
        if live is not None and live is not self.handle and live.store is self.handle.store:
            self.follow(live)

    def _made(self, factories: list[Callable[[ControlPanel], Any]], what: str) -> list[Any]:
        made: list[Any] = []
        for factory in list(factories):
            try:
                widget = factory(self)
            except Exception as exc:  # show it, keep the panel alive
                widget = w.HTML(f"<div>{what} failed: {exc}</div>")
            if widget is not None:
                made.append(widget)
        return made

    def _on_run_event(self, what: str, value: Any) -> None:
        """Called from the worker thread (or an item's): remember, then let the throttle
        redraw. Never blocks: a poke only wakes the throttle's own thread."""
        if what == "batch":
            self._batch_end = None
        elif what == "batch_end":  # its last counts, while the run goes on or waits
            with contextlib.suppress(Exception):
                self._batch_end = batch_counts(value, ended=True)
        elif what in SWALLOWED:
            self._notice = f"{SWALLOWED[what]} (at {value})"
        if what == "effect" and isinstance(value, tuple) and len(value) == 3:
            tool, key, status = value
            row = engine_of(self.handle.run).effects.get(key) or {}
            self._effects[key] = (effect_label(tool, row), str(status))
            if len(self._effects) > 50:
                for old in list(self._effects)[:-EFFECTS_SHOWN]:
                    self._effects.pop(old, None)
        self.throttle.poke()

    def _replayed(self) -> set[Any]:
        """Keys of effects this process returned from the ledger (not a stored status)."""
        return {key for key, (_label, status) in self._effects.items() if status == "replayed"}

    def _active(self) -> bool:
        return bool(self.handle.alive or engine_of(self.handle.run).current is not None)

    def overrun_text(self) -> str | None:
        """Set while a forced stop was raised but the step still runs (blocked in C)."""
        since = engine_of(self.handle.run).overrunning_after_force
        if since is None or not self.handle.alive:
            return None
        return (
            f"{OVERRUNNING}: a forced stop was raised {duration_text(since)} ago and the step "
            "still runs. It is in a call Python cannot interrupt (blocked in C: a sleep, a "
            "socket read or a lock without a timeout) and stops when that call returns, or its "
            "code caught the stop and it is raised again at its next kernelext call."
        )

    def force_wait_text(self) -> str | None:
        """Set while a Force stop waits for a recorded call in flight to return."""
        waiting = engine_of(self.handle.run).force.waiting_for_call()
        if waiting is None or not self.handle.alive:
            return None
        tool, waited, left = waiting
        return (
            f"Force stop is waiting for {tool} to return ({duration_text(waited)} so far): "
            "a call that returns keeps its real outcome. It is cut in "
            f"{duration_text(left)}, or now if you press Force stop again (its outcome then "
            "becomes unknown and waits for your decision)."
        )

    def _overrun_html(self) -> str:
        text = self.force_wait_text() or self.overrun_text()
        if text is None:
            return ""
        return f'<div class="kernelext-overrunning" style="color:{BAD}">{shown_html(text)}</div>'

    @property
    def is_cell_run(self) -> bool:
        return control.is_cell_run({"agent": engine_of(self.handle.run).agent})

    # -- drawing -----------------------------------------------------------------------------
    def refresh(self) -> PanelView:
        """Redraw now (main thread); returns what is shown."""
        self.throttle.refresh_now()
        assert self.view is not None
        return self.view

    def _draw(self) -> None:
        self._newest_handle()
        view = view_of(self.handle, None, self._notice, self._batch_end, replayed=self._replayed())
        self.view = view
        self.saved.update(view)
        self.header.value = header_html(view)
        self.batch.value = batch_html(view.batch)
        batching = view.batch is not None and not view.batch.ended
        self.throttle.interval = max(self._interval, BATCH_INTERVAL) if batching else self._interval
        if view.known_total and view.batch is None:  # a batch draws its own bar
            self.progress.max = view.known_total
            self.progress.value = view.completed
            self.progress.layout.display = None
        else:
            self.progress.layout.display = "none"
        step = "" if view.batching else f"<div>{view.step_text()}</div>"
        talk = conversation_html(view)
        self.step.value = talk + ("" if view.final else step + self._overrun_html())
        self.stop_badge.value = stop_html(view)
        self.effects.value = effects_html(view)
        self.outcome.value = outcome_html(view)
        self.notice.value = muted_html(self._notice) if self._notice else ""
        self._fill_decision_slot(view)
        for addon in (*self.requests.children, *self.addons.children):
            refresh = getattr(addon, "refresh", None)
            if callable(refresh):
                with contextlib.suppress(Exception):
                    refresh()
        cell = self.is_cell_run
        self.stop_button.disabled = not (view.status == Status.RUNNING and (view.alive or cell))
        self.force_button.disabled = not (view.alive and view.status in LIVE) or cell
        self.resume_button.disabled = view.alive or view.status not in RESUME_OFFERED
        # While a person must decide, the decision replaces Resume (which would only stop
        # again for it); once it is decided elsewhere, Resume comes back.
        waiting = sum(getattr(a, "waiting", 0) for a in self.requests.children)
        deciding = waiting > 0 or view.status == Status.NEEDS_DECISION
        self.resume_button.layout.display = "none" if deciding else None
        draw_stop_buttons(self.remote, view.status, view.stop_pending, cell, view.owner_epoch)

    def _fill_decision_slot(self, view: PanelView) -> None:
        if view.status != Status.NEEDS_DECISION:
            if self._decision_for is not None or self.decision_slot.children:
                self.decision_slot.children = ()
                self._decision_for = None
            return
        marker = f"{view.run_id}:{view.reason}"
        if self._decision_for == marker:
            return
        self._decision_for = marker
        children = self._made(NEEDS_DECISION_WIDGETS, "decision widget")
        if not children:
            children.append(
                w.HTML(
                    f"<div>Decide with <code>kx.reconcile({view.run_id!r})</code> "
                    "(unknown effects) or resume once the facts are settled.</div>"
                )
            )
        self.decision_slot.children = tuple(children)

    # -- display ------------------------------------------------------------------------------
    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        view = self.refresh()
        self.saved.show(view)
        bundle: dict[str, Any] = dict(super()._repr_mimebundle_(**kwargs) or {})
        bundle["text/plain"] = to_text(view)
        bundle["text/html"] = to_html(view)
        return bundle

    @shows
    def __repr__(self) -> str:
        return to_text(self.view) if self.view is not None else "<kernelext panel>"

    def detach(self) -> None:
        """Stop following the run (the widgets stay as last drawn)."""
        self.throttle.close()
        self._unwatch()
        run = self._listened
        if run is not None and self._on_run_event in run.listeners:
            run.listeners.remove(self._on_run_event)
        _OPEN.discard(self)


def panel_for(handle: Any) -> ControlPanel:
    """The panel of ``handle`` (one per handle; displaying it twice shows the same model)."""
    panel = _PANELS.get(handle)
    if panel is None:
        panel = ControlPanel(handle)
    return panel


def panel_mimebundle(handle: Any) -> dict[str, Any]:
    """What a handle displays as: the live widget, static HTML and plain text."""
    return panel_for(handle)._repr_mimebundle_()


def refresh_open_panels() -> None:
    """Redraw every panel whose run can still change (called after each cell)."""
    for panel in list(_OPEN):
        view = panel.view
        if view is not None and view.final and not panel.handle.alive:
            continue  # terminal: nothing left to show, and no store read needed
        try:
            panel.refresh()
        except Exception:  # e.g. the store was closed under a stale panel
            continue


def reset_decision_slots() -> None:
    """Make every open panel rebuild its decision slot at its next redraw (call it after
    changing NEEDS_DECISION_WIDGETS)."""
    for panel in list(_OPEN):
        panel._decision_for = None


def close_open_panels() -> None:
    for panel in list(_OPEN):
        panel.detach()
