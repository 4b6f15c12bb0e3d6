"""Resuming a run: take it over, consult the ledger, revalidate, then continue."""

from __future__ import annotations

from typing import Any

from ..errors import AgentError, CodeChangedError, NeedsDecision, RunStateError
from ..store import Store, actor
from .codec import loads_json
from .engine import Agent, Handle, launch
from .lease import check_takeover, lease_until
from .registry import AGENTS, RESUME_HOOKS, live_handle, resuming
from .run import Run
from .settings import SETTINGS, get_store
from .starting import ARGS_CACHE

__all__ = ["RESUMABLE", "load_run", "resume"]

RESUMABLE = ("suspended", "needs_decision", "failed", "running", "stopping")


def resume(
    run_id: str,
    *,
    store: Store | None = None,
    allow_code_change: bool = False,
    args: tuple[Any, ...] | None = None,
    kwargs: dict[str, Any] | None = None,
    source: str = "api",
) -> Handle:
    """Continue a suspended (or crashed) run from its last completed step.

    One resume wins: within this process, checking, taking over and launching the run
    happen under the run's resume guard (a second thread gets ``RunStateError``);
    across processes the run's lease decides.
    """
    store = get_store(store)
    with resuming(run_id):
        return _resume(run_id, store, allow_code_change, args, kwargs, source)


def _resume(
    run_id: str,
    store: Store,
    allow_code_change: bool,
    args: tuple[Any, ...] | None,
    kwargs: dict[str, Any] | None,
    source: str,
) -> Handle:
    # Everything this process journaled is in the tables before the run is read back;
    # after a write fault that cannot be folded yet, StoreWriteError says so and nothing runs.
    store.flush()
    row = store.get_run(run_id)
    live = live_handle(run_id)
    if live is not None:
        raise RunStateError(
            f"Run {run_id!r} is already executing in this process (status {row['status']}). "
            "Stop it first with its handle's .stop(), or wait for it with .wait()."
        )
    _check_status(run_id, row["status"])
    if row["agent"] == "%%agent":  # a run made of %%agent notebook cells
        from .cell_runs import resume_cell_run

        return resume_cell_run(run_id, store=store, source=source)
    agent = agent_for(run_id, row, allow_code_change, "resume")
    call_args, call_kwargs = _arguments(run_id, row, args, kwargs)
    run = load_run(store, run_id, agent.name, agent.max_step_seconds, agent.pickle)
    handle = Handle(run, store)

    def take_over(tx: Any) -> tuple[str, list[Any]]:
        current = store.lease_tx(tx, run_id)
        if current is not None:
            check_takeover(current, store.now())
        result = store.transition_tx(
            tx,
            run_id,
            "running",
            RESUMABLE,
            kind="resumed",
            source=source,
            who=actor(),
            fields={
                "deadline": None,
                "stop_requested_at": None,
                "stop_source": None,
                "owner": actor(),
                "lease_until": lease_until(store.now()),
                "fingerprint": agent.fingerprint,
            },
        )
        if not result.ok:
            return str(result.before), []
        store.abandon_running_steps(tx, run_id)
        fresh = store.mark_pending_unknown(tx, run_id)
        open_rows = store.unknown_keys_tx(tx, run_id)
        if open_rows:
            store.transition_tx(
                tx,
                run_id,
                "needs_decision",
                ("running",),
                kind="needs_decision",
                source="ledger",
                reason=f"{len(open_rows)} effect(s) with unknown outcome",
                detail={"new_unknowns": len(fresh)},
                fields=SETTINGS.waiting_fields(store),
            )
            return "needs_decision", list(open_rows)
        return "running", []

    status, _unknown = store.write(take_over)
    if status not in ("running", "needs_decision"):
        _check_status(run_id, status)
        raise RunStateError(f"Run {run_id!r} could not be resumed: it is {status}.")
    if status == "needs_decision":
        return handle
    run.effects = store.load_replayable_effects(run_id)
    if not run_resume_hooks(run, store):
        return handle
    return launch(handle, agent.fn, call_args, call_kwargs)


def run_resume_hooks(run: Run, store: Store) -> bool:
    """Before the first action of a resumed run: refresh credentials, re-check facts.

    Returns False when the run now waits in ``needs_decision``. A hook that fails
    suspends the run again (reason ``error``, with that policy's deadline) and its
    error propagates: a resume never half-happens.
    """
    try:
        for hook in list(RESUME_HOOKS):
            hook(run, store)
    except NeedsDecision as decision:
        store.transition(
            run.id,
            "needs_decision",
            ("running",),
            kind="needs_decision",
            source="revalidation",
            reason=str(decision),
            fields=SETTINGS.waiting_fields(store),
        )
        return False
    except BaseException as exc:
        deadline = SETTINGS.expiry.deadline("error", store.now())
        store.transition(
            run.id,
            "suspended",
            ("running",),
            kind="resume_failed",
            source="revalidation",
            reason=f"resume stopped: {exc}",
            detail={"deadline": deadline.isoformat()},
            fields={"deadline": deadline, "reason": "error"},
        )
        raise
    return True


def agent_for(run_id: str, row: dict[str, Any], allow_code_change: bool, verb: str) -> Agent:
    """The agent that owns ``row``, refusing code that changed since the run ran.

    ``verb`` is the call the user makes again once they fixed it: ``resume`` or ``restart``.
    """
    agent = AGENTS.get(row["agent"])
    if agent is None:
        raise AgentError(
            f"Run {run_id!r} belongs to agent {row['agent']!r}, which is not defined in this "
            f"process. Run the code (or notebook cell) that defines @kx.agent(name="
            f"{row['agent']!r}) and call kx.{verb}({run_id!r}) again."
        )
    if row["fingerprint"] and row["fingerprint"] != agent.fingerprint and not allow_code_change:
        raise CodeChangedError(
            f"The code of agent {agent.name!r} changed since run {run_id!r} ran "
            f"(fingerprint {row['fingerprint']} -> {agent.fingerprint}). Completed steps are "
            "kept as they are, computed by the old code. If the change is safe, call "
            f"kx.{verb}({run_id!r}, allow_code_change=True)."
        )
    return agent


def load_run(
    store: Store,
    run_id: str,
    agent: str,
    max_step_seconds: float | None,
    allow_pickle: bool,
    before_ordinal: int | None = None,
) -> Run:
    """A Run object with state and completed steps restored from the store."""
    row = store.get_run(run_id)
    run = Run(
        store,
        run_id,
        agent,
        max_step_seconds=max_step_seconds,
        allow_pickle=allow_pickle,
        total_steps=row.get("total_steps"),
    )
    snapshot = store.latest_snapshot(run_id, before_ordinal)
    if snapshot is not None:
        run.state = run.snapshotter.restore(store, snapshot["manifest"])
    for step in store.completed_steps(run_id):
        if before_ordinal is None or step["ordinal"] < before_ordinal:
            run.completed[step["key"]] = step["ordinal"]
    return run  # the ledger is loaded once the run is taken over (pending -> unknown)


def _check_status(run_id: str, status: str) -> None:
    if status == "completed":
        raise RunStateError(f"Run {run_id!r} already completed; there is nothing to resume.")
    if status == "cancelled":
        raise RunStateError(
            f"Run {run_id!r} was cancelled. To run it again from a snapshot, use "
            f"kx.restart({run_id!r})."
        )
    if status == "expired":
        raise RunStateError(
            f"Run {run_id!r} expired while suspended; it cannot be resumed. Its snapshot is "
            f"kept: start a new run from it deliberately with kx.restart({run_id!r})."
        )


def _arguments(
    run_id: str, row: dict[str, Any], args: tuple[Any, ...] | None, kwargs: dict[str, Any] | None
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if args is not None or kwargs is not None:
        return tuple(args or ()), dict(kwargs or {})
    if row.get("args"):
        decoded = loads_json(row["args"])
        return tuple(decoded["args"]), dict(decoded["kwargs"])
    if run_id in ARGS_CACHE:
        return ARGS_CACHE[run_id]
    raise AgentError(
        f"Run {run_id!r} was started with arguments that are not JSON, so they were not stored. "
        f"Pass them again: kx.resume({run_id!r}, args=(...), kwargs={{...}})."
    )
