"""The options a framework's run was started with in this process (never stored).

``kx.openai_agents.start`` and ``kx.pydantic_ai.start`` keep each run's options (its context,
deps, model, ...) by run id for the run's thread to read as it starts, and for a resume in
this process. Two starts of one run id at once: the store lets one of them claim the run,
and the run reads that call's options, never the other's. Each start sets its options,
starts, and on a refusal puts back what was there, all under one lock; the run's thread
reads them under that lock, so it reads them once the start that claimed it is settled.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["RunOptions"]

T = TypeVar("T")
H = TypeVar("H")


class RunOptions(Generic[T]):
    """Run id -> (agent name, the options its start was given)."""

    def __init__(self) -> None:
        self._runs: dict[str, tuple[str, T]] = {}
        self._lock = threading.RLock()  # reentrant: a run started in the caller's thread

    def start(self, run_id: str, agent: str, options: T, begin: Callable[[], H]) -> H:
        """``begin()`` (the start that claims ``run_id``) with ``options`` kept for the run;
        refused (a run of that id exists), the options kept before stay."""
        with self._lock:
            earlier = self._runs.get(run_id)
            self._runs[run_id] = (agent, options)
            try:
                return begin()
            except BaseException:
                if earlier is None:
                    self._runs.pop(run_id, None)
                else:
                    self._runs[run_id] = earlier
                raise

    def of(self, run_id: str) -> T | None:
        """The options the start of ``run_id`` was given in this process, if any."""
        with self._lock:
            mine = self._runs.get(run_id)
        return mine[1] if mine is not None else None

    def forget(self, agent: str) -> None:
        """Drop the runs of ``agent``: its runs resume with what ``agent()`` was given."""
        with self._lock:
            for run_id in [r for r, (owner, _) in self._runs.items() if owner == agent]:
                del self._runs[run_id]
