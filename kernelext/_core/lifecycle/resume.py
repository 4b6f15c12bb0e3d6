"""Resuming an agent run: take it over, consult the ledger, prepare, then continue.

``kx.resume`` (``control.resume``) guards the run and dispatches here for ``@kx.agent``
runs (``cell_runs`` for ``%%agent`` runs). In order:

1. ``takeover.take_over``: lease checked, run ``running`` and owned here, steps left
   ``running`` abandoned, ``pending`` effects ``unknown``; any ``unknown`` effect stops
   the resume in ``needs_decision`` before anything runs (``kx.reconcile`` decides).
2. The ledger is loaded: applied effects are replayed, not repeated.
3. ``resume_steps.before_first_action``: credentials refreshed, facts re-checked.
4. The agent function is called again in a worker thread: completed steps are skipped by
   key, and an effect that needs approval runs only with an approval for that exact call.
"""

from __future__ import annotations

from typing import Any

from ..._store import Store
from ...errors import AgentError, CodeChangedError, RunStateError
from ...status import Status
from ..encoding.codec import loads_json
from ..encoding.secrets import MASK
from ..engine.run_engine import RunEngine, chain_roots
from ..plan.code import how_to_define
from ..process.runtime import runtime
from .agent import Agent
from .handle import Handle
from .resume_steps import before_first_action
from .run import Run
from .takeover import take_over
from .worker import launch

__all__ = ["agent_for", "check_resumable", "load_run", "resume_agent_run"]


def resume_agent_run(
    run_id: str,
    row: dict[str, Any],
    store: Store,
    *,
    allow_code_change: bool = False,
    args: tuple[Any, ...] | None = None,
    kwargs: dict[str, Any] | None = None,
    source: str = "api",
    recheck_facts: bool = True,
) -> Handle:
    """Continue agent run ``run_id`` (its row read under the resume guard) from its last
    completed step (see the module docstring)."""
    agent = agent_for(run_id, row, allow_code_change, "resume")
    call_args, call_kwargs = _arguments(run_id, row, args, kwargs)
    # Read before the take-over: a snapshot that cannot be read (IntegrityError) stops the
    # resume before anything changes.
    run = load_run(store, run_id, agent.name, agent.max_step_seconds, agent.pickle)
    taken = take_over(store, run_id, source, fingerprint=agent.fingerprint)
    if not taken.ok:
        check_resumable(run_id, taken.status)
        raise RunStateError(f"Run {run_id!r} could not be resumed: it is {taken.status}.")
    if store.completed_step_count(run_id) != len(run.completed):
        # Another process completed a step between the read and the take-over (its lease
        # had just lapsed): read again, now that no one else can. (A completed step stays
        # completed, so the count tells: the steps read before are among those now.)
        run = load_run(store, run_id, agent.name, agent.max_step_seconds, agent.pickle)
    handle = Handle(run, store, attempt=True)
    if taken.status == Status.NEEDS_DECISION:
        return handle
    run.effects = store.load_replayable_effects(run_id)
    if not before_first_action(run, store, recheck=recheck_facts):
        return handle
    return launch(handle, agent.fn, call_args, call_kwargs)


def agent_for(run_id: str, row: dict[str, Any], allow_code_change: bool, verb: str) -> Agent:
    """The agent that owns ``row``, refusing code that changed since the run ran.

    ``verb`` is the call the user makes again once they fixed it: ``resume`` or ``restart``.
    """
    agent = runtime().agents.get(row["agent"])
    if not isinstance(agent, Agent):  # None: the runtime holds only Agents
        raise AgentError(
            f"Run {run_id!r} belongs to agent {row['agent']!r}, which is not defined in this "
            f"process. {how_to_define(row['agent'])}, then call kx.{verb}({run_id!r}) again."
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
) -> RunEngine:
    """A run (its engine) with state and completed steps restored from the store."""
    row = store.get_run(run_id)
    run = RunEngine(
        store,
        run_id,
        agent,
        max_step_seconds=max_step_seconds,
        allow_pickle=allow_pickle,
        total_steps=row.get("total_steps"),
        key_scheme=row.get("key_scheme"),
    )
    Run(run)  # what the agent function receives
    # Read here, where the store is read anyway, not at a call: a read there would wait for
    # the store file another process may hold (the hot path never waits for it).
    chain_roots[run] = store.chain_root(run_id) if row.get("parent_id") else run_id
    snapshot = store.latest_snapshot(run_id, before_ordinal)
    if snapshot is not None:
        run.state = run.snapshotter.restore(store, snapshot["manifest"])
    for key, ordinal in store.completed_step_ordinals(run_id).items():
        if before_ordinal is None or ordinal < before_ordinal:
            run.completed[key] = ordinal
    return run  # the ledger is loaded once the run is taken over (pending -> unknown)


def check_resumable(run_id: str, status: str) -> None:
    """Refuse a run that can never continue, saying what to do instead."""
    if status == Status.COMPLETED:
        raise RunStateError(
            f"Run {run_id!r} already completed; there is nothing to resume. Start a new run "
            f"with the agent's .start(...) and a new run_id (or kx.restart({run_id!r}) to run "
            "it again)."
        )
    if status == Status.CANCELLED:
        raise RunStateError(
            f"Run {run_id!r} was cancelled. To run it again from a snapshot, use "
            f"kx.restart({run_id!r})."
        )
    if status == Status.EXPIRED:
        raise RunStateError(
            f"Run {run_id!r} expired while suspended; it cannot be resumed. Its snapshot is "
            f"kept: start a new run from it deliberately with kx.restart({run_id!r})."
        )


def _arguments(
    run_id: str, row: dict[str, Any], args: tuple[Any, ...] | None, kwargs: dict[str, Any] | None
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if args is not None or kwargs is not None:
        return tuple(args or ()), dict(kwargs or {})
    args_cache = runtime().args_cache
    stored = row.get("args")
    if stored and MASK in stored and run_id in args_cache:  # secrets were taken out of them
        return args_cache[run_id]
    if stored:
        if MASK in stored:
            raise AgentError(
                f"Run {run_id!r} was started with arguments that held a secret, and secrets "
                f"are never stored. Pass them again: kx.resume({run_id!r}, args=(...), "
                "kwargs={...}), or give the agent the secret through run.credential(...)."
            )
        decoded = loads_json(row["args"])
        return tuple(decoded["args"]), dict(decoded["kwargs"])
    if run_id in args_cache:
        return args_cache[run_id]
    raise AgentError(
        f"Run {run_id!r} was started with arguments that are not JSON, so they were not stored. "
        f"Pass them again: kx.resume({run_id!r}, args=(...), kwargs={{...}})."
    )
