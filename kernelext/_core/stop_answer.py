"""What a stop request answers: the run's status, and what to do when nothing was running.

``h.stop()`` and ``kx.stop`` return the status after the request (a ``str``). For a run
that is no longer running (completed, failed, waiting) the request changes nothing, and
the answer carries a ``notice`` that says so and what to do instead; a notebook shows the
notice as the cell's result.
"""

from __future__ import annotations

from typing import Any

from .._shown import shown
from ..status import Status

__all__ = ["StopAnswer", "nothing_to_stop"]


class StopAnswer(str):
    """The run's status after a stop request (equal to it), with ``notice``: ``None`` when
    the request was taken, else a sentence saying why there was nothing to stop."""

    notice: str | None

    def __new__(cls, status: str, notice: str | None = None) -> StopAnswer:
        answer = super().__new__(cls, str(status))
        answer.notice = notice
        return answer

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # IPython's display
        printer.text(shown(self.notice or repr(str(self)), lines=True))


def nothing_to_stop(run_id: str, status: str) -> str | None:
    """Why a stop of run ``run_id`` in ``status`` changes nothing, and what to do instead;
    ``None`` while it runs (the stop is taken, or one is pending already)."""
    run = repr(run_id)
    if status == Status.COMPLETED:
        return (
            f"run {run} already completed; nothing to stop. Start a new run with the agent's "
            f".start(...) and a new run_id (or kx.restart({run}) to run it again)."
        )
    if status == Status.FAILED:
        return f"run {run} failed; nothing to stop. kx.resume({run}) retries it."
    if status in (Status.SUSPENDED, Status.NEEDS_DECISION):
        return (
            f"run {run} is {status} already; nothing to stop. kx.plan({run}) shows what a "
            f"resume does, kx.resume({run}) goes on."
        )
    if status in (Status.CANCELLED, Status.EXPIRED):
        return (
            f"run {run} is {status}; nothing to stop. kx.restart({run}) starts a new run "
            "from its snapshot."
        )
    return None
