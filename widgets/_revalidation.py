"""The revalidation widget: a run's facts side by side, and the three ways out.

A scrollable table (fact, recorded value, current value, age, check status, step),
contradictions first, then "Accept and continue", "Re-plan from step" (with a step
picker and the list of effects that a re-plan replays from the ledger instead of
repeating) and "Abort run". Without a front end it shows as the revalidation's text.
Imports the core only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ipywidgets as w

from kernelext._core.lifecycle.revalidation import FactCheck, Revalidation, revalidation
from kernelext._core.views.colours import BAD, CHECK_COLOURS, THEME, colour_of
from kernelext._formatting import duration_text, step_label
from kernelext._shown import shown_html, shows
from kernelext.status import Status

__all__ = [
    "RevalidationWidget",
    "render_revalidation",
    "revalidation_for_handle",
    "revalidation_mimebundle",
]

SOURCE = "widget"
TABLE_HEIGHT = "320px"


class RevalidationWidget(w.VBox):
    """Drive it from code too: ``widget.accept_button.click()`` and so on."""

    def __init__(
        self, rev: Revalidation, *, on_decided: Callable[[Any], None] | None = None
    ) -> None:
        self.rev = rev
        self.on_decided = on_decided
        self.decided = False  # a decision was recorded here: nothing more to click
        self.summary = w.HTML()
        self.table = w.HTML()
        self.note = w.Text(
            placeholder="note for the record (optional)", layout=w.Layout(width="60%")
        )
        self.step_picker = w.Dropdown(description="from step", layout=w.Layout(width="40%"))
        self.replayed = w.HTML()
        self.accept_button = w.Button(
            description="Accept and continue",
            icon="check",
            button_style="success",
            tooltip="The current values become the recorded facts; the run resumes",
            layout=w.Layout(width="auto"),
        )
        self.replan_button = w.Button(
            description="Re-plan from step",
            icon="undo",
            button_style="warning",
            tooltip="Resume from the snapshot before the chosen step",
            layout=w.Layout(width="auto"),
        )
        self.abort_button = w.Button(
            description="Abort run",
            icon="times",
            button_style="danger",
            tooltip="Cancel the run",
            layout=w.Layout(width="auto"),
        )
        self.message = w.HTML()
        buttons = w.HBox([self.accept_button, self.replan_button, self.abort_button])
        super().__init__(
            children=[
                self.summary,
                self.table,
                self.note,
                w.HBox([self.step_picker]),
                self.replayed,
                buttons,
                self.message,
            ]
        )
        self.add_class("kernelext-revalidation")
        self.accept_button.on_click(self._on_accept)
        self.replan_button.on_click(self._on_replan)
        self.abort_button.on_click(self._on_abort)
        self.step_picker.observe(self._on_step_picked, names="value")
        self.draw()

    # -- drawing ---------------------------------------------------------------------------
    def draw(self) -> None:
        rev = self.rev
        bad = rev.contradictions
        self.summary.value = (
            f"<b>Run {shown_html(rev.run_id)}</b>: {shown_html(rev.status)} — "
            f"{len(bad)} of {len(rev.facts)} fact(s) no longer hold"
            + (
                f"; first decide {len(rev.unknown_effects)} effect(s) with an unknown outcome "
                f"(<code>kx.reconcile({rev.run_id!r})</code>)"
                if rev.unknown_effects
                else ""
            )
        )
        self.table.value = facts_table_html(rev.facts)
        options = [(step_label(s["ordinal"], s["key"]), s["ordinal"]) for s in rev.steps]
        if list(self.step_picker.options) != options:
            self.step_picker.options = options
            if options:
                self.step_picker.value = options[0][1]
        self._show_replayed()
        decidable = (
            not self.decided
            and rev.decision is None
            and rev.status == Status.NEEDS_DECISION
            and bool(bad)
            and not rev.unknown_effects
        )
        self.accept_button.disabled = not decidable
        self.replan_button.disabled = not decidable or not options
        self.abort_button.disabled = (
            self.decided or rev.decision is not None or rev.status != Status.NEEDS_DECISION
        )
        self.step_picker.disabled = self.replan_button.disabled
        self.note.disabled = self.abort_button.disabled

    def _show_replayed(self) -> None:
        ordinal = self.step_picker.value
        if ordinal is None:
            self.replayed.value = ""
            return
        effects = self.rev.replayed_effects(ordinal)
        if not effects:
            self.replayed.value = "<div>No effect was recorded from that step on.</div>"
            return
        rows = "".join(
            f"<tr><td>{shown_html(str(e['tool']))}</td><td>"
            f"{shown_html(step_label(e.get('step_ordinal'), e.get('step_key')))}</td>"
            f"<td>{shown_html(str(e['status']))}</td>"
            f"<td><code>{shown_html(str(e['key']))}</code></td></tr>"
            for e in effects
        )
        self.replayed.value = (
            f"<div>Re-planning from {step_label(ordinal)} replays {len(effects)} effect(s) from "
            "the ledger; they are <b>not performed again</b>:</div>"
            f'<div style="max-height:160px;overflow-y:auto"><table>'
            "<tr><th>tool</th><th>step</th><th>status</th><th>key</th></tr>"
            f"{rows}</table></div>"
        )

    # -- buttons ---------------------------------------------------------------------------
    def _note(self) -> str | None:
        text = str(self.note.value).strip()
        return text or None

    def _decide(self, action: Callable[[], Any], done: str) -> None:
        for button in (self.accept_button, self.replan_button, self.abort_button):
            button.disabled = True
        try:
            handle = action()
        except Exception as exc:  # the widget says what went wrong and stays usable
            self.rev.reload()
            self.draw()
            self.message.value = f'<div style="color:{BAD}">{shown_html(str(exc))}</div>'
            return
        self.decided = True
        self.draw()
        status = handle.status if handle is not None else self.rev.status
        self.message.value = f"<div>{shown_html(done)} — run is now {shown_html(status)}.</div>"
        if self.on_decided is not None:
            self.on_decided(handle)

    def _on_accept(self, _button: Any = None) -> None:
        self._decide(lambda: self.rev.accept(note=self._note(), source=SOURCE), "Accepted")

    def _on_replan(self, _button: Any = None) -> None:
        ordinal = self.step_picker.value
        self._decide(
            lambda: self.rev.replan(ordinal, note=self._note(), source=SOURCE),
            f"Re-planned from {step_label(ordinal)}",
        )

    def _on_abort(self, _button: Any = None) -> None:
        self._decide(lambda: self.rev.abort(note=self._note(), source=SOURCE), "Aborted")

    def _on_step_picked(self, _change: Any = None) -> None:
        self._show_replayed()

    @shows
    def __repr__(self) -> str:
        return self.rev.text()


def facts_table_html(facts: list[FactCheck]) -> str:
    """A scrollable table, contradictions first."""
    ordered = sorted(facts, key=lambda f: (not f.contradicted, f.step_ordinal or -1, f.name))
    rows = []
    for fact in ordered:
        colour = colour_of(CHECK_COLOURS, fact.status)
        outside = fact.step_key is None and fact.step_ordinal is None
        step = "" if outside else step_label(fact.step_ordinal, fact.step_key)
        title = shown_html(fact.detail)
        rows.append(
            f"<tr><td>{shown_html(fact.name)}</td><td>{_cell(fact, False)}</td>"
            f"<td>{_cell(fact, True)}</td><td>{duration_text(fact.age)}</td>"
            f'<td style="color:{colour}" title="{title}">{_check_html(fact)}</td>'
            f"<td>{shown_html(step)}</td></tr>"
        )
    return (
        f'<div style="max-height:{TABLE_HEIGHT};overflow-y:auto">'
        '<table class="kernelext-facts" style="border-collapse:collapse;width:100%">'
        "<thead><tr><th>fact</th><th>recorded</th><th>current</th><th>age</th>"
        "<th>check</th><th>step</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table></div>"
    )


def _check_html(fact: FactCheck) -> str:
    """The check's status and, as the text says it, why (``unresolved`` alone says little)."""
    if not fact.detail:
        return shown_html(fact.status)
    return (
        f"{shown_html(fact.status)}: "
        f'<span class="kernelext-check-detail" style="color:{THEME["text"]}">'
        f"{shown_html(fact.detail)}</span>"
    )


def _cell(fact: FactCheck, current: bool) -> str:
    if fact.kind == "credential":
        return (
            "<i>credential, not stored</i>" if not current else shown_html(fact.fingerprint or "")
        )
    if current and fact.row["current_value"] is None:
        return "—"
    text = repr(fact.current if current else fact.recorded)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"<code>{shown_html(text)}</code>"


def render_revalidation(
    rev: Revalidation, on_decided: Callable[[Any], None] | None = None
) -> RevalidationWidget:
    """The widget for ``kx.revalidation(run_id)``."""
    return RevalidationWidget(rev, on_decided=on_decided)


def revalidation_mimebundle(rev: Revalidation) -> dict[str, Any]:
    """For ``runtime().settings.revalidation_renderer``: the widget plus its text fallback."""
    widget = render_revalidation(rev)
    bundle: dict[str, Any] = dict(widget._repr_mimebundle_() or {})
    bundle["text/plain"] = rev.text()
    return bundle


def revalidation_for_handle(
    handle: Any, on_decided: Callable[[Any], None] | None = None
) -> RevalidationWidget | None:
    """For a run's panel: the widget when the run waits on contradicted facts, else None."""
    rev = revalidation(handle.run_id, store=handle.store)
    if rev.status != Status.NEEDS_DECISION or rev.unknown_effects or not rev.contradictions:
        return None
    return RevalidationWidget(rev, on_decided=on_decided)
