"""How long a pending stop will take: an estimate from the run's own step durations.

A stop lands at the next safe point, normally the end of the step that is running. How
long that takes is estimated from the durations of the steps this run completed (their
median and 90th percentile) minus what the current step has already run. Past the 90th
percentile the step is *overrunning*; with ``max_step_seconds`` the monitor forces the
stop once the step passes that bound, so the estimate says when that happens.

The arithmetic is in pure functions (:func:`percentile`, :func:`estimate_from`), so it can
be checked without clocks; :func:`estimate_stop` reads the run row and its steps.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from ..._formatting import duration_text, step_label
from ..._shown import shows
from ..._store import Store
from ...status import Status, StepStatus
from ..process.runtime import get_store

__all__ = [
    "CurrentStep",
    "StopEstimate",
    "estimate_from",
    "estimate_stop",
    "percentile",
    "running_step",
    "step_durations",
]


class CurrentStep(Protocol):
    """The step executing in this process (``RunEngine.current``, a ``StepInfo``)."""

    @property
    def key(self) -> str: ...

    @property
    def ordinal(self) -> int: ...

    @property
    def elapsed(self) -> float: ...


@dataclass(frozen=True)
class StopEstimate:
    """When a pending stop is expected to take hold. Seconds are counted from ``now``."""

    run_id: str
    now: dt.datetime  # the store's clock (naive UTC) when estimated
    step_ordinal: int | None  # the step it stops after (None: no step is running)
    step_key: str | None
    elapsed_s: float | None  # what that step has run so far
    samples: int  # completed steps of this run the estimate is made from
    median_s: float | None  # their median duration
    p90_s: float | None  # their 90th percentile
    seconds_left: float | None  # about this long (median), at most the forced bound
    seconds_left_max: float | None  # at most this long going by the 90th percentile
    overrunning_by: float | None  # the step ran this much past the 90th percentile
    max_step_seconds: float | None
    forced_in: float | None  # max_step_seconds forces the stop this much later (0: now)
    forced_at: dt.datetime | None

    @property
    def overrunning(self) -> bool:
        return self.overrunning_by is not None

    @property
    @shows
    def text(self) -> str:
        """One line: ``stops after step 7, in about 3.0 s (up to 5.5 s)``, or
        ``stops after step 7; overrunning by 12 s; max_step_seconds forces it in 18 s``."""
        if self.step_ordinal is None:
            return "stop pending: no step is running, so it stops at the next safe point"
        head = f"stops after {step_label(self.step_ordinal, self.step_key)}"
        if self.overrunning_by is not None:
            assert self.p90_s is not None and self.median_s is not None
            head += (
                f"; overrunning by {duration_text(self.overrunning_by)} (its steps take about"
                f" {duration_text(self.median_s)}, 90% within {duration_text(self.p90_s)})"
            )
        elif self.seconds_left is None:
            ran = duration_text(self.elapsed_s or 0.0)
            head += f"; no completed step to estimate from yet (this one has run {ran})"
        else:
            most = self.seconds_left_max
            if self.seconds_left > 0:
                head += f", in about {duration_text(self.seconds_left)}"
            else:
                head += ", any moment now"
            if most is not None and most - self.seconds_left >= 0.05:
                head += f" (up to {duration_text(most)})"
        return head + self._forced_text()

    def _forced_text(self) -> str:
        bound = self.max_step_seconds
        if bound is None or self.forced_in is None:
            if self.overrunning_by is None:
                return ""
            return "; no max_step_seconds bounds it (Force stop cancels the step now)"
        if self.forced_in <= 0:
            return (
                f"; max_step_seconds ({duration_text(bound)}) has passed: the forced stop"
                " lands when the step returns to Python"
            )
        return f"; max_step_seconds forces it in {duration_text(self.forced_in)}"

    def as_dict(self) -> dict[str, Any]:
        """The fields and ``text``, for JSON output (datetimes stay datetimes)."""
        out = asdict(self)
        out["text"] = self.text
        return out


# -- pure arithmetic -----------------------------------------------------------------------
def percentile(values: Iterable[float], q: float) -> float:
    """The ``q``-quantile (0..1) of ``values`` with linear interpolation between ranks."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be within 0..1, not {q}")
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def estimate_from(
    durations: Sequence[float],
    *,
    run_id: str,
    now: dt.datetime,
    step_ordinal: int | None,
    step_key: str | None,
    elapsed: float | None,
    max_step_seconds: float | None = None,
) -> StopEstimate:
    """The estimate for a step that has run ``elapsed`` seconds, given the durations of
    the run's completed steps. No clock is read: ``now`` only dates ``forced_at``."""
    median = percentile(durations, 0.5) if durations else None
    p90 = percentile(durations, 0.9) if durations else None
    ran = max(elapsed, 0.0) if elapsed is not None else None
    forced_in = forced_at = None
    if max_step_seconds and step_ordinal is not None and ran is not None:
        forced_in = max(max_step_seconds - ran, 0.0)
        forced_at = now + dt.timedelta(seconds=forced_in)
    left = most = over = None
    if median is not None and p90 is not None and ran is not None and step_ordinal is not None:
        left, most = max(median - ran, 0.0), max(p90 - ran, 0.0)
        if forced_in is not None:  # the monitor forces it then, whatever the estimate
            left, most = min(left, forced_in), min(most, forced_in)
        if ran > p90:
            over = ran - p90
    return StopEstimate(
        run_id=run_id,
        now=now,
        step_ordinal=step_ordinal,
        step_key=step_key,
        elapsed_s=ran,
        samples=len(durations),
        median_s=median,
        p90_s=p90,
        seconds_left=left,
        seconds_left_max=most,
        overrunning_by=over,
        max_step_seconds=max_step_seconds or None,
        forced_in=forced_in,
        forced_at=forced_at,
    )


def step_durations(steps: Iterable[Mapping[str, Any]]) -> list[float]:
    """The durations of the completed step attempts among ``steps`` rows."""
    return [
        float(row["duration_s"])
        for row in steps
        if row.get("status") == StepStatus.COMPLETED and row.get("duration_s") is not None
    ]


def running_step(steps: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The step row still ``running`` that started last, if any."""
    running = [row for row in steps if row.get("status") == StepStatus.RUNNING]
    return running[-1] if running else None


# -- reading the store -----------------------------------------------------------------------
def estimate_stop(
    run_id: str,
    store: Store | None = None,
    *,
    run: Mapping[str, Any] | None = None,
    steps: Sequence[Mapping[str, Any]] | None = None,
    current: CurrentStep | None = None,
    now: dt.datetime | None = None,
) -> StopEstimate | None:
    """Estimate when the pending stop of run ``run_id`` takes hold; None if none is pending.

    Reads the run row and its steps unless given (``run``: a ``store.get_run`` row,
    ``steps``: ``store.steps`` rows, e.g. what ``kernelext show`` already read). A run
    executing in this process passes ``current=engine_of(handle.run).current``: its step and elapsed
    time are then exact; otherwise the step still ``running`` in the steps table is used,
    and its elapsed time is counted on the store's clock from its ``started_at``.
    """
    store = get_store(store)
    row = run if run is not None else store.get_run(run_id)
    if row.get("status") != Status.STOPPING:
        return None
    rows = steps if steps is not None else store.steps(run_id)
    moment = now if now is not None else store.now()
    ordinal: int | None = None
    key: str | None = None
    elapsed: float | None = None
    if current is not None:
        ordinal, key, elapsed = current.ordinal, current.key, current.elapsed
    else:
        found = running_step(rows)
        if found is not None:
            ordinal, key = int(found["ordinal"]), str(found["key"])
            elapsed = (moment - found["started_at"]).total_seconds()
    bound = row.get("max_step_seconds")
    return estimate_from(
        step_durations(rows),
        run_id=run_id,
        now=moment,
        step_ordinal=ordinal,
        step_key=key,
        elapsed=elapsed,
        max_step_seconds=float(bound) if bound else None,
    )
