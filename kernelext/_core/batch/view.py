"""How a batch (``run.map``) reads: its counts, its progress line, its drain after a stop,
and what the store says of it to another process.

- In the process that runs it, :func:`batch_counts` reads a ``Batch`` in progress
  (``engine.batch``) into :class:`BatchCounts`; ``h.status_text`` and the panel show its
  :attr:`~BatchCounts.text`: ``batch: 120/400 done, 16 in flight, 2 failed, 3 waiting for
  a person, 35 items/s, about 8 s left``, and after a stop ``stopping: 12 items in flight,
  about 3 s (120/400 done, 2 failed)``.
- From the store (``kernelext show``, ``kx.plan`` in any process), :func:`stored_batch`
  finds the last ``run.map`` of a run: its size and name from the ``batch_started`` event
  ``run.map`` records when it starts, the items done from the step rows that hold a stored
  value, and the items not completed from their latest step attempts (in flight, cancelled
  by a stop, failed, waiting for a person, abandoned by a process that ended).

Every number and duration reads through ``kernelext._formatting``.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..._formatting import counted, duration_text, rate_text
from ..._shown import shows
from ...status import StepStatus
from ..engine.stop_estimate import percentile

if TYPE_CHECKING:
    from ..engine.step_info import RunningBatch

__all__ = [
    "BATCH_STARTED",
    "WAITS_FOR_A_PERSON",
    "BatchCounts",
    "StoredBatch",
    "batch_counts",
    "drain_line",
    "stored_batch",
]

BATCH_STARTED = "batch_started"  # the event run.map records: its name, items, items done
WAITS_FOR_A_PERSON = "waits for a person"  # the error of an item step ended to wait
SESSION_STARTS = frozenset({"created", "resumed"})  # events after which the agent runs anew
TYPICAL_OF = 64  # the latest completed items the typical item duration is taken from


def _label(name: str | None) -> str:
    return f"batch {name}" if name else "batch"


def drain_line(in_flight: int, drain_s: float | None) -> str:
    """``stopping: 12 items in flight, about 3 s`` (``drain_s``: when the longest of them
    should end; None: not known yet)."""
    text = f"stopping: {counted(in_flight, 'item')} in flight"
    if drain_s is None or not in_flight:
        return text
    return text + (", any moment now" if drain_s < 0.05 else f", about {duration_text(drain_s)}")


@dataclass(frozen=True)
class BatchCounts:
    """A batch's counts at one moment, as the panel and ``h.status_text`` show them."""

    name: str | None
    total: int
    done: int
    in_flight: int
    failed: int
    waiting: int  # items that ended to wait for a person (an approval, a question)
    per_second: float | None  # items completed per second since the batch started here
    seconds_left: float | None  # the items still to run, at that pace
    drain_s: float | None  # after a stop: when the longest item in flight should end
    stopping: bool = False  # a stop (or a wait for a person) is draining the batch
    ended: bool = False  # run.map has returned or raised: the counts are its last ones
    reading: bool = False  # an iterator's items: more than ``total`` may come

    @property
    def queued(self) -> int:
        """Items not started yet."""
        return max(self.total - self.done - self.failed - self.waiting - self.in_flight, 0)

    def counts_text(self, *, in_flight: bool = True) -> str:
        """``120/400 done, 16 in flight, 2 failed, 3 waiting for a person`` (zeros left out)."""
        parts = [f"{self.done}/{self.total}{'+' if self.reading else ''} done"]
        if in_flight and self.in_flight:
            parts.append(f"{self.in_flight} in flight")
        if self.failed:
            parts.append(f"{self.failed} failed")
        if self.waiting:
            parts.append(f"{self.waiting} waiting for a person")
        return ", ".join(parts)

    def pace_text(self) -> str:
        """``35 items/s, about 8 s left`` (empty until an item completed here)."""
        if self.per_second is None:
            return ""
        text = rate_text(self.per_second)
        if self.seconds_left is not None and not self.ended and not self.stopping:
            text += f", about {duration_text(self.seconds_left)} left"
        return text

    def drain_text(self) -> str:
        """``stopping: 12 items in flight, about 3 s``."""
        return drain_line(self.in_flight, self.drain_s)

    def progress_text(self, *, in_flight: bool = True) -> str:
        """``batch enrich: 120/400 done, 16 in flight, 35 items/s, about 8 s left``."""
        pace = self.pace_text()
        counts = self.counts_text(in_flight=in_flight)
        return f"{_label(self.name)}: {counts}" + (f", {pace}" if pace else "")

    @property
    @shows
    def text(self) -> str:
        """The one line: progress while it runs, the drain after a stop."""
        if self.stopping and not self.ended:
            return f"{self.drain_text()} ({self.counts_text(in_flight=False)})"
        return self.progress_text()


def batch_counts(
    batch: RunningBatch, *, stopping: bool = False, ended: bool = False
) -> BatchCounts:
    """The counts of ``batch`` now (any thread; takes the batch's lock once)."""
    snap = batch.snapshot()
    done, total, elapsed = int(snap["done"]), int(snap["total"]), float(snap["elapsed"])
    here = done - int(getattr(batch, "done_before", 0))
    rate = here / elapsed if here > 0 and elapsed > 0 else None
    failed = int(batch.failed)  # an int, read whole (the snapshot's counts are too)
    rest = max(total - done - failed - int(snap["waiting"]), 0)
    return BatchCounts(
        name=batch.name,
        total=total,
        done=done,
        in_flight=int(snap["in_flight"]),
        failed=failed,
        waiting=int(snap["waiting"]),
        per_second=rate,
        seconds_left=rest / rate if rate and not snap.get("reading") else None,  # (unknown size)
        drain_s=snap["drain_s"],
        stopping=stopping,
        ended=ended,
        reading=bool(snap.get("reading")),
    )


# -- from the store ---------------------------------------------------------------------------
@dataclass(frozen=True)
class StoredBatch:
    """The last ``run.map`` of a run as the store has it. Keys are listed in the order
    their items started; ``total`` is None for a batch recorded without its event."""

    name: str | None
    total: int | None
    done: int
    running: tuple[str, ...] = ()  # their step is running now
    stopped: tuple[str, ...] = ()  # in flight when the run stopped (cancelled)
    failed: tuple[str, ...] = ()
    waiting: tuple[str, ...] = ()  # ended to wait for a person
    abandoned: tuple[str, ...] = ()  # running when their process ended
    drain_s: float | None = None  # when the longest running item should end
    typical_s: float | None = field(default=None, compare=False)  # a typical item's time

    @property
    def label(self) -> str:
        return f"run.map {self.name!r}" if self.name else "run.map"

    @property
    def not_completed(self) -> int | None:
        """Items a resume runs (None: the batch's size is not known)."""
        return None if self.total is None else max(self.total - self.done, 0)

    def counts(self, *, stopping: bool = False) -> BatchCounts:
        """The batch's counts as the panel words them (its pace is known only where it runs)."""
        total = self.total if self.total is not None else self.done + len(self.running)
        return BatchCounts(
            name=self.name,
            total=total,
            done=self.done,
            in_flight=len(self.running),
            failed=len(self.failed),
            waiting=len(self.waiting),
            per_second=None,
            seconds_left=None,
            drain_s=self.drain_s,
            stopping=stopping,
        )


def _detail(event: Mapping[str, Any]) -> dict[str, Any]:
    try:
        found = json.loads(event.get("detail") or "{}")
    except (TypeError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _last_session_batches(events: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The ``batch_started`` details of the last session (since a start or resume) that
    reached a ``run.map``: a session runs the agent from the top, so it calls every
    ``run.map`` up to the one it stopped in (completed ones return their stored values)."""
    sessions: list[list[dict[str, Any]]] = [[]]
    for event in events:
        if event.get("kind") in SESSION_STARTS:
            sessions.append([])
        elif event.get("kind") == BATCH_STARTED:
            sessions[-1].append(_detail(event))
    return next((found for found in reversed(sessions) if found), [])


def stored_batch(
    steps: Sequence[Mapping[str, Any]],
    events: Sequence[Mapping[str, Any]],
    now: dt.datetime | None = None,
) -> StoredBatch | None:
    """The last ``run.map`` of a run from its ``steps`` and ``events`` rows (None: the run
    has no batch). ``now`` (the store's clock) times the items still running."""
    batches = _last_session_batches(events)
    done_keys = {
        str(row["key"])
        for row in steps
        if row.get("status") == StepStatus.COMPLETED and row.get("result") is not None
    }
    if not batches and not done_keys:
        return None
    last = batches[-1] if batches else {}
    name = last.get("name")
    total: int | None = None
    done = len(done_keys)
    if batches:
        total = int(last.get("items") or 0)
        earlier = sum(int(b.get("items") or 0) for b in batches[:-1])
        done = min(max(done - earlier, 0), total)
    completed = {str(row["key"]) for row in steps if row.get("status") == StepStatus.COMPLETED}
    latest: dict[str, Mapping[str, Any]] = {}
    for row in sorted(steps, key=lambda r: (r["started_at"], r["ordinal"])):
        key = str(row["key"])
        if key not in completed and row.get("name") == name:
            latest[key] = row
    if total is not None and done >= total:
        latest = {}  # every item done: steps not completed after it are not its items
    kinds: dict[str, list[str]] = {k: [] for k in ("run", "stop", "fail", "wait", "gone")}
    ages: list[float] = []
    for key, row in latest.items():
        status = row.get("status")
        if status == StepStatus.RUNNING:
            kinds["run"].append(key)
            if now is not None:
                ages.append(max((now - row["started_at"]).total_seconds(), 0.0))
        elif status == StepStatus.FAILED:
            kinds["fail"].append(key)
        elif status == StepStatus.ABANDONED:
            kinds["gone"].append(key)
        elif status == StepStatus.CANCELLED:
            waits = row.get("error") == WAITS_FOR_A_PERSON
            kinds["wait" if waits else "stop"].append(key)
    durations = [
        float(row["duration_s"])
        for row in steps
        if str(row["key"]) in done_keys and row.get("duration_s") is not None
    ][-TYPICAL_OF:]
    typical = percentile(durations, 0.5) if durations else None
    drain = max(typical - age for age in ages) if ages and typical is not None else None
    return StoredBatch(
        name=name,
        total=total,
        done=done,
        running=tuple(kinds["run"]),
        stopped=tuple(kinds["stop"]),
        failed=tuple(kinds["fail"]),
        waiting=tuple(kinds["wait"]),
        abandoned=tuple(kinds["gone"]),
        drain_s=None if drain is None else max(drain, 0.0),
        typical_s=typical,
    )
