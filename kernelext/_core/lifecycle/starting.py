"""Starting a new run."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from ..._store import Store, actor
from ...errors import RunStateError
from ..encoding.codec import dumps_json
from ..encoding.names import check_stored_name
from ..engine.run_engine import RunEngine, chain_roots
from ..process.runtime import get_store, runtime
from .handle import Handle
from .run import Run
from .worker import launch

if TYPE_CHECKING:
    from .agent import Agent

__all__ = ["encode_args", "start_run"]


def encode_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    try:
        return dumps_json({"args": list(args), "kwargs": kwargs}).decode()
    except (TypeError, ValueError):
        return None


def start_run(
    agent: Agent,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    run_id: str | None,
    store: Store | None,
) -> Handle:
    store = get_store(store)
    run_id = f"{agent.name}-{uuid.uuid4().hex[:8]}" if run_id is None else run_id
    check_stored_name(run_id, "run id", hint="Pass agent.start(..., run_id='orders-2026-11').")
    created = store.create_run(
        run_id,
        agent.name,
        fingerprint=agent.fingerprint,
        max_step_seconds=agent.max_step_seconds,
        args=encode_args(args, kwargs),
        owner=actor(),
    )
    if not created:
        existing = store.get_run(run_id)
        raise RunStateError(
            f"Run {run_id!r} already exists (status {existing['status']}). Resume it with "
            f"kx.resume({run_id!r}), restart it with kx.restart({run_id!r}), or pick a new run_id."
        )
    # Only a run this call created gets these arguments: a refused start must not swap
    # the arguments a later kx.resume of the existing run uses.
    runtime().args_cache[run_id] = (args, kwargs)
    run = RunEngine(
        store,
        run_id,
        agent.name,
        max_step_seconds=agent.max_step_seconds,
        allow_pickle=agent.pickle,
    )
    Run(run)  # what the agent function receives
    chain_roots[run] = run_id  # a fresh run is the root of its restart chain
    return launch(Handle(run, store, attempt=True), agent.fn, args, kwargs)
