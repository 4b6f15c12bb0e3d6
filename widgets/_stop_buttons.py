"""Stop and Force stop as a panel shows them: sent to the notebook server, not the kernel.

The buttons are drawn by ``_stop_buttons.js`` (an anywidget: no build step). A click
POSTs to kernelext's Jupyter Server extension (``kernelext._server``), which records the
request in the store while the kernel is busy with queued cells or the user's own code;
the run honours it at its next safe point. Where that route is missing, the click comes
here as a widget message and :class:`StopButtons` hands it to the panel, which acts when
the kernel is free; the button tells the person at once if the kernel does not answer.

``source`` names where the buttons are (``panel``, or ``overview`` for a row of the runs
overview): the request is recorded with it. The owner keeps the state: it sets
``stop_disabled``, ``force_disabled`` and their tooltips at every redraw (from any thread:
a widget's state travels on the kernel's IOPub channel, which a busy main thread does not
hold up). Every store the buttons name is noted for the notebook server
(:func:`show_store`): the server opens no store a notebook of this user did not show.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anywidget
import traitlets

from kernelext._core.process.shown_stores import record
from kernelext.status import LIVE

_LOG = logging.getLogger("kernelext")

__all__ = [
    "FORCE_TIPS",
    "STOP_TIPS",
    "AnswerButtons",
    "DecisionButtons",
    "OutOfBand",
    "StopButtons",
    "busy_hint",
    "draw_stop_buttons",
    "show_store",
]

ACTIONS = ("stop", "force")
STOP_TIPS = {
    "live": "Stop at the next safe point (the end of the step or cell). Recorded at once, "
    "even while the kernel runs other cells.",
    "asked": "A stop is pending: the run stops at its next safe point. Pressing again "
    "changes nothing; Force stop cancels the step now.",
    "idle": "The run is {status}: there is nothing to stop.",
}
FORCE_TIPS = {
    "live": "Stop now: cancel the current step. A recorded call of a plain (not async) "
    "effect in flight is waited for (up to force_call_grace, 10 s) and keeps its real "
    "outcome; press again to cut it (its outcome then becomes unknown, for you to decide). "
    "An awaited call and a batch's items are cut at once.",
    "cell": "A %%agent cell runs in the kernel's main thread: press the notebook's ■ "
    "(interrupt) twice to cancel it. Stop ends the run after the cell.",
}


def show_store(address: str) -> None:
    """Note in Jupyter's runtime folder (private to this user) that this kernel shows
    buttons for the store at ``address``: the notebook server's route opens only such
    stores. Where the folder cannot be written, a click says how to go on."""
    if not address:
        return
    from jupyter_core.paths import jupyter_runtime_dir

    try:
        record(jupyter_runtime_dir(), address)
    except OSError as exc:
        _LOG.warning("kernelext: could not note the store shown by a panel: %s", exc)


def busy_hint(run_id: str) -> str:
    """What a click says when neither the server nor the kernel answered."""
    return (
        "The kernel is busy and this Jupyter server has no kernelext route (it starts with "
        "kernelext installed): press ■ (interrupt the kernel) for a soft stop, or run "
        f"`kernelext stop {run_id}` in a terminal."
    )


class OutOfBand(anywidget.AnyWidget):
    """Buttons whose clicks go to the notebook server (``_stop_buttons.js``); a click the
    server could not take comes here as a message: ``on_action(action, content)`` runs it
    in the kernel, and ``ack_seq`` tells the browser it was handled."""

    # The text, not the path: anywidget ties every instance made from a path to the file's
    # change signal (to reload it), which holds each instance, and what its callbacks hold,
    # for as long as the process lives.
    _esm = Path(__file__).with_name("_stop_buttons.js").read_text(encoding="utf-8")
    actions: tuple[str, ...] = ()
    kind = traitlets.Unicode("stop").tag(sync=True)
    run_id = traitlets.Unicode("").tag(sync=True)
    store = traitlets.Unicode("").tag(sync=True)  # from_elsewhere.store_address
    source = traitlets.Unicode("panel").tag(sync=True)  # from_elsewhere.SOURCES
    busy_hint = traitlets.Unicode("").tag(sync=True)
    kernel_note = traitlets.Unicode("").tag(sync=True)  # the kernel's answer to a click
    ack_seq = traitlets.Int(0).tag(sync=True)  # raised when the kernel handled a click
    epoch = traitlets.Int(-1).tag(sync=True)  # the run's owner_epoch as drawn (-1: unknown)

    def __init__(self, on_action: Callable[..., str | None], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._on_action = on_action
        self.on_msg(self._handle_message)

    @traitlets.observe("store")
    def _show_store(self, change: Any) -> None:
        """Every store these buttons click on is noted for the notebook server, which
        opens no other (``shown_stores``)."""
        show_store(change["new"])

    def _handle_message(self, _widget: Any, content: Any, _buffers: Any) -> None:
        action = content.get("action") if isinstance(content, dict) else None
        if action not in self.actions:
            return
        try:
            note = self._call(str(action), content)
        finally:
            self.ack_seq += 1
        if note:
            self.kernel_note = note

    def _call(self, action: str, content: dict[str, Any]) -> str | None:
        return self._on_action(action)


class StopButtons(OutOfBand):
    """The panel's Stop and Force stop; ``on_action(action)`` runs a click in the kernel."""

    actions = ACTIONS
    stop_disabled = traitlets.Bool(False).tag(sync=True)
    force_disabled = traitlets.Bool(True).tag(sync=True)
    stop_tooltip = traitlets.Unicode("").tag(sync=True)
    force_tooltip = traitlets.Unicode("").tag(sync=True)


class DecisionButtons(OutOfBand):
    """An approval card's note, Approve and Reject. ``on_action(action, note)`` runs
    ``approve`` / ``reject`` in the kernel (a click the server could not take), or
    ``resume`` once the server recorded the decision."""

    actions = ("approve", "reject", "resume")
    request = traitlets.Unicode("").tag(sync=True)  # the approval request's id
    decided = traitlets.Bool(False).tag(sync=True)
    note = traitlets.Unicode("").tag(sync=True)  # typed so far (kept in the browser's model)

    def __init__(self, on_action: Callable[..., str | None], **kwargs: Any) -> None:
        super().__init__(on_action, kind="approval", **kwargs)

    def _call(self, action: str, content: dict[str, Any]) -> str | None:
        note = content.get("note")
        return self._on_action(action, note if isinstance(note, str) else None)


class AnswerButtons(OutOfBand):
    """A question card's answer box, note and Answer (``_stop_buttons.js``): the answer is
    sent as typed, and read as the question's schema asks (as ``kernelext answer`` reads
    it). ``on_action(action, answer, note)`` runs ``answer`` in the kernel (a click the
    server could not take), or ``resume`` once the server stored the answer."""

    actions = ("answer", "resume")
    key = traitlets.Unicode("").tag(sync=True)  # the question's key
    choices = traitlets.List(traitlets.Unicode()).tag(sync=True)  # typed forms of its choices
    # What a person reads (through the display door); a pick sends its choice, by index.
    choice_labels = traitlets.List(traitlets.Unicode()).tag(sync=True)
    multiline = traitlets.Bool(False).tag(sync=True)  # a JSON object or list
    typed = traitlets.Unicode("").tag(sync=True)  # the answer typed so far (or the default)
    typed_label = traitlets.Unicode("").tag(sync=True)  # the default as shown; sent as typed
    note = traitlets.Unicode("").tag(sync=True)
    decided = traitlets.Bool(False).tag(sync=True)
    answered_text = traitlets.Unicode("").tag(sync=True)  # "answered elsewhere by ... at ..."

    def __init__(self, on_action: Callable[..., str | None], **kwargs: Any) -> None:
        super().__init__(on_action, kind="question", **kwargs)

    def _call(self, action: str, content: dict[str, Any]) -> str | None:
        typed, note = content.get("answer"), content.get("note")
        return self._on_action(
            action,
            typed if isinstance(typed, str) else None,
            note if isinstance(note, str) else None,
        )


def draw_stop_buttons(
    remote: StopButtons, status: str, stop_pending: bool, cell: bool, epoch: int | None
) -> None:
    """Enable Stop and Force stop whenever the run is live, here or in another process.

    ``epoch`` (the run's ``owner_epoch``) travels with a click: a click that reaches the
    store after the run was resumed is refused, not applied to the new session."""
    live = status in LIVE
    remote.epoch = -1 if epoch is None else int(epoch)
    idle = STOP_TIPS["idle"].format(status=status)
    remote.stop_disabled = not live
    remote.stop_tooltip = (
        idle if not live else STOP_TIPS["asked"] if stop_pending else STOP_TIPS["live"]
    )
    remote.force_disabled = not live or cell
    remote.force_tooltip = idle if not live else FORCE_TIPS["cell"] if cell else FORCE_TIPS["live"]
