"""A ``run.ask`` question's card (:class:`QuestionCard`): the prompt, and an answer box
whose Answer goes through the notebook server (``AnswerButtons``), so an answer is stored
while the kernel is busy; ``input_for`` builds the in-kernel input that fits a schema (text
box, number, checkbox, dropdown, or a small form) that code and a click the server could
not take use. Classes: ``kernelext-question``, ``kernelext-answer``, ``kernelext-answer-input``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import ipywidgets as w

from kernelext._core.lifecycle.control import resume_if_here
from kernelext._core.lifecycle.from_elsewhere import store_address
from kernelext._core.people.asking import parse_answer
from kernelext._core.people.questions import Question
from kernelext._core.views.colours import BAD, REQUEST_COLOURS
from kernelext._formatting import moment_text
from kernelext._shown import shown, shown_html

from ._stop_buttons import AnswerButtons

__all__ = ["SOURCE", "Decided", "QuestionCard", "answer_buttons", "error_html", "input_for"]

SOURCE = "widget"
Decided = Callable[[Any], None]


def error_html(exc: Exception) -> str:
    return f'<div style="color:{BAD}">{shown_html(str(exc))}</div>'


def resumed_text(handle: Any, done: str) -> str:
    if handle is None:
        return f"<div>{done}; the run goes on at its next resume.</div>"
    return f"<div>{done}; the run resumed.</div>"


def input_for(spec: dict[str, Any], default: Any = None) -> tuple[Any, Callable[[], Any]]:
    """An input widget that fits ``spec`` and a function reading its value."""
    if "enum" in spec:
        choices = list(spec["enum"])
        options = [
            (shown(c if isinstance(c, str) else json.dumps(c)), i) for i, c in enumerate(choices)
        ]
        start = choices.index(default) if default in choices else 0
        box: Any = w.Dropdown(options=options, value=start)
        return box, lambda: choices[box.value]
    kind = spec.get("type")
    if kind in ("integer", "number"):
        bounded = "minimum" in spec or "maximum" in spec
        if kind == "integer":
            cls: Any = w.BoundedIntText if bounded else w.IntText
        else:
            cls = w.BoundedFloatText if bounded else w.FloatText
        limits = {k: spec[m] for k, m in (("min", "minimum"), ("max", "maximum")) if m in spec}
        if bounded:
            limits.setdefault("min", -(10**12))
            limits.setdefault("max", 10**12)
        value = default if isinstance(default, (int, float)) else limits.get("min", 0)
        box = cls(value=value, **limits)
        return box, lambda: box.value
    if kind == "boolean":
        box = w.Checkbox(value=bool(default), description="yes", indent=False)
        return box, lambda: bool(box.value)
    if kind == "string":
        box = w.Text(value=default if isinstance(default, str) else "")
        return box, lambda: str(box.value)
    if kind == "object" and isinstance(spec.get("properties"), dict):
        return _form(spec, default if isinstance(default, dict) else {})
    text = "" if default is None else json.dumps(default)
    box = w.Textarea(value=text, placeholder="your answer (JSON or text)")
    return box, lambda: parse_answer(spec, str(box.value))


def _form(spec: dict[str, Any], default: dict[str, Any]) -> tuple[Any, Callable[[], Any]]:
    required = set(spec.get("required") or ())
    rows, readers = [], {}
    for field, sub in spec["properties"].items():
        widget, read = input_for(sub if isinstance(sub, dict) else {}, default.get(field))
        mark = " *" if field in required else ""
        rows.append(w.HBox([w.HTML(f"<code>{shown_html(field)}</code>{mark}"), widget]))
        readers[field] = read

    def read_all() -> dict[str, Any]:
        values = {field: read() for field, read in readers.items()}
        return {k: v for k, v in values.items() if k in required or v not in ("", None)}

    return w.VBox(rows), read_all


class QuestionCard(w.VBox):
    """One open question; ``answer_button.click()`` works from code too."""

    def __init__(self, item: Question, *, on_decided: Decided | None = None) -> None:
        self.item = item
        self.on_decided = on_decided
        self.handle: Any = None
        self.answered_here = False
        self.header = w.HTML()
        self.input, self._read = input_for(item.schema, item.default)
        self.input.add_class("kernelext-answer-input")
        self.note = w.Text(placeholder="note for the record (optional)")
        self.answer_button = w.Button(
            description="Answer",
            icon="reply",
            button_style="primary",
            tooltip="Store the answer; the run goes on and gets it back from run.ask",
            layout=w.Layout(width="auto"),
        )
        self.answer_button.add_class("kernelext-answer")
        self.message = w.HTML()
        # Shown: the answer box, note and Answer sent through the notebook server, so an
        # answer is stored while the kernel is busy; input, note and answer_button stay for
        # code and for a click the server could not take (AnswerButtons hands it here).
        self.buttons = answer_buttons(item, self._on_remote)
        super().__init__(
            children=[self.header, self.buttons, self.message],
            layout=w.Layout(
                border=f"1px solid {REQUEST_COLOURS['question']}", padding="2px 8px", margin="4px 0"
            ),
        )
        self.add_class("kernelext-question")
        self.answer_button.on_click(self._on_answer)
        self.draw()

    def draw(self) -> None:
        item = self.item
        state = self.answered_text() or item.time_left
        self.header.value = (
            f"<div><b>{shown_html(item.prompt)}</b> · run <code>{shown_html(item.run_id)}"
            f"</code> · {shown_html(item.step_text)} · {shown_html(state)}</div>"
        )
        for control in (self.input, self.note, self.answer_button):
            control.disabled = item.answered
        self.buttons.decided = item.answered
        self.buttons.answered_text = self.answered_text()

    def answered_text(self) -> str:
        """``answered elsewhere by ana at 03:01 CET`` (a terminal, another notebook), or
        ``answered`` here; empty while the question is open."""
        row = self.item.row
        if not self.item.answered:
            return ""
        if self.answered_here or row.get("answered_at") is None:
            return "answered"
        return f"answered elsewhere by {row.get('actor')} at {moment_text(row['answered_at'])}"

    def reload(self) -> None:
        """Read the question again (answered elsewhere since?) and redraw."""
        row = self.item.store.question_row(self.item.key)
        if row is not None:
            self.item = Question(self.item.store, row)
        self.draw()

    def value(self) -> Any:
        return self._read()

    def _on_remote(self, action: str, typed: str | None, note: str | None) -> str | None:
        """A click of the shown Answer, in the kernel: an answer the server could not
        store, or ``resume`` once it stored one."""
        if action == "resume":
            self.answered_here = True
            self.reload()
            self.handle = resume_if_here(self.item.store, self.item.run_id, SOURCE)
            if self.on_decided is not None:
                self.on_decided(self.handle)
            return None
        self._answer(lambda: parse_answer(self.item.schema, typed or ""), note)
        return None

    def _on_answer(self, _button: Any = None) -> None:
        self._answer(self.value, str(self.note.value))

    def _answer(self, read: Callable[[], Any], note: str | None) -> None:
        try:
            self.handle = self.item.answer(read(), note=(note or "").strip() or None, source=SOURCE)
        except Exception as exc:  # refused (does not fit, answered elsewhere, expired)
            self.message.value = error_html(exc)
            self.reload()
            return
        self.answered_here = True
        self.message.value = resumed_text(self.handle, "answered")
        self.draw()
        if self.on_decided is not None:
            self.on_decided(self.handle)


def answer_buttons(item: Question, on_action: Callable[..., str | None]) -> AnswerButtons:
    """The out-of-band answer box of question ``item``: its choices (true / false for a
    yes-or-no question) or a box prefilled with its default, as ``kernelext answer`` reads them."""
    spec = item.schema
    choices: list[str] = []
    if "enum" in spec:
        choices = [c if isinstance(c, str) else json.dumps(c) for c in spec["enum"]]
    elif spec.get("type") == "boolean":
        choices = ["true", "false"]
        if item.default is False:
            choices.reverse()
    default = item.default
    typed = "" if default is None else default if isinstance(default, str) else json.dumps(default)
    return AnswerButtons(
        on_action,
        run_id=item.run_id,
        store=store_address(item.store),
        key=str(item.key),
        choices=choices,
        choice_labels=[shown(choice) for choice in choices],
        multiline=spec.get("type") in ("object", "array") or not spec,
        typed=typed,
        typed_label=shown(typed, lines=True),
        busy_hint=(
            "The kernel is busy and this Jupyter server has no kernelext route: answer in a "
            f"terminal with `kernelext answer {item.run_id} VALUE`."
        ),
    )
