"""The panel's buttons: Stop, Resume and Force stop, and what a click on each does.

A click runs in the kernel's main thread; a second click while one is handled is ignored,
and what went wrong is shown in the panel's notice (``_click``). Stop and Force stop are
shown through the notebook server (``_stop_buttons.py``); a click it could not take comes
back here (``_on_remote_action``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import ipywidgets as w

from kernelext._core.lifecycle import control
from kernelext._core.plan.resume_plan import ResumePlan
from kernelext.status import LIVE, Status

from ._stop_buttons import FORCE_TIPS

if TYPE_CHECKING:
    from ._render import PanelView

__all__ = ["SOURCE", "PanelButtons", "action_buttons"]

SOURCE = "panel"


def action_buttons() -> tuple[w.Button, w.Button, w.Button]:
    """Stop, Resume and Force stop, as code clicks them (``panel.stop_button.click()``)."""
    stop = w.Button(
        description="Stop",
        icon="stop",
        button_style="warning",
        tooltip="Stop at the next safe point (step boundary)",
        layout=w.Layout(width="auto"),
    )
    resume = w.Button(
        description="Resume",
        icon="play",
        button_style="success",
        tooltip="Continue from the last completed step",
        layout=w.Layout(width="auto"),
    )
    force = w.Button(
        description="Force stop",
        icon="bolt",
        button_style="danger",
        tooltip="Stop now: cancel the current step; effects in flight become unknown",
        layout=w.Layout(width="auto"),
    )
    return stop, resume, force


class PanelButtons:
    """What a click on the panel's buttons does (mixed into ``ControlPanel``)."""

    handle: Any
    addons: w.VBox
    _busy: threading.Lock
    _notice: str | None

    if TYPE_CHECKING:

        @property
        def is_cell_run(self) -> bool: ...

        def refresh(self) -> PanelView: ...

        def follow(self, handle: Any) -> None: ...

    def _click(self, action: Callable[[], str | None]) -> None:
        if not self._busy.acquire(blocking=False):
            return  # a click while the previous one is still being handled
        try:
            self._notice = action()
        except Exception as exc:  # the panel says what went wrong
            self._notice = f"{type(exc).__name__}: {exc}"
        finally:
            self._busy.release()
        self.refresh()

    def _on_stop(self, _button: Any = None) -> None:
        def stop() -> str | None:
            # Recorded in the store whoever executes the run: this kernel's agent thread,
            # a cell run (between two cells it suspends at once), another process.
            before = self.handle.info()["status"]
            status = control.stop(self.handle.run_id, source=SOURCE, store=self.handle.store)
            if before in LIVE or self.handle.alive:
                return None
            return f"the run is {status}: there was nothing to stop"

        self._click(stop)

    def _on_remote_action(self, action: str) -> str | None:
        """A Stop or Force stop the server could not take: handled here, in the kernel."""
        (self._on_force if action == "force" else self._on_stop)()
        return self._notice

    def _on_force(self, _button: Any = None) -> None:
        def force() -> str | None:
            if self.is_cell_run:
                return FORCE_TIPS["cell"]
            status = control.force_stop(self.handle.run_id, source=SOURCE, store=self.handle.store)
            if status not in LIVE:
                return f"the run is {status}: there is nothing to force"
            return "force stop requested: the current step is cancelled"

        self._click(force)

    def shown_plan(self) -> ResumePlan | None:
        """The resume plan an add-on shows: Resume resumes as previewed."""
        addons = getattr(self, "addons", None)
        for child in getattr(addons, "children", ()):
            plan = getattr(child, "plan", None)
            if isinstance(plan, ResumePlan):
                return plan
        return None

    def _on_resume(self, _button: Any = None) -> None:
        def resume() -> str | None:
            if self.handle.alive:
                return "the run is already executing"
            new = control.resume(
                self.handle.run_id, store=self.handle.store, source=SOURCE, plan=self.shown_plan()
            )
            self.follow(new)
            if self.is_cell_run and new.status == Status.RUNNING:
                return (
                    "resumed: run the notebook's %%agent cells again (completed ones are skipped)"
                )
            return None

        self._click(resume)
