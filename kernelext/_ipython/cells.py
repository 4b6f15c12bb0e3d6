"""``%%agent RUN_ID``: one notebook cell is one step of a run.

The boundary before a cell is a safe point. A cell that cannot run (the run is
suspended, needs a decision, or the cell changed since it completed) raises
:class:`AgentCellStopped`, which IPython shows as one line instead of a traceback
(``_render_traceback_``) and which makes the execute reply an error, so Run All in
JupyterLab and nbclient stops there instead of charging on.
"""

from __future__ import annotations

from typing import Any

from .._core.encoding.names import source_hash
from .._core.lifecycle.cell_runs import (
    INTERRUPTED,
    LOST,
    CellRun,
    StepOutcome,
    open_cell_run,
)
from .._core.people.waiting import waiting_text
from .._core.plan.code import remember_cell_source
from .._formatting import name_cell, reason_text, step_label, step_numbers
from ..errors import AgentCellStopped, NeedsDecision, OwnershipLost, StopRequested
from ..status import Status, StepStatus
from .interrupt import CellInterrupt, cell_interrupts

__all__ = ["AgentCellStopped", "cell_identity", "run_agent_cell"]

STATUS_ADVICE: dict[str, str] = {
    Status.SUSPENDED: "resume it with %agent resume {id}, then run this cell again",
    Status.NEEDS_DECISION: (
        "decide it in its panel (%agent status {id}), or with kx.reconcile({id!r}) for "
        "unknown effects or kx.revalidation({id!r}) for facts that changed"
    ),
    Status.EXPIRED: (
        "it cannot be resumed; start a new run from its snapshot with kx.restart({id!r})"
    ),
    Status.CANCELLED: "it was cancelled; start a new run from its snapshot with kx.restart({id!r})",
    Status.COMPLETED: "it is completed; give further cells a new run id",
    Status.FAILED: "resume it with %agent resume {id}",
}


def cell_identity(shell: Any, source: str, step: str | None) -> str:
    """The step key of a cell: ``--step NAME``, else the notebook's cell id, else its source.

    JupyterLab and Notebook 7 send the cell's id in the execute request's metadata
    (``cellId``); nbclient and the terminal do not, so there the key is a hash of the
    source and an edited cell counts as a new step.
    """
    if step:
        return step
    kernel = getattr(shell, "kernel", None)
    get_parent = getattr(kernel, "get_parent", None)
    if callable(get_parent):
        try:
            parent = get_parent() or {}
        except Exception:  # no parent message: not serving a request
            parent = {}
        cell_id = (parent.get("metadata") or {}).get("cellId")
        if cell_id:
            return f"cell:{cell_id}"
    return f"src:{source_hash(source)}"


def run_agent_cell(
    shell: Any,
    run_id: str,
    source: str,
    *,
    step: str | None,
    max_step_seconds: float | None,
    rerun: bool,
) -> None:
    """Execute ``source`` as one step of run ``run_id`` (its last value is displayed).

    The notebook's ■ is the cell's for all of it (``cell_interrupts``): a first press
    anywhere is a soft stop; a second one cancels the cell's own code only."""
    with cell_interrupts(run_id) as presses:
        _run_agent_cell(shell, run_id, source, step, max_step_seconds, rerun, presses)


def _run_agent_cell(
    shell: Any,
    run_id: str,
    source: str,
    step: str | None,
    max_step_seconds: float | None,
    rerun: bool,
    presses: CellInterrupt,
) -> None:
    cell = open_cell_run(run_id, max_step_seconds=max_step_seconds)
    try:
        row = cell.boundary()
    except OwnershipLost as lost:  # another kernel owns the run: nothing of this cell runs
        raise AgentCellStopped(str(lost), run_id=run_id, status=Status.RUNNING) from None
    key = cell_identity(shell, source, step)
    remember_cell_source(run_id, key, source)  # kx.plan shows a diff once the cell changes
    name_cell(key, source)  # the panel and messages name the cell by its first line
    digest = source_hash(source)
    seen = cell.lookup(key, digest)
    ordinal = cell.run.completed.get(key)
    if seen == "done" and not rerun:
        print(
            f"kernelext: skipped — this cell already completed as {_step(cell, ordinal)} of run "
            f"{run_id!r} (status {row['status']}). Pass --rerun to run it again."
        )
        return
    if seen == "changed" and not rerun:
        raise AgentCellStopped(
            f"this cell changed since it completed as {_step(cell, ordinal)} of run {run_id!r}; "
            "it was not run. Restore its source, or run the new source with %%agent "
            f"{run_id} --rerun (recorded effects with the same arguments are not repeated).",
            run_id=run_id,
            status=row["status"],
        )
    if row["status"] != Status.RUNNING:
        raise _blocked(cell, row)
    try:
        outcome = _execute(shell, cell, key, digest, source, max_step_seconds, presses)
    except OwnershipLost as lost:  # its step start was refused: the cell did not run
        cell.owned = False
        raise AgentCellStopped(str(lost), run_id=run_id, status=Status.RUNNING) from None
    message = _report(cell, outcome)
    if message is not None:
        raise AgentCellStopped(message, run_id=run_id, status=cell.store.get_run(run_id)["status"])


def _step(cell: CellRun, ordinal: int | None) -> str:
    """``step 2``: a cell's step as a person counts it, by cell, not by attempt (a cell run
    again after it failed keeps its number)."""
    if ordinal is not None:
        ordinal = step_numbers(cell.store.steps(cell.run_id)).get(ordinal, ordinal)
    return step_label(ordinal)


def _blocked(cell: CellRun, row: dict[str, Any]) -> AgentCellStopped:
    status = row["status"]
    advice = STATUS_ADVICE.get(status, "see kx.runs()").format(id=cell.run_id)
    why = f": {reason_text(row['reason'], row.get('stop_source'))}" if row.get("reason") else ""
    return AgentCellStopped(
        f"run {cell.run_id!r} is {status}{why}; this cell was not run — {advice}.",
        run_id=cell.run_id,
        status=status,
    )


def _report(cell: CellRun, outcome: StepOutcome) -> str | None:
    rid = cell.run_id
    if outcome.kind == StepStatus.COMPLETED:
        status = cell.store.get_run(rid)["status"]
        if status == Status.SUSPENDED:
            print(
                f"kernelext: {_step(cell, outcome.ordinal)} completed; run {rid!r} is now "
                f"suspended (stop requested). Resume with %agent resume {rid}."
            )
        return None
    if outcome.kind == Status.SUSPENDED:
        return (
            f"{_step(cell, outcome.ordinal)} completed and run {rid!r} suspended itself "
            f"({outcome.reason}). Resume with %agent resume {rid}."
        )
    waiting = waiting_text(rid, outcome.reason)  # waits for an approval or an answer
    if outcome.kind == INTERRUPTED and waiting is not None:
        return waiting
    if outcome.kind == INTERRUPTED:
        return (
            f"interrupted: {_step(cell, outcome.ordinal)} of run {rid!r} was cancelled and the "
            f"run is suspended. Effects in flight are marked unknown. Resume with "
            f"%agent resume {rid}, then run this cell again."
        )
    if outcome.kind == LOST:
        return outcome.reason
    if outcome.kind == Status.NEEDS_DECISION:
        return (
            f"run {rid!r} needs a decision: {outcome.reason} Settle it with "
            f"kx.reconcile({rid!r}), then %agent resume {rid}."
        )
    return (
        f"{_step(cell, outcome.ordinal)} of run {rid!r} failed ({outcome.reason}); the run goes "
        "on from the last completed cell. Fix the cell and run it again: effects it already "
        "applied with the same arguments are not repeated."
    )


def _execute(
    shell: Any,
    cell: CellRun,
    key: str,
    digest: str,
    source: str,
    max_step_seconds: float | None,
    presses: CellInterrupt,
) -> StepOutcome:
    """Run the cell body through IPython (transforms, magics, display of the last value)."""
    missing = object()
    previous = shell.user_ns.get("run", missing)
    saved_exc = (shell.custom_exceptions, shell.CustomTB)

    def quiet(
        shell_: Any, etype: type, value: BaseException, tb: Any, tb_offset: int | None = None
    ) -> list[str]:
        return []  # reported as one line by AgentCellStopped afterwards

    def body() -> BaseException | None:
        shell.user_ns["run"] = cell.run.facade  # what the cell's code calls run
        shell.set_custom_exc((StopRequested, NeedsDecision, KeyboardInterrupt), quiet)
        try:
            with presses.body():  # ■ twice cancels the cell's code, never kernelext's records
                result = shell.run_cell(source, store_history=False)
        finally:
            shell.custom_exceptions, shell.CustomTB = saved_exc
            if previous is missing:
                shell.user_ns.pop("run", None)
            else:
                shell.user_ns["run"] = previous
        error = result.error_before_exec or result.error_in_exec
        return error if isinstance(error, BaseException) else None

    return cell.run_step(key, digest, body, max_step_seconds)
