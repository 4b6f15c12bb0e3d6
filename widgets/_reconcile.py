"""The reconciliation widget: effects whose outcome is unknown, and the three decisions.

A scrollable table (tool, redacted arguments, key, time of intent, step, decision)
and one row of controls acting on the effect picked in the list, so that a run with
hundreds of unknowns stays readable (not a wall of buttons): "It happened" (with an
optional result, JSON or plain text), "It did not happen — retry" and "Give up on
this run". Without a front end it shows as the reconciliation's text. Imports the
core only.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import ipywidgets as w

from kernelext._core.people.reconcile import GIVE_UP, Reconciliation, UnknownEffect, reconcile
from kernelext._core.views.colours import BAD
from kernelext._formatting import moment_text
from kernelext._shown import shown, shown_html, shows
from kernelext.status import EffectStatus

__all__ = [
    "ReconcileWidget",
    "reconcile_for_handle",
    "reconciliation_mimebundle",
    "render_reconciliation",
]

SOURCE = "widget"
TABLE_HEIGHT = "320px"
DECISION_TEXT = {
    None: "undecided",
    EffectStatus.APPLIED: "it happened",
    EffectStatus.NOT_APPLIED: "retry",
    GIVE_UP: "gave up",
}


class ReconcileWidget(w.VBox):
    """Drive it from code too: pick with ``widget.picker.value = index``, then click."""

    def __init__(
        self, rec: Reconciliation, *, on_decided: Callable[[UnknownEffect], None] | None = None
    ) -> None:
        self.rec = rec
        self.on_decided = on_decided
        self.summary = w.HTML()
        self.table = w.HTML()
        self.picker = w.Dropdown(description="effect", layout=w.Layout(width="90%"))
        self.result = w.Textarea(
            placeholder="result it returned (optional; JSON or text)",
            layout=w.Layout(width="90%", height="3em"),
        )
        self.note = w.Text(
            placeholder="note for the record (optional)", layout=w.Layout(width="90%")
        )
        self.happened_button = w.Button(
            description="It happened",
            icon="check",
            button_style="success",
            tooltip="Record it as applied with the result above; the resume returns that result",
            layout=w.Layout(width="auto"),
        )
        self.retry_button = w.Button(
            description="It did not happen — retry",
            icon="redo",
            button_style="info",
            tooltip="The resume makes the call again, same key",
            layout=w.Layout(width="auto"),
        )
        self.give_up_button = w.Button(
            description="Give up on this run",
            icon="times",
            button_style="danger",
            tooltip="Cancel the run and release its claims",
            layout=w.Layout(width="auto"),
        )
        self.message = w.HTML()
        buttons = w.HBox([self.happened_button, self.retry_button, self.give_up_button])
        super().__init__(
            children=[
                self.summary,
                self.table,
                self.picker,
                self.result,
                self.note,
                buttons,
                self.message,
            ]
        )
        self.add_class("kernelext-reconcile")
        self.happened_button.on_click(self._on_happened)
        self.retry_button.on_click(self._on_retry)
        self.give_up_button.on_click(self._on_give_up)
        self.draw()

    # -- drawing ---------------------------------------------------------------------------
    def draw(self) -> None:
        rec = self.rec
        open_items = rec.open
        gave_up = any(item.decision == GIVE_UP for item in rec)
        if gave_up:
            state = "the run was given up (cancelled)"
        elif open_items:
            state = f"{len(open_items)} of {len(rec)} effect(s) with an unknown outcome to decide"
        else:
            state = (
                f"all decided: resume with <code>kx.resume({rec.run_id!r})</code>"
                if rec
                else "no effect with an unknown outcome"
            )
        self.summary.value = f"<b>Run {shown_html(rec.run_id)}</b>: {state}"
        self.table.value = effects_table_html(rec)
        options = [
            (_label(index, item), index) for index, item in enumerate(rec) if item.decision is None
        ]
        current = self.picker.value
        self.picker.options = options
        values = [value for _, value in options]
        if values:
            self.picker.value = current if current in values else values[0]
        disabled = gave_up or not options
        for control in (
            self.picker,
            self.result,
            self.note,
            self.happened_button,
            self.retry_button,
            self.give_up_button,
        ):
            control.disabled = disabled

    # -- buttons ---------------------------------------------------------------------------
    def selected(self) -> UnknownEffect | None:
        index = self.picker.value
        return self.rec[index] if index is not None else None

    def _decide(self, decide: Callable[[UnknownEffect, str | None], None], done: str) -> None:
        item = self.selected()
        if item is None:
            self.message.value = "<div>Pick an undecided effect first.</div>"
            return
        note = str(self.note.value).strip() or None
        try:
            decide(item, note)
        except Exception as exc:  # the widget says what went wrong and stays usable
            self.message.value = f'<div style="color:{BAD}">{shown_html(str(exc))}</div>'
            return
        self.result.value = ""
        self.note.value = ""
        self.message.value = (
            f"<div>{shown_html(item.tool)} "
            f"<code>{shown_html(str(item.key))}</code>: "
            f"{shown_html(done)}.</div>"
        )
        self.draw()
        if self.on_decided is not None:
            self.on_decided(item)

    def _on_happened(self, _button: Any = None) -> None:
        result = parse_result(str(self.result.value))
        self._decide(
            lambda item, note: item.mark_applied(result, note=note, source=SOURCE),
            "recorded as applied",
        )

    def _on_retry(self, _button: Any = None) -> None:
        self._decide(
            lambda item, note: item.mark_not_applied(note=note, source=SOURCE),
            "recorded as not applied; the resume makes the call again",
        )

    def _on_give_up(self, _button: Any = None) -> None:
        self._decide(
            lambda item, note: item.give_up(note=note, source=SOURCE),
            "gave up; the run is cancelled",
        )

    @shows
    def __repr__(self) -> str:
        return self.rec.text()


def parse_result(text: str) -> Any:
    """The result field: empty -> None, valid JSON -> that value, else the text itself."""
    text = text.strip()
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def _label(index: int, item: UnknownEffect) -> str:
    return shown(f"{index + 1}. {item.tool} — {item.step_text} — {item.key}")


def effects_table_html(rec: Reconciliation) -> str:
    rows = []
    for index, item in enumerate(rec):
        args = item.args or ""
        if len(args) > 80:
            args = args[:77] + "..."
        step = item.step_text
        rows.append(
            f"<tr><td>{index + 1}</td><td>{shown_html(item.tool)}</td>"
            f"<td><code>{shown_html(args)}</code></td>"
            f"<td><code>{shown_html(str(item.key))}</code></td>"
            f"<td>{moment_text(item.intent_at)}</td><td>{shown_html(step)}</td>"
            f"<td>{shown_html(DECISION_TEXT.get(item.decision, str(item.decision)))}</td></tr>"
        )
    return (
        f'<div style="max-height:{TABLE_HEIGHT};overflow-y:auto">'
        '<table class="kernelext-unknowns" style="border-collapse:collapse;width:100%">'
        "<thead><tr><th>#</th><th>tool</th><th>arguments (redacted)</th><th>key</th>"
        "<th>intent</th><th>step</th><th>decision</th></tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table></div>"
    )


def render_reconciliation(
    rec: Reconciliation, on_decided: Callable[[UnknownEffect], None] | None = None
) -> ReconcileWidget:
    """The widget for ``kx.reconcile(run_id)``."""
    return ReconcileWidget(rec, on_decided=on_decided)


def reconciliation_mimebundle(rec: Reconciliation) -> dict[str, Any]:
    """For ``runtime().settings.reconcile_renderer``: the widget plus its text fallback."""
    widget = render_reconciliation(rec)
    bundle: dict[str, Any] = dict(widget._repr_mimebundle_() or {})
    bundle["text/plain"] = rec.text()
    return bundle


def reconcile_for_handle(
    handle: Any, on_decided: Callable[[UnknownEffect], None] | None = None
) -> ReconcileWidget | None:
    """For a run's panel: the widget when the run waits on unknown effects, else None."""
    rec = reconcile(handle.run_id, store=handle.store)
    if not rec:
        return None
    return ReconcileWidget(rec, on_decided=on_decided)
