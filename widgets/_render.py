"""What a run's control panel shows, as data, HTML and plain text (no ipywidgets here).

:func:`view_of` reads the run behind a handle from the store (its row, its last effects
and their counts, the step it executes in whatever process) into a :class:`PanelView`;
what only this process knows (the step executing here, effects replayed from the ledger)
comes from the run's engine. The live panel, the static HTML fallback used by nbconvert
and the plain-text repr are all drawn from that one view.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from kernelext._core.batch.view import BatchCounts, batch_counts
from kernelext._core.encoding.names import OUTSIDE_STEPS
from kernelext._core.lifecycle.run import engine_of
from kernelext._core.process.lease import gone_text, owner_gone
from kernelext._core.views.colours import RUN_COLOURS, THEME, colour_of
from kernelext._core.views.conversation import Conversation, conversation_of
from kernelext._formatting import (
    duration_text,
    moment_text,
    reason_text,
    step_label,
    step_numbers,
)
from kernelext._shown import shown_html
from kernelext.status import FINAL, LIVE, EffectStatus, Status

from ._batch import batch_html

__all__ = [
    "PanelView",
    "effect_label",
    "to_html",
    "to_text",
    "view_of",
]

EFFECT_ICONS: dict[str, str] = {
    EffectStatus.PENDING: "…",
    EffectStatus.APPLIED: "✓",
    "replayed": "↺",  # an applied effect returned from the ledger on resume (not a status)
    EffectStatus.FAILED: "✗",
    EffectStatus.UNKNOWN: "?",
    EffectStatus.NOT_APPLIED: "–",
    EffectStatus.GIVEN_UP: "–",  # an unknown effect a person gave up on (run cancelled)
}


@dataclass
class PanelView:
    """What a control panel shows of its run, read at its last redraw (``panel.view``,
    returned by ``panel.refresh()``): ``status``, ``reason``, the step and its time,
    ``stop_text()`` ("stop pending since HH:MM:SS (panel)" while a stop is pending, else
    None), ``progress_text()``, ``outcome_text()``; ``batch``: the counts of the ``run.map``
    in progress (or the last one it saw), drawn as the panel's batch bar."""

    run_id: str
    agent: str
    status: str
    reason: str | None = None
    alive: bool = False
    step_key: str | None = None
    step_ordinal: int | None = None  # as a person counts it (``step_numbers``)
    step_elapsed: float | None = None
    max_step_seconds: float | None = None
    completed: int = 0
    total: int | None = None
    stop_requested_at: dt.datetime | None = None
    stop_source: str | None = None
    deadline: dt.datetime | None = None
    now: dt.datetime | None = None  # the store's clock when the view was read (naive UTC)
    effects: list[tuple[str, str]] = field(default_factory=list)  # the last ones, oldest first
    effect_counts: dict[str, int] = field(default_factory=dict)  # status -> how many, all told
    error: str | None = None
    notice: str | None = None
    batch: BatchCounts | None = None  # the run.map in progress, or the last one seen here
    conversation: Conversation | None = None  # a run of model and tool calls, no run.steps
    stop_seen: bool = False  # this process raised the run's stop flag (the row may lag)
    owner_epoch: int | None = None  # the run's ownership epoch: a click's fencing token
    gone: str | None = None  # live in the store, but its process is gone (lease.gone_text)

    @property
    def stop_pending(self) -> bool:
        """A stop was asked for and has not landed: the row says ``stopping``, or this
        process raised the run's flag before the request reached the table."""
        return self.status == Status.STOPPING or (self.stop_seen and self.status in LIVE)

    @property
    def final(self) -> bool:
        return self.status in FINAL

    @property
    def batching(self) -> bool:
        """A ``run.map`` is in progress: its box says what runs (no step line)."""
        return self.batch is not None and not self.batch.ended

    def step_text(self) -> str:
        if self.step_key is None:
            return "between steps" if self.alive else "no step running"
        bound = f" / {duration_text(self.max_step_seconds)} max" if self.max_step_seconds else ""
        over = (
            "  (over its time bound)"
            if (self.max_step_seconds and (self.step_elapsed or 0) > self.max_step_seconds)
            else ""
        )
        label = step_label(self.step_ordinal, self.step_key, self.known_total)
        return f"{label}: {duration_text(self.step_elapsed or 0)}{bound}{over}"

    @property
    def known_total(self) -> int | None:
        """The announced step count, unless the run already did more steps than that."""
        return self.total if self.total and self.completed <= self.total else None

    def progress_text(self, *, done: str = " completed") -> str:
        """``3/5 steps``, or ``6 steps completed`` when the total is not known; for a run
        of model and tool calls ``7 turns · 3 tool calls · 1,234 tokens (...)``."""
        if self.known_total:
            return f"{self.completed}/{self.known_total} steps"
        steps = f"{self.completed} step{'s' if self.completed != 1 else ''}{done}"
        if self.conversation is not None:
            return self.conversation.progress(steps, self.completed)
        return steps

    def effects_text(self) -> str:
        """``7 effects: 6 applied, 1 unknown`` (every process and resume counted)."""
        total = sum(self.effect_counts.values())
        if not total:
            return "no effects yet"
        parts = ", ".join(f"{n} {status}" for status, n in sorted(self.effect_counts.items()))
        return f"{total} effect{'s' if total != 1 else ''}: {parts}"

    def stop_text(self) -> str | None:
        if not self.stop_pending:
            return None
        since = moment_text(self.stop_requested_at) if self.stop_requested_at else "now"
        return f"stop pending since {since} ({self.stop_source or 'api'})"

    def expiry_text(self) -> str:
        """``; expires in 6 d 23 h (2026-12-06 12:00:00 UTC)`` for a paused run with a deadline."""
        if self.deadline is None:
            return ""
        when = moment_text(self.deadline)
        left = self.deadline - (self.now or dt.datetime.now(dt.timezone.utc).replace(tzinfo=None))
        if left.total_seconds() <= 0:
            return f"; past its deadline ({when}): it expires at the next sweep"
        return f"; expires in {duration_text(left)} ({when})"

    def outcome_text(self) -> str | None:
        if self.gone and self.status in LIVE:
            return self.gone
        if self.status == Status.COMPLETED:
            return f"completed: {self.progress_text(done='')}"
        if self.status == Status.FAILED:
            return f"failed: {self.error or self.reason or 'see kx.runs()'}"
        if self.status == Status.SUSPENDED:
            done = self.progress_text(done="")
            why = reason_text(self.reason, self.stop_source)
            return f"suspended: {why}, after {done}{self.expiry_text()}"
        if self.status == Status.NEEDS_DECISION:
            return f"needs a decision: {self.reason or 'see kx.reconcile()'}{self.expiry_text()}"
        if self.status in (Status.EXPIRED, Status.CANCELLED):
            return f"{self.status}: {self.reason or ''}".rstrip(": ")
        return None


def view_of(
    handle: Any,
    effects: list[tuple[str, str]] | None = None,
    notice: str | None = None,
    batch: BatchCounts | None = None,
    *,
    replayed: Collection[Any] = (),
) -> PanelView:
    """Read the run behind ``handle`` from the store into a :class:`PanelView`.

    ``effects``: shown instead of the run's last effects in the store; ``replayed``: keys of
    effects this process returned from the ledger; ``batch``: the counts of the last batch
    seen, shown when none is in progress."""
    store = handle.store
    info = handle.info()
    run = engine_of(handle.run)
    current = run.current
    live = run.batch if handle.alive else None
    if live is not None:
        stopping = run.stop_event.is_set() or info["status"] == Status.STOPPING
        batch = batch_counts(live, stopping=stopping)
    view = PanelView(
        run_id=handle.run_id,
        agent=str(info.get("agent")),
        status=str(info["status"]),
        reason=info.get("reason"),
        alive=bool(handle.alive),
        max_step_seconds=run.max_step_seconds or info.get("max_step_seconds"),
        completed=int(info.get("completed_steps") or 0),
        total=info.get("total_steps") or run.total_steps,
        stop_requested_at=info.get("stop_requested_at"),
        stop_source=info.get("stop_source"),
        owner_epoch=info.get("owner_epoch"),
        deadline=info.get("deadline"),
        now=handle.store.now(),
        effects=list(
            effects if effects is not None else _effects_of(store, handle.run_id, replayed)
        ),
        effect_counts=store.effect_counts(handle.run_id),
        error=_error_text(handle, info),
        notice=notice,
        batch=batch,
    )
    if not handle.alive and view.status in LIVE and view.now and owner_gone(info, view.now):
        view.gone = gone_text(info)
    if not view.total:
        talk = conversation_of(handle.store.load_effects(handle.run_id).values())
        view.conversation = talk if (talk.turns or talk.tool_calls) else None
    if handle.alive and run.stop_event.is_set() and view.status in LIVE:
        # The request is durable (journaled and synced) before the flag goes up; the
        # table may show it a fold later. A person sees it now.
        view.stop_seen = True
        view.status = str(Status.STOPPING)
        view.stop_source = view.stop_source or run.stop_source
    if current is not None:
        view.step_key, view.step_ordinal = current.key, current.ordinal
        view.step_elapsed = current.elapsed
    elif view.status in LIVE:  # executing in another process: its open step in the store
        step = store.open_step(handle.run_id)
        if step is not None and view.now is not None:
            view.step_key, view.step_ordinal = str(step["key"]), step["ordinal"]
            view.step_elapsed = max(0.0, (view.now - step["started_at"]).total_seconds())
    if view.step_ordinal is not None and view.step_ordinal > view.completed:
        view.step_ordinal = counted_ordinal(store, handle.run_id, view.step_ordinal)
    return view


def _error_text(handle: Any, info: dict[str, Any]) -> str | None:
    """The error a panel shows: as stored and scrubbed (``Handle.error_text``), never the
    exception in memory; a handle without that door (a stand-in) shows the stored reason."""
    door = getattr(handle, "error_text", None)
    return door(info) if callable(door) else None


_COUNTED: dict[tuple[int, str, int], int] = {}  # (store, run, ordinal) -> as counted
_COUNTED_KEPT = 512


def counted_ordinal(store: Any, run_id: str, ordinal: int) -> int:
    """The running step's ordinal as a person counts it, by cell or item (``step_numbers``),
    when attempts before it did not complete (a cell run again). What a step's number is
    never changes once it started: the store is read once a step, not once a redraw."""
    key = (id(store), run_id, ordinal)
    if key not in _COUNTED:
        if len(_COUNTED) >= _COUNTED_KEPT:
            _COUNTED.clear()
        _COUNTED[key] = step_numbers(store.steps(run_id)).get(ordinal, ordinal)
    return _COUNTED[key]


def _effects_of(
    store: Any, run_id: str, replayed: Collection[Any], limit: int = 5
) -> list[tuple[str, str]]:
    rows = store.last_effects(run_id, limit)
    return [
        (
            effect_label(r.get("tool"), r),
            "replayed"
            if r["key"] in replayed and r["status"] == EffectStatus.APPLIED
            else str(r["status"]),
        )
        for r in rows
    ]


def effect_label(tool: Any, row: Mapping[str, Any]) -> str:
    """``pay [step 2]``: which call of which step (a ledger row's ``step_key`` and
    ``step_ordinal``), the step as every surface shows it."""
    key, ordinal = row.get("step_key"), row.get("step_ordinal")
    if (key is None and ordinal is None) or key == OUTSIDE_STEPS:
        return str(tool)
    return f"{tool} [{step_label(ordinal, None if key is None else str(key))}]"


# -- drawing ---------------------------------------------------------------------------
def status_badge(status: str) -> str:
    colour = colour_of(RUN_COLOURS, status)
    return (
        f'<span class="kernelext-status" style="background:{colour};color:white;'
        f'border-radius:8px;padding:1px 8px;font-weight:600">{shown_html(status)}</span>'
    )


def header_html(view: PanelView) -> str:
    muted = THEME["muted"]
    return (
        f"<div><b>run</b> <code>{shown_html(view.run_id)}</code> "
        f'<span style="color:{muted}">[{shown_html(view.agent)}]</span> '
        f"{status_badge(view.status)} "
        f'<span style="color:{muted}">{shown_html(view.progress_text())}</span></div>'
    )


def stop_html(view: PanelView) -> str:
    text = view.stop_text()
    if text is None:
        return ""
    return (
        '<div class="kernelext-stop-pending" style="display:inline-block;'
        f"background:{THEME['warn_paper']};color:{THEME['text']};"
        f'border:1px solid {THEME["warn_border"]};border-radius:6px;padding:1px 8px">'
        f"{shown_html(text)}</div>"
    )


def effects_html(view: PanelView) -> str:
    """The effects line (counts over every resume) and the last few effects."""
    muted = THEME["muted"]
    counts = (
        f'<span class="kernelext-effect-counts" style="color:{muted}">'
        f"{shown_html(view.effects_text())}</span>"
    )
    if not view.effects:
        return f"<div>{counts}</div>"
    items = "".join(
        f"<li><code>{shown_html(tool)}</code> {EFFECT_ICONS.get(status, '')} "
        f"{shown_html(status)}</li>"
        for tool, status in view.effects
    )
    return (
        f'<div>last effects · {counts}<ul style="margin:0 0 0 1.2em;padding:0">{items}</ul></div>'
    )


def outcome_html(view: PanelView) -> str:
    text = view.outcome_text()
    if text is None:
        return ""
    colour = colour_of(RUN_COLOURS, view.status)
    return f'<div class="kernelext-outcome" style="color:{colour}">{shown_html(text)}</div>'


def to_html(view: PanelView, *, static: bool = True) -> str:
    """The whole panel as HTML: the static fallback (nbconvert, untrusted notebooks)."""
    parts = [header_html(view)]
    if view.known_total and view.batch is None:  # a batch draws its own bar
        pct = 100 * view.completed / view.known_total
        parts.append(
            f'<progress max="{view.known_total}" value="{view.completed}" '
            f'style="width:60%">{pct:.0f}%</progress>'
        )
    parts.append(batch_html(view.batch))
    if not view.final and not view.batching:
        parts.append(f"<div>{shown_html(view.step_text())}</div>")
    parts += [stop_html(view), effects_html(view), outcome_html(view)]
    if static:
        parts.append(
            f'<div style="color:{THEME["muted"]};font-size:11px">static snapshot; '
            "open the notebook with a running kernel for the live panel</div>"
        )
    body = "".join(p for p in parts if p)
    return (
        f'<div class="kernelext-panel kernelext-static" style="border:1px solid {THEME["border"]};'
        f"border-radius:6px;padding:6px 10px;color:{THEME['text']};font-family:{THEME['font']};"
        f'font-size:{THEME["size"]}">{body}</div>'
    )


def to_text(view: PanelView) -> str:
    """The plain-text repr of the panel."""
    lines = [f"run {view.run_id} [{view.agent}]: {view.status}, {view.progress_text()}"]
    if view.batch is not None:
        lines.append("  " + view.batch.text)
    if view.conversation is not None and view.conversation.last:
        lines.append("  last: " + view.conversation.last)
    if not view.final and not view.batching:
        lines.append("  " + view.step_text())
    stop = view.stop_text()
    if stop:
        lines.append("  " + stop)
    if view.effects:
        lines.append("  effects: " + ", ".join(f"{t} {s}" for t, s in view.effects))
    outcome = view.outcome_text()
    if outcome:
        lines.append("  " + outcome)
    return "\n".join(lines)
