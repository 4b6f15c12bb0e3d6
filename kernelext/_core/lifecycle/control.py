"""One interface to a run, whatever executes it: ``stop``, ``resume``, ``handle_for``.

A run is either an ``@kx.agent`` run (a worker thread executes the agent function) or a
``%%agent`` run (notebook cells are its steps, executed by the kernel). This is the one
place that asks which (``is_cell_run``); ``kx.stop``, ``kx.resume``, the magics, the
panel and the command line call these functions and never branch themselves.
"""

from __future__ import annotations

from typing import Any

from ..._store import Store, actor
from ..._store.records import FORCE_REQUESTED
from ..._validate import (
    FLAG,
    NOTE,
    RUN_ID,
    SOURCE,
    STORE,
    check_args_tuple,
    check_count,
    check_mapping,
    optional,
    validated,
)
from ..._validate import check_plan as plan_type
from ...errors import OwnershipLost, RunStateError
from ...status import LIVE, Reason, Status
from ..encoding.names import CELL_AGENT, check_stored_name
from ..engine.run_engine import RunEngine
from ..people.waiting import install_go_on
from ..plan.resume_plan import ResumePlan, check_plan
from ..process.lease import owner_gone
from ..process.runtime import get_store, runtime
from . import cell_runs
from .handle import Handle, post_stop_if_busy, request_stop
from .resume import check_resumable, resume_agent_run
from .run import Run, engine_of
from .takeover import stop_gone_owner

__all__ = ["force_stop", "handle_for", "is_cell_run", "resume", "stop"]

EPOCH = optional(check_count)  # the owner epoch a panel showed (a fencing token)


def is_cell_run(row: dict[str, Any]) -> bool:
    """Whether the run in ``row`` is made of ``%%agent`` notebook cells."""
    return bool(row["agent"] == CELL_AGENT)


@validated("kx.stop", run_id=RUN_ID, source=SOURCE, store=STORE, epoch=EPOCH, who=NOTE)
def stop(
    run_id: str,
    *,
    source: str = "api",
    store: Store | None = None,
    epoch: int | None = None,
    who: str | None = None,
) -> str:
    """Ask run ``run_id`` to stop at its next safe point; the request is recorded at once.

    A run live in this process is stopped in its own store; any other run is looked up in
    ``store`` (default: the current store), and its owner sees the request at its next
    safe point, whichever process that is. A ``%%agent`` run between two cells is at a safe
    point already: it suspends at once. Returns the run's status after the request.
    ``epoch``: the owner epoch the person saw; a run resumed or taken over since raises
    ``OwnershipLost`` and nothing is recorded (checked in the transaction that writes).
    ``who``: who asked, for the record (default: the user this process runs as).
    """
    live = runtime().live_handle(run_id, store)
    if live is not None:
        held = engine_of(live.run).epoch
        if epoch is not None and held not in (None, epoch):
            raise OwnershipLost(run_id, owner=None, epoch=held, held=epoch, what="stop")
        return request_stop(live.store, run_id, source=source, handle=live, who=who)
    store = get_store(store)
    posted = post_stop_if_busy(store, run_id, source=source, who=who, epoch=epoch)
    if posted is not None:  # another process keeps the store file: recorded beside it
        return posted
    row = store.get_run(run_id)
    if owner_gone(row, store.now()):  # nobody would reach a safe point: stopped here
        stopped = stop_gone_owner(store, run_id, source=source, who=who, epoch=epoch)
        if stopped is not None:
            return stopped
    if is_cell_run(row):
        return cell_runs.stop_cell_run(run_id, source=source, store=store, epoch=epoch, who=who)
    return request_stop(store, run_id, source=source, epoch=epoch, who=who)


@validated(
    "kx.core.control.force_stop", run_id=RUN_ID, source=SOURCE, store=STORE, epoch=EPOCH, who=NOTE
)
def force_stop(
    run_id: str,
    *,
    source: str = "api",
    store: Store | None = None,
    epoch: int | None = None,
    who: str | None = None,
) -> str:
    """Ask run ``run_id`` to stop now: its step is cancelled (see ``Handle.force_stop``).

    A run live in this process is forced here. For any other run the stop is recorded and
    a ``force_requested`` event beside it; the process that executes an agent run reads it
    within a fraction of a second and forces the step there. A ``%%agent`` cell cannot be
    forced from another process: its stop lands when the cell ends (press the notebook's
    interrupt button twice to cancel the cell). Returns the run's status after the request.
    """
    live = runtime().live_handle(run_id, store)
    if live is not None:
        live.force_stop(source=source)
        return str(Status.STOPPING)
    store = get_store(store)
    posted = post_stop_if_busy(store, run_id, source=source, who=who, epoch=epoch, force=True)
    if posted is not None:  # another process keeps the store file: recorded beside it
        return posted
    status = stop(run_id, source=source, store=store, epoch=epoch, who=who)
    if status in LIVE and not is_cell_run(store.get_run(run_id)):
        store.record_event(run_id, FORCE_REQUESTED, source=source, who=who)
    return status


@validated(
    "kx.resume",
    run_id=RUN_ID,
    store=STORE,
    allow_code_change=FLAG,
    args=optional(check_args_tuple),
    kwargs=optional(check_mapping),
    source=SOURCE,
    recheck_facts=FLAG,
    plan=optional(plan_type),
)
def resume(
    run_id: str,
    *,
    store: Store | None = None,
    allow_code_change: bool = False,
    args: tuple[Any, ...] | None = None,
    kwargs: dict[str, Any] | None = None,
    source: str = "api",
    recheck_facts: bool = True,
    plan: ResumePlan | None = None,
) -> Handle:
    """Continue a suspended (or crashed) run from its last completed step.

    Applied effects are replayed from the ledger, not repeated; effects whose outcome is
    unknown stop the resume in ``needs_decision`` (decide with ``kx.reconcile``);
    credentials are refreshed and facts re-checked first (``recheck_facts=False`` right
    after a person decided about them). One resume wins: within this process, checking,
    taking over and launching happen under the run's resume guard (a second thread gets
    ``RunStateError``); across processes the run's lease decides. For an ``%%agent`` run
    the cells run again when the notebook runs them (completed cells are skipped).

    ``plan``: a ``kx.plan(run_id)`` preview; the run resumes as previewed, or, if anything
    in it changed since (another process resumed, a new unknown effect, the code changed),
    ``PlanChanged`` says what and nothing runs.
    """
    check_stored_name(run_id, "run id", hint="Pass the id of a run in the store (see kx.runs()).")
    if plan is not None and plan.run_id != run_id:
        raise ValueError(f"That plan is for run {plan.run_id!r}, not {run_id!r}.")
    store = get_store(store)
    with runtime().resuming(run_id):
        # Everything this process journaled is in the tables before the run is read back;
        # after a write fault that cannot be folded yet, StoreWriteError says so.
        store.flush()
        row = store.get_run(run_id)
        if runtime().live_handle(run_id) is not None:
            raise RunStateError(
                f"Run {run_id!r} is already executing in this process (status "
                f"{row['status']}). Stop it first with its handle's .stop(), or wait for it "
                "with .wait()."
            )
        if plan is not None:
            check_plan(plan, store)
        check_resumable(run_id, row["status"])
        if is_cell_run(row):
            return cell_runs.resume_cell_run(
                run_id, row, store, source=source, recheck_facts=recheck_facts
            )
        return resume_agent_run(
            run_id,
            row,
            store,
            allow_code_change=allow_code_change,
            args=args,
            kwargs=kwargs,
            source=source,
            recheck_facts=recheck_facts,
        )


@validated("kx.core.control.handle_for", run_id=RUN_ID, store=STORE)
def handle_for(run_id: str, *, store: Store | None = None) -> Handle:
    """The handle that shows run ``run_id``: the live one, a cell run's, or a detached one
    (for a run another process executes, or one that ended)."""
    live = runtime().live_handle(run_id, store)
    if isinstance(live, Handle):  # the one kind of handle a runtime holds
        return live
    store = get_store(store)
    row = store.get_run(run_id)
    if is_cell_run(row):
        return cell_runs.cell_handle(run_id, store=store)
    run = RunEngine(
        store,
        run_id,
        row["agent"],
        max_step_seconds=row.get("max_step_seconds"),
        total_steps=row.get("total_steps"),
        key_scheme=row.get("key_scheme"),
    )
    Run(run)  # what its handle shows (h.run)
    return Handle(run, store)


def resume_if_here(store: Store, run_id: str, source: str) -> Any:
    """Resume ``run_id`` when this process runs it and it waits only for a person.

    Returns the new handle, or None when the run is another process's (its next
    ``kx.resume`` goes on), is not suspended for an approval or an answer, or still waits
    for another one.
    """
    row = store.find_run(run_id)
    if row is None or row["status"] != Status.SUSPENDED:
        return None
    if row["reason"] not in (Reason.APPROVAL, Reason.INPUT) or row.get("owner") != actor():
        return None
    now = store.now()
    if store.open_approvals(run_id, now) or store.open_questions(run_id, now):
        return None
    live = runtime().live_handle(run_id)
    if live is not None:  # its worker is still recording the suspension
        live.wait(30)
    return resume(run_id, store=store, source=source)


install_go_on(resume_if_here)  # a person's decision or answer goes on through it
