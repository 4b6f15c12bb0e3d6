"""The overview of a store's runs: one row a run, as ``kx.runs()`` shows it in a notebook.

:func:`read_overview` reads what each row says, in a few queries whatever the number of
runs: the runs' rows (``Store.overview_runs``: the columns shown, never the arguments),
and only when some run needs them the open approvals and questions (runs suspended for a
person), the unknown effects (runs in ``needs_decision``), the pace of the live runs'
latest steps (``Store.step_pace``) and, for a run whose stop is pending in another
process, its steps (``stop_estimate``). What only this process knows of a run it executes
(the step running now, a ``run.map`` in progress) comes from the run's engine. A live run
whose owner is gone (``lease.owner_gone``) says so, with no time left.

A :class:`RunRow` holds texts, not widgets: the live overview (``widgets/_runs.py``), its
saved HTML copy and the plain text are drawn from the same rows. Every duration and time
reads through ``kernelext._formatting``; the statuses' colours are ``colours.RUN_COLOURS``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..._formatting import counted, duration_text, moment_text
from ..._shown import shows
from ..._store import Store
from ...status import LIVE, Reason, Status
from ..batch.view import batch_counts
from ..engine.stop_estimate import estimate_stop
from ..process.lease import gone_text, owner_gone
from ..process.runtime import runtime
from .control import is_cell_run
from .run import engine_of

__all__ = ["SHOWN", "Overview", "RunRow", "read_overview"]

SHOWN = 50  # rows shown at most (the latest runs); the table itself has them all
TEXT_CUT = 60  # a prompt or an error is cut to this many characters
RESUME_FOR: dict[str, str] = {  # what a run suspended for another reason waits for
    Reason.USER_STOP: "a resume",
    Reason.RATE_LIMIT: "a resume (rate limit)",
    Reason.ERROR: "a resume (an error suspended it)",
    Reason.RESTART: "its first resume (a restart)",
}


@dataclass(frozen=True)
class RunRow:
    """One run as the overview shows it (every text already worded)."""

    run_id: str
    agent: str
    status: str
    reason: str | None
    completed: int
    total: int | None
    progress: str  # "3/12 steps", "5 steps", "batch: 40/100 done, 16 in flight"
    fraction: float | None  # how much is done (0..1) when the total is known
    time_left: str  # "about 2 min left", "35 items/s, about 8 s left", "stops after step 4…"
    waits_for: str  # "an approval of pay · expires in 6 d 23 h", ""
    stop_pending: str  # "stop pending since 2026-12-06 12:00:05 UTC (cli)", ""
    cell: bool  # %%agent notebook cells (a forced stop is the notebook's ■ there)
    here: bool  # executes in this process
    epoch: int | None = None  # the run's owner_epoch as read: a click carries it (a fence)
    gone: str = ""  # "running, but its process is gone (last heard ...): resume it with ..."

    @property
    def live(self) -> bool:
        return self.status in LIVE

    @shows
    def text(self) -> str:
        """One line of plain text."""
        parts = [f"{self.run_id} [{self.agent}] {self.status}", self.progress]
        parts += [t for t in (self.gone, self.stop_pending, self.time_left) if t]
        if self.waits_for:
            parts.append(f"waits for {self.waits_for}")
        return ", ".join(parts)


@dataclass(frozen=True)
class Overview:
    """The rows shown (every run that is live or waits for a person, then the latest
    others, ``SHOWN`` at most, oldest first) and how many were left out."""

    rows: list[RunRow]
    now: dt.datetime  # the store's clock when read (naive UTC)
    status: str | None = None  # the status the overview is limited to
    hidden: int = 0  # older runs not shown
    counts: dict[str, int] = field(default_factory=dict)  # status -> runs, all told

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def summary(self) -> str:
        """``7 runs: 2 running, 1 suspended, 4 completed`` (statuses in lifecycle order)."""
        scope = f" {self.status}" if self.status else ""
        if not self.total:
            return f"no{scope} runs"
        order = [str(s) for s in Status]
        parts = ", ".join(
            f"{n} {status}"
            for status, n in sorted(self.counts.items(), key=lambda kv: order.index(kv[0]))
        )
        head = counted(self.total, f"{scope.strip()} run".strip())
        shown = (
            f" ({len(self.rows)} shown: those live or waiting for you, then the latest)"
            if self.hidden
            else ""
        )
        return f"{head}: {parts}{shown}" if not self.status else f"{head}{shown}"

    @shows
    def text(self) -> str:
        return "\n".join([self.summary(), *(f"  {row.text()}" for row in self.rows)])


def read_overview(
    store: Store,
    status: str | None = None,
    *,
    rows: Sequence[Mapping[str, Any]] | None = None,
    limit: int = SHOWN,
) -> Overview:
    """The overview of ``store``'s runs (of one ``status``). ``rows``: its
    ``overview_runs(status)`` when the caller read them already."""
    found = list(rows) if rows is not None else store.overview_runs(status)
    now = store.now()
    counts: dict[str, int] = {}
    for row in found:
        counts[str(row["status"])] = counts.get(str(row["status"]), 0) + 1
    shown = _shown(found, limit)
    reader = _Reader(store, shown, now)
    return Overview(
        rows=[reader.row(r) for r in shown],
        now=now,
        status=status,
        hidden=len(found) - len(shown),
        counts=counts,
    )


def _needs_someone(run: Mapping[str, Any]) -> bool:
    """Live, or waiting for a person (an approval, an answer, a decision on unknowns)."""
    status = run["status"]
    if status in LIVE or status == Status.NEEDS_DECISION:
        return True
    return status == Status.SUSPENDED and run.get("reason") in (Reason.APPROVAL, Reason.INPUT)


def _shown(found: Sequence[Mapping[str, Any]], limit: int) -> list[Mapping[str, Any]]:
    """At most ``limit`` runs: those that need someone first, then the latest others."""
    if limit <= 0:
        return []
    urgent = {i for i, run in enumerate(found) if _needs_someone(run)}
    urgent = set(sorted(urgent)[-limit:])
    others = [i for i in range(len(found)) if i not in urgent]
    room = limit - len(urgent)
    keep = urgent | set(others[len(others) - room :] if room > 0 else [])
    return [run for i, run in enumerate(found) if i in keep]


class _Reader:
    """Reads, once for every row shown, what more than the runs' rows the overview needs."""

    def __init__(self, store: Store, rows: Sequence[Mapping[str, Any]], now: dt.datetime):
        self.store, self.now = store, now
        waiting = {str(r["reason"]) for r in rows if r["status"] == Status.SUSPENDED}
        self.approvals: dict[str, list[str]] = {}
        if Reason.APPROVAL in waiting:
            for request in store.open_approvals(None, now):
                self.approvals.setdefault(str(request["run_id"]), []).append(str(request["tool"]))
        self.questions: dict[str, list[str]] = {}
        if Reason.INPUT in waiting:
            for question in store.open_questions(None, now):
                prompt = str(question.get("prompt") or "")
                self.questions.setdefault(str(question["run_id"]), []).append(prompt)
        deciding = [str(r["id"]) for r in rows if r["status"] == Status.NEEDS_DECISION]
        self.unknowns = store.unknown_counts(deciding)
        live = [str(r["id"]) for r in rows if r["status"] == Status.RUNNING and r["total_steps"]]
        self.pace = store.step_pace(live)

    def row(self, run: Mapping[str, Any]) -> RunRow:
        run_id, status = str(run["id"]), str(run["status"])
        handle = runtime().live_handle(run_id, self.store) if status in LIVE else None
        engine = engine_of(handle.run) if handle is not None else None
        completed, total = int(run.get("completed_steps") or 0), run.get("total_steps")
        total = int(total) if total and completed <= int(total) else None
        progress = f"{completed}/{total} steps" if total else counted(completed, "step")
        fraction = completed / total if total else None
        time_left = ""
        batch = engine.batch if engine is not None else None
        if batch is not None:  # a run.map in progress here: its counts and pace
            counts = batch_counts(batch, stopping=status == Status.STOPPING)
            name = f"batch {counts.name}" if counts.name else "batch"
            progress = f"{name}: {counts.counts_text()}"  # "batch: 8/20 done, 4 in flight"
            fraction = counts.done / counts.total if counts.total else None
            time_left = counts.drain_text() if counts.stopping else counts.pace_text()
        elif status == Status.STOPPING:
            current = engine.current if engine is not None else None
            estimate = estimate_stop(run_id, self.store, run=run, current=current, now=self.now)
            time_left = estimate.text if estimate is not None else ""
        elif status == Status.RUNNING and total:
            time_left = self._time_left(run_id, total - completed)
        gone = gone_text(run) if handle is None and owner_gone(run, self.now) else ""
        if gone:  # nobody executes it: no estimate of a time left
            time_left = ""
        stop = ""
        if status == Status.STOPPING:
            since = run.get("stop_requested_at")
            when = moment_text(since) if isinstance(since, dt.datetime) else "now"
            stop = f"stop pending since {when} ({run.get('stop_source') or 'api'})"
        return RunRow(
            run_id=run_id,
            agent=str(run["agent"]),
            status=status,
            reason=run.get("reason"),
            completed=completed,
            total=total,
            progress=progress,
            fraction=fraction,
            time_left=time_left,
            waits_for=self._waits_for(run),
            stop_pending=stop,
            cell=is_cell_run(dict(run)),
            here=handle is not None,
            epoch=int(run["owner_epoch"]) if run.get("owner_epoch") is not None else None,
            gone=gone,
        )

    def _time_left(self, run_id: str, remaining: int) -> str:
        """``about 2 min left`` from the pace of the run's latest steps (items at once
        included: the time between their ends, not their durations)."""
        found = self.pace.get(run_id)
        if found is None or remaining <= 0:
            return ""
        n, mean, first, last = found
        each: float | None = mean
        if n >= 2 and isinstance(first, dt.datetime) and isinstance(last, dt.datetime):
            span = (last - first).total_seconds()
            each = span / (n - 1) if span > 0 else mean
        if each is None:
            return ""
        return f"about {duration_text(each * remaining)} left"

    def _waits_for(self, run: Mapping[str, Any]) -> str:
        run_id, status, reason = str(run["id"]), run["status"], run.get("reason")
        if status == Status.SUSPENDED and reason == Reason.APPROVAL:
            tools = list(dict.fromkeys(self.approvals.get(run_id, [])))
            what = f"an approval of {', '.join(tools)}" if tools else "a resume (no open approval)"
        elif status == Status.SUSPENDED and reason == Reason.INPUT:
            prompts = self.questions.get(run_id, [])
            what = f"an answer: {_cut(prompts[0])}" if prompts else "a resume (no open question)"
        elif status == Status.SUSPENDED:
            what = RESUME_FOR.get(str(reason), "a resume")
        elif status == Status.NEEDS_DECISION:
            unknown = self.unknowns.get(run_id, 0)
            what = (
                f"a decision on {counted(unknown, 'unknown effect')}"
                if unknown
                else f"a decision: {_cut(str(reason or 'facts changed'))}"
            )
        elif status == Status.FAILED:
            error = run.get("error") or reason
            return "a resume or a restart" + (f" ({_cut(str(error))})" if error else "")
        else:
            return ""
        return what + self._expiry(run.get("deadline"))

    def _expiry(self, deadline: Any) -> str:
        if not isinstance(deadline, dt.datetime):
            return ""
        left = (deadline - self.now).total_seconds()
        if left <= 0:
            return " · past its deadline: it expires at the next sweep"
        return f" · expires in {duration_text(left)}"


def _cut(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= TEXT_CUT else line[: TEXT_CUT - 1] + "…"
