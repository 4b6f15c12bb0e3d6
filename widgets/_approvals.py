"""Approve / Reject a waiting call, and answer a question, from the notebook.

* :class:`ApprovalCard`: one request — tool, arguments (redacted), step, time left, a
  note, and **Approve** / **Reject** (CSS classes ``kernelext-approval``,
  ``kernelext-approve``, ``kernelext-reject``, ``kernelext-approval-note``).
* :class:`QuestionCard` (``_questions.py``): one ``run.ask`` question — the prompt, an
  answer box, a note, and **Answer**, sent through the notebook server as Approve is.
* :class:`ApprovalsBox`: the panel add-on showing the cards of the panel's run while it
  waits for a person; a decision that resumes the run makes the panel follow it.
  :func:`approvals_addon` is its control-panel add-on (installed by
  ``widgets/_addons.py``).
* :func:`approvals_mimebundle`: how ``kx.approvals()`` / ``kx.questions()`` display.

Approve, Reject and Answer are recorded by the notebook server (``_stop_buttons.js``),
so they land while the kernel is busy; a click the server could not take runs in the
kernel's main thread, while the agent runs in its worker thread. Imports the core only.
"""

from __future__ import annotations

import json
from typing import Any

import ipywidgets as w

from kernelext._core.encoding.data_args import argument_text
from kernelext._core.lifecycle.control import resume_if_here
from kernelext._core.lifecycle.from_elsewhere import store_address
from kernelext._core.people.approvals import Approval, approvals
from kernelext._core.people.questions import Question, questions
from kernelext._core.views.colours import REQUEST_COLOURS
from kernelext._formatting import moment_text
from kernelext._shown import shown_html
from kernelext.status import Reason, Status

from ._data_view import data_box
from ._questions import (
    SOURCE,
    Decided,
    QuestionCard,
    error_html,
    input_for,
    resumed_text,
)
from ._stop_buttons import DecisionButtons

__all__ = [
    "ApprovalCard",
    "ApprovalsBox",
    "QuestionCard",
    "approvals_addon",
    "approvals_mimebundle",
    "args_html",
    "badge_html",
    "cards",
    "decided_elsewhere_html",
    "input_for",
]

WAITING_FOR_PERSON = (Reason.APPROVAL, Reason.INPUT)


def args_html(arguments: dict[str, Any]) -> str:
    rows = "".join(
        f"<tr><td><code>{shown_html(str(k))}</code></td>"
        f"<td><code>{shown_html(argument_text(v))}</code></td></tr>"
        for k, v in arguments.items()  # a data argument: its summary; every row below
    )
    return f'<table class="kernelext-approval-args">{rows}</table>'


class ApprovalCard(w.VBox):
    """One approval request; ``approve_button.click()`` works from code too."""

    def __init__(self, item: Approval, *, on_decided: Decided | None = None) -> None:
        self.item = item
        self.on_decided = on_decided
        self.handle: Any = None
        self.header = w.HTML()
        self.args = w.HTML(args_html(item.arguments))
        self.data = data_box(item)  # every row of its data arguments, a page at a time
        self.note = w.Text(placeholder="note for the record (optional)")
        self.note.add_class("kernelext-approval-note")
        self.approve_button = w.Button(
            description="Approve",
            icon="check",
            button_style="success",
            tooltip="Allow this one call, with these arguments, once; the run goes on",
            layout=w.Layout(width="auto"),
        )
        self.approve_button.add_class("kernelext-approve")
        self.reject_button = w.Button(
            description="Reject",
            icon="times",
            button_style="danger",
            tooltip="Refuse it: the agent gets kx.EffectRejected at this call",
            layout=w.Layout(width="auto"),
        )
        self.reject_button.add_class("kernelext-reject")
        self.message = w.HTML()
        # Shown: the note, Approve and Reject sent through the notebook server, so a click
        # is recorded while the kernel is busy; note, approve_button and reject_button stay
        # for code and for a click the server could not take (DecisionButtons hands it here).
        self.buttons = DecisionButtons(
            self._on_remote,
            run_id=item.run_id,
            store=store_address(item.store),
            request=str(item.id),
            busy_hint=(
                "The kernel is busy and this Jupyter server has no kernelext route: decide it "
                f"in a terminal with `kernelext approve {item.id}` (or reject)."
            ),
        )
        super().__init__(
            children=[
                part
                for part in (self.header, self.args, self.data, self.buttons, self.message)
                if part is not None
            ],
            layout=w.Layout(
                border=f"1px solid {REQUEST_COLOURS['approval']}", padding="2px 8px", margin="4px 0"
            ),
        )
        self.add_class("kernelext-approval")
        self.approve_button.on_click(lambda _b: self._decide(True))
        self.reject_button.on_click(lambda _b: self._decide(False))
        self.draw()

    def draw(self) -> None:
        item = self.item
        state = item.decision or f"waiting, {item.time_left}"
        self.header.value = (
            f"<div><b>{shown_html(item.tool)}</b> needs approval · run "
            f"<code>{shown_html(item.run_id)}</code> · {shown_html(item.step_text)}"
            f" · {shown_html(state)}</div>"
        )
        for control in (self.note, self.approve_button, self.reject_button):
            control.disabled = item.decision is not None
        self.buttons.decided = item.decision is not None

    def _on_remote(self, action: str, note: str | None) -> str | None:
        """A click of the shown buttons, in the kernel: a decision the server could not
        record, or ``resume`` once it recorded one."""
        if action == "resume":
            self.handle = resume_if_here(self.item.store, self.item.run_id, SOURCE)
            self.buttons.decided = True
            if self.on_decided is not None:
                self.on_decided(self.handle)
            return None
        self.note.value = note or ""
        self._decide(action == "approve")
        return None

    def _decide(self, approve: bool) -> None:
        note = str(self.note.value).strip() or None
        try:
            if approve:
                self.handle = self.item.approve(note, source=SOURCE)
            else:
                self.handle = self.item.reject(note, source=SOURCE)
        except Exception as exc:  # the card says why (decided elsewhere, expired, ...)
            self.message.value = error_html(exc)
            return
        self.message.value = resumed_text(self.handle, "approved" if approve else "rejected")
        self.draw()
        if self.on_decided is not None:
            self.on_decided(self.handle)


def request_key(item: Any) -> tuple[Any, ...]:
    """What names one card's request across reads of the store: an approval's id; a
    question's key with what its input is built from (a step run again may ask it anew,
    under the same key, with another schema: that is a new card)."""
    if isinstance(item, Approval):
        return ("approval", item.id)
    shape = json.dumps([item.schema, item.default], sort_keys=True, default=str)
    return ("question", item.key, shape)


def cards(items: list[Any], on_decided: Decided | None = None) -> list[Any]:
    made: list[Any] = []
    for item in items:
        if isinstance(item, Approval):
            made.append(ApprovalCard(item, on_decided=on_decided))
        elif isinstance(item, Question):
            made.append(QuestionCard(item, on_decided=on_decided))
    return made


def approvals_mimebundle(items: Any) -> dict[str, Any]:
    """For ``runtime().settings.approvals_renderer``: ``kx.approvals()`` / ``kx.questions()`` as
    cards, with their text as the fallback."""
    body = cards(list(items)) or [w.HTML(f"<div>{shown_html(items.text())}</div>")]
    box = w.VBox(body)
    box.add_class("kernelext-approvals")
    bundle: dict[str, Any] = dict(box._repr_mimebundle_() or {})
    bundle["text/plain"] = items.text()
    return bundle


DECISION_KINDS = {"approval_decided": "approval", "input_answered": "question"}
WHERE = {
    "cli": "in a terminal",
    "widget": "in a notebook",
    "panel": "in a notebook",
    "api": "from code",
    "magic": "in a notebook",
}


def decided_elsewhere_html(events: list[dict[str, Any]]) -> str:
    """The last decision of a run's request, as who, where and when: what a person who
    did not make it needs to go on ("approved in a terminal by root at …: press Resume")."""
    last = next((e for e in reversed(events) if e.get("kind") in DECISION_KINDS), None)
    if last is None:
        return ""
    what = DECISION_KINDS[str(last["kind"])]
    detail = last.get("detail")
    decision = "answered"
    if what == "approval":
        try:
            decision = str(json.loads(detail or "{}").get("decision") or "decided")
        except ValueError:
            decision = "decided"
    where = WHERE.get(str(last.get("source") or ""), f"through {last.get('source') or 'code'}")
    who = f" by {last['actor']}" if last.get("actor") else ""
    when = moment_text(last["occurred_at"]) if last.get("occurred_at") else "earlier"
    text = (
        f"The {what} was {decision} {where}{who} at {when}. Press Resume to go on: the run "
        "continues from where it waited."
    )
    return f'<div class="kernelext-decided-elsewhere">{shown_html(text)}</div>'


class ApprovalsBox(w.VBox):
    """The panel add-on: the run's open requests and questions while it waits for them,
    at the top of the panel under a "waiting for your approval" badge; once they are
    decided elsewhere, who decided, where, and how to go on."""

    at_top = True  # the panel shows it above everything that grows

    def __init__(self, panel: Any) -> None:
        super().__init__()
        self.panel = panel
        self.add_class("kernelext-approvals")
        self._marker: tuple[Any, ...] | None = None
        self.waiting = 0  # requests shown that wait for a person
        # One badge and one line for good: children that stay the same models keep their
        # views in the browser, so a redraw never re-creates a card a person is typing in.
        self.badge = w.HTML()
        self.elsewhere = w.HTML()
        self.refresh()

    @property
    def cards(self) -> tuple[Any, ...]:
        """The request cards shown (without the badge or the decided-elsewhere line)."""
        shown: tuple[Any, ...] = tuple(self.children)
        return tuple(c for c in shown if isinstance(c, (ApprovalCard, QuestionCard)))

    def _waiting(self) -> tuple[Any, ...]:
        view = getattr(self.panel, "view", None)
        handle = self.panel.handle
        # a change of the run in the store (a decision made elsewhere) rebuilds the cards
        changes = getattr(self.panel, "store_changes", 0)
        if view is not None and view.run_id == handle.run_id:
            return (view.run_id, view.status, view.reason, view.deadline, changes)
        row = handle.store.get_run(handle.run_id)
        return (row["id"], row["status"], row["reason"], row["deadline"], changes)

    def refresh(self) -> None:
        """Rebuild when the run starts or stops waiting for a person (cheap otherwise)."""
        marker = self._waiting()
        if marker == self._marker:
            return
        self._marker = marker
        run_id, status, reason, _deadline, _changes = marker
        if status != Status.SUSPENDED or reason not in WAITING_FOR_PERSON:
            self.children = ()
            self.waiting = 0
            return
        store = self.panel.handle.store
        waiting = [*approvals(run_id, store=store), *questions(run_id, store=store)]
        self.waiting = len(waiting)
        if not waiting:  # decided elsewhere (a terminal, another notebook): say so
            self.elsewhere.value = decided_elsewhere_html(store.events(run_id))
            line: tuple[Any, ...] = (self.elsewhere,)
            self.children = line
            return
        # A card still waiting is kept, with what the person typed in it so far.
        shown: dict[tuple[Any, ...], Any] = {}
        showing: tuple[Any, ...] = tuple(self.children)
        for shown_card in showing:
            if isinstance(shown_card, (ApprovalCard, QuestionCard)):
                shown[request_key(shown_card.item)] = shown_card
        kept: list[Any] = []
        for item in waiting:
            card = shown.get(request_key(item))
            if card is None:
                kept += cards([item], on_decided=self._decided)
            else:
                card.item = item
                card.draw()
                kept.append(card)
        self.badge.value = badge_html(waiting)
        shown_now: tuple[Any, ...] = (self.badge, *kept)
        if shown_now != tuple(self.children):
            self.children = shown_now

    def _decided(self, handle: Any) -> None:
        if handle is not None:
            self.panel.follow(handle)  # the resumed run, in the same panel
        self._marker = None
        self.panel.refresh()


def badge_html(waiting: list[Any]) -> str:
    """ "waiting for your approval" (or answer): what the run waits for, first thing shown."""
    asks = {"approval" if isinstance(item, Approval) else "answer" for item in waiting}
    what = " and ".join(sorted(asks))
    colour = REQUEST_COLOURS["approval" if "approval" in asks else "question"]
    return (
        f'<div class="kernelext-waiting-badge" style="display:inline-block;border-radius:6px;'
        f'padding:1px 8px;border:1px solid {colour};font-weight:bold">'
        f"waiting for your {what}</div>"
    )


def approvals_addon(panel: Any) -> ApprovalsBox:
    """A ``PANEL_ADDONS`` factory: the approvals box of the panel's run."""
    return ApprovalsBox(panel)
