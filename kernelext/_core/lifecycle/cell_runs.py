"""Runs whose steps are notebook cells (``%%agent RUN_ID``), executed in the caller's thread.

Plain Python, no Jupyter: the IPython layer hands each cell over as a callable. A cell
is one step keyed by its identity (a step name, the notebook's cell id, or a hash of
its source); the hash of the source that completed is kept in the step's ``name``
as ``src:<hash>`` so that a cell edited since it ran is noticed. The boundary before
a cell is a safe point: a pending stop suspends the run there.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..._formatting import duration_text, step_label
from ..._store import Store, actor
from ...errors import NeedsDecision, OwnershipLost, RunStateError, StopRequested
from ...status import LIVE, RESUMABLE, TERMINAL, Status, StepStatus
from ..encoding.names import CELL_AGENT, SOURCE_PREFIX, check_stored_name
from ..encoding.secrets import scrubbed_excerpt
from ..engine.context import reset_current_run, set_current_run
from ..engine.posted_stops import PostedStops
from ..engine.run_engine import RunEngine, StepInfo
from ..engine.snapshot import Snapshotter
from ..process.lease import check_takeover, owner_alive
from ..process.runtime import get_store, runtime
from .handle import Handle
from .resume_steps import before_first_action
from .run import Run
from .takeover import take_over
from .worker import end_open_step, queue_write, suspend_run

__all__ = [
    "INTERRUPTED",
    "LOST",
    "CellRun",
    "StepOutcome",
    "cell_handle",
    "complete_cell_run",
    "forget_cell_runs",
    "open_cell_run",
    "resume_cell_run",
    "stop_cell_run",
]

INTERRUPTED = "interrupted"  # a cell's outcome when a stop or Ctrl-C cut it short
LOST = "ownership_lost"  # a cell's outcome when another process took the run over meanwhile


@dataclass
class StepOutcome:
    """What happened to one cell: ``completed``, ``failed``, ``interrupted``,
    ``suspended`` or ``needs_decision`` (then ``reason`` says why)."""

    kind: str
    key: str
    ordinal: int
    reason: str | None = None


class CellRun:
    """One run made of ``%%agent`` cells, as this process knows it (one per run id)."""

    def __init__(self, run: RunEngine, owned: bool) -> None:
        self.run = run
        self.hashes: dict[str, str] = {}  # step key -> source hash of its last completion
        self.next_ordinal = 0
        self.owned = owned  # created or taken over by this process
        self._posted = PostedStops(run.store, run)  # stops posted beside a busy store

    @property
    def store(self) -> Store:
        return self.run.store

    @property
    def epoch(self) -> int | None:
        """The ownership epoch this process holds for the run (see ``RunEngine.epoch``)."""
        return self.run.epoch

    def lost(self, row: dict[str, Any]) -> bool:
        """This process owned the run, and another took it over since (a higher epoch)."""
        held = self.epoch
        return self.owned and held is not None and row.get("owner_epoch") != held

    @property
    def run_id(self) -> str:
        return self.run.id

    def reload(self) -> None:
        """Refresh state, completed steps and ledger from the store, in place."""
        run, store = self.run, self.store
        snapshot = store.latest_snapshot(run.id)
        run.snapshotter = Snapshotter(run.id, allow_pickle=run.snapshotter.allow_pickle)
        run.state = run.snapshotter.restore(store, snapshot["manifest"]) if snapshot else {}
        run.completed.clear()
        self.hashes.clear()
        for step in store.completed_steps(run.id):
            run.completed[step["key"]] = step["ordinal"]
            name = step.get("name") or ""
            if name.startswith(SOURCE_PREFIX):
                self.hashes[step["key"]] = name[len(SOURCE_PREFIX) :]
        run.effects = store.load_replayable_effects(run.id)
        run.current = None
        run.suspend_request = None  # the last run.suspend / approval / question is over
        run.force.raised = False
        run.stop_source = None
        run.stop_event.clear()
        self._posted = PostedStops(store, run)  # a stop posted before this is not for it
        ordinals = [s["ordinal"] for s in store.steps(run.id)]
        self.next_ordinal = max(ordinals, default=-1) + 1

    # -- the safe point before a cell -------------------------------------------------
    def boundary(self) -> dict[str, Any]:
        """Honour a pending stop, take over a run left by a dead kernel; return the row.

        Raises ``OwnershipLost`` when another process took the run over from this one: its
        cached state is stale, and nothing of this cell runs (``%agent resume`` takes the
        run back)."""
        row = self.honour_stop()
        if row["status"] == Status.RUNNING and not self.owned and row.get("owner") != actor():
            if owner_alive(row.get("owner")) is True:  # a live kernel's cells: never adopted
                check_takeover({**row, "lease_until": None}, self.store.now())  # raises
            taken = take_over(
                self.store, self.run_id, "cell", reason="taken over from a kernel that is gone"
            )
            self.reload()
            if taken.status == Status.RUNNING:  # credentials refreshed, facts re-checked first
                before_first_action(self.run, self.store)
            row = self.store.get_run(self.run_id)
        if row["status"] == Status.RUNNING:
            if not self.owned and row.get("owner") not in (None, actor()):
                # Live in another kernel (its owner is alive): never run a cell of it here.
                raise self.store.ownership_lost(self.run_id, self.epoch, "next cell")
            self.owned = True
        return row

    def honour_stop(self) -> dict[str, Any]:
        """Suspend the run if a stop is pending (this is a safe point); return the row.

        Only the stop: nothing is taken over and no fact is checked. Raises
        ``OwnershipLost`` when another process took the run over from this one. A stop
        posted beside the store while another process kept it busy counts too."""
        posted = self.owned and self._posted.take()
        row = self.store.get_run(self.run_id)
        if self.lost(row):
            self.owned = False
            raise self.store.ownership_lost(self.run_id, self.epoch, "next cell")
        if row["status"] == Status.STOPPING or (posted and row["status"] == Status.RUNNING):
            self.run.stop_source = row.get("stop_source") or self.run.stop_source or "api"
            suspend_run(self.store, self.run, StopRequested(self.run.stop_source))
            self.run.notify("end", Status.SUSPENDED)
            row = self.store.get_run(self.run_id)
        return row

    def lookup(self, key: str, digest: str) -> str:
        """``new``, ``done`` (completed with this source) or ``changed`` (other source)."""
        if key not in self.run.completed:
            return "new"
        return "done" if self.hashes.get(key) in (digest, None) else "changed"

    # -- one cell, one step ---------------------------------------------------------------
    def run_step(
        self,
        key: str,
        digest: str,
        body: Callable[[], BaseException | None],
        max_step_seconds: float | None = None,
    ) -> StepOutcome:
        """Execute ``body`` as one step. ``body`` returns the exception that ended it, if any."""
        run, store = self.run, self.store
        ordinal = self.next_ordinal
        self.next_ordinal += 1
        run.max_step_seconds = max_step_seconds
        info = StepInfo(uuid.uuid4(), key, ordinal, SOURCE_PREFIX + digest)
        store.begin_step(run.id, info.id, ordinal, key, info.name)
        run.current = info
        run.notify("step", info)
        timer = _overrun_timer(self, info, max_step_seconds)
        token = set_current_run(run)
        try:
            error = body()
        finally:
            reset_current_run(token)
            if timer is not None:
                timer.cancel()
        return self._settle(info, digest, error)

    def _settle(self, info: StepInfo, digest: str, error: BaseException | None) -> StepOutcome:
        run, store = self.run, self.store
        if error is None or (isinstance(error, StopRequested) and run.current is None):
            if run.current is not None:
                run.finish_open_step()
            self.hashes[info.key] = digest
            if error is not None:  # run.suspend(...) inside the cell: completed, then suspended
                assert isinstance(error, StopRequested)
                return self._suspended(info, error, Status.SUSPENDED)
            row = store.get_run(run.id)
            if row["status"] == Status.STOPPING:  # the boundary after the cell
                run.stop_source = row.get("stop_source") or run.stop_source or "api"
                return self._suspended(
                    info, StopRequested(row.get("stop_source") or "api"), StepStatus.COMPLETED
                )
            return StepOutcome(StepStatus.COMPLETED, info.key, info.ordinal)
        if isinstance(error, OwnershipLost):  # taken over meanwhile: nothing more is written
            run.current = None
            self.owned = False
            return StepOutcome(LOST, info.key, info.ordinal, str(error))
        if isinstance(error, KeyboardInterrupt):
            run.stop_source = "interrupt"
            run.force.raised = True
            outcome = self._suspended(info, StopRequested("interrupt"), INTERRUPTED)
        elif isinstance(error, StopRequested):
            outcome = self._suspended(info, error, INTERRUPTED)
        elif isinstance(error, NeedsDecision):
            end_open_step(store, run, StepStatus.CANCELLED, str(error))
            store.transition(
                run.id,
                Status.NEEDS_DECISION,
                LIVE,
                kind=Status.NEEDS_DECISION,
                source="ledger",
                reason=str(error),
                epoch=store.held_epoch(run.id),
            )
            run.notify("end", Status.NEEDS_DECISION)
            outcome = StepOutcome(Status.NEEDS_DECISION, info.key, info.ordinal, str(error))
        else:
            text = f"{type(error).__name__}: {error}"
            end_open_step(store, run, StepStatus.FAILED, scrubbed_excerpt(text, 2000))
            run.notify("step_failed", info)
            outcome = StepOutcome(StepStatus.FAILED, info.key, info.ordinal, text)
        self.reload()  # the cell may have half-changed run.state: back to the snapshot
        return outcome

    def _suspended(self, info: StepInfo, stop: StopRequested, kind: str) -> StepOutcome:
        status = suspend_run(self.store, self.run, stop)
        self.run.notify("end", status)
        row = self.store.get_run(self.run.id)
        return StepOutcome(kind, info.key, info.ordinal, row.get("reason"))


def open_cell_run(
    run_id: str, *, store: Store | None = None, max_step_seconds: float | None = None
) -> CellRun:
    """The cell run ``run_id``: cached in this runtime, loaded from the store, or new."""
    check_stored_name(run_id, "run id", hint="Name the cell run like %%agent orders-2026-11.")
    store = get_store(store)
    rt = runtime()
    with rt.cell_runs_lock:
        cached = rt.cell_runs.get((store.location, run_id))
        if isinstance(cached, CellRun) and cached.store is store and not store.closed:
            return cached
        row = store.find_run(run_id)
        if row is None:
            store.create_run(
                run_id, CELL_AGENT, max_step_seconds=max_step_seconds, owner=actor(), source="cell"
            )
            run = RunEngine(store, run_id, CELL_AGENT, max_step_seconds=max_step_seconds)
            Run(run)  # what the cells' code calls run
            cell = CellRun(run, owned=True)
        else:
            if row["agent"] != CELL_AGENT:
                raise RunStateError(
                    f"Run {run_id!r} belongs to agent {row['agent']!r}, not to %%agent cells. "
                    "Give the cells a run id of their own."
                )
            run = RunEngine(
                store,
                run_id,
                CELL_AGENT,
                max_step_seconds=row["max_step_seconds"],
                total_steps=row.get("total_steps"),
                key_scheme=row.get("key_scheme"),
            )
            Run(run)  # what the cells' code calls run
            cell = CellRun(run, owned=row.get("owner") == actor())
            if cell.owned and store.held_epoch(run_id) is None:  # this process's own run
                store.hold_epoch(run_id, int(row.get("owner_epoch") or 0))
            cell.reload()
        rt.cell_runs[(store.location, run_id)] = cell
        return cell


def forget_cell_runs(run_id: str | None = None) -> None:
    """Drop cached cell runs (all, or one id) so the next cell reloads from the store."""
    rt = runtime()
    with rt.cell_runs_lock:
        for key in [k for k in rt.cell_runs if run_id is None or k[1] == run_id]:
            del rt.cell_runs[key]


def cell_handle(run_id: str, *, store: Store | None = None) -> Handle:
    """A handle (no worker thread) on a cell run, for its panel and status."""
    cell = open_cell_run(run_id, store=store)
    return Handle(cell.run, cell.store)


def stop_cell_run(
    run_id: str,
    *,
    source: str = "api",
    store: Store | None = None,
    epoch: int | None = None,
    who: str | None = None,
) -> str:
    """Stop a cell run: the request is recorded; between two cells is a safe point, so a
    run whose cells execute in this process suspends at once.

    Stopping never opens the run: nothing is loaded from the store, taken over or
    re-checked. A run this process does not execute (another kernel's, or one no cell
    ran here) stays ``stopping`` until its kernel reaches the boundary before its next
    cell, or is suspended already."""
    store = get_store(store)
    result = store.request_stop(run_id, source=source, epoch=epoch, who=who)
    cell = _cached_cell_run(store, run_id)
    if cell is None:
        return str(result.after or result.before)
    cell.run.notify("stop", source)
    # Owned here and no cell executing now: this is the safe point.
    if result.after == Status.STOPPING and cell.owned and cell.run.current is None:
        return str(cell.honour_stop()["status"])
    return str(result.after or result.before)


def _cached_cell_run(store: Store, run_id: str) -> CellRun | None:
    """The cell run ``run_id`` as this runtime already holds it (None: not opened here)."""
    rt = runtime()
    with rt.cell_runs_lock:
        cached = rt.cell_runs.get((store.location, run_id))
    if not isinstance(cached, CellRun) or cached.store is not store or store.closed:
        return None
    return cached


def resume_cell_run(
    run_id: str, row: dict[str, Any], store: Store, *, source: str, recheck_facts: bool = True
) -> Handle:
    """Let the cells of a suspended run execute again (completed cells stay skipped).

    Called by ``control.resume`` under the run's resume guard, with the run's row; a run
    this process already runs is not taken over again.
    """
    if row["status"] in LIVE and row.get("owner") == actor():
        raise RunStateError(
            f"Run {run_id!r} is already running in this process: its next %%agent cell "
            "continues it, so there is nothing to resume."
        )
    if row["status"] not in RESUMABLE:
        raise RunStateError(
            f"Run {run_id!r} is {row['status']}; only a suspended, stopped or interrupted run "
            "can be resumed."
            + (
                f" Start a new run from its snapshot with kx.restart({run_id!r})."
                if row["status"] in TERMINAL
                else ""
            )
        )
    taken = take_over(store, run_id, source)
    cell = open_cell_run(run_id, store=store)
    cell.reload()
    cell.owned = True
    if taken.status == Status.RUNNING:  # credentials refreshed, facts re-checked first
        before_first_action(cell.run, store, recheck=recheck_facts)
    cell.run.notify("resumed", None)
    return Handle(cell.run, store)


def complete_cell_run(run_id: str, *, store: Store | None = None, source: str = "api") -> str:
    """Mark a cell run completed (its cells are done); further cells are refused.

    A process that held the run (an ownership epoch) and was taken over since is refused
    (``OwnershipLost``): a stale kernel never changes the new owner's run."""
    store = get_store(store)
    result = store.transition(
        run_id,
        Status.COMPLETED,
        (*LIVE, Status.SUSPENDED),
        kind=Status.COMPLETED,
        source=source,
        epoch=store.held_epoch(run_id),
    )
    if not result.ok:
        raise RunStateError(f"Run {run_id!r} is {result.before}; it cannot be marked completed.")
    cell = open_cell_run(run_id, store=store)
    cell.run.notify("end", Status.COMPLETED)
    return str(result.after)


def _overrun_timer(cell: CellRun, info: StepInfo, limit: float | None) -> threading.Timer | None:
    if not limit:
        return None

    def overran() -> None:
        if cell.run.current is info:
            info.overrun_reported = True
            queue_write(  # a store closed or refusing writes meanwhile: never a dead timer
                cell.store,
                cell.store.record_event,
                cell.run_id,
                "step_overran",
                who="a cell's overrun timer",
                wait=False,
                source="engine",
                reason=(
                    f"cell {step_label(info.ordinal, info.key)} passed max_step_seconds "
                    f"({duration_text(limit)})"
                ),
            )
            cell.run.notify("overran", info)

    timer = threading.Timer(limit, overran)
    timer.name = f"kernelext-cell-overrun[{cell.run_id}]"
    timer.daemon = True
    timer.start()
    return timer
