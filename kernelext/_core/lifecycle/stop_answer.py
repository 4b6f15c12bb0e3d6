"""What a stop request answers: the run's status, and what to do when nothing was running.

``h.stop()`` and ``kx.stop`` return the status after the request (a ``str``). For a run
that is no longer running (completed, failed, waiting) the request changes nothing, and
the answer carries a ``notice`` that says so and what to do instead; a notebook shows the
notice as the cell's result.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..._shown import shown
from ...status import Status

if TYPE_CHECKING:
    from ..._store.duckdb.mailbox import Posted

__all__ = ["StopAnswer", "busy_answer", "nothing_to_stop"]


class StopAnswer(str):
    """The run's status after a stop request (equal to it), with ``notice``: ``None`` when
    the request was taken, else a sentence saying why there was nothing to stop.

    ``busy``: set when another process kept the store file (a long query) and the request
    was recorded beside it instead (``Store.post_stop_if_busy``): the sentence says so and
    who holds the file. The status is then ``stopping``, as the run's process sees it."""

    notice: str | None
    busy: str | None

    def __new__(cls, status: str, notice: str | None = None, busy: str | None = None) -> StopAnswer:
        answer = super().__new__(cls, str(status))
        answer.notice = notice
        answer.busy = busy
        return answer

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # IPython's display
        printer.text(shown(self.notice or self.busy or repr(str(self)), lines=True))


def busy_answer(run_id: str, posted: Posted, *, force: bool = False) -> StopAnswer:
    """The answer to a stop recorded beside a busy store (``Store.post_stop_if_busy``)."""
    holder = f"process {posted.pid}" if posted.pid is not None else "another process"
    since = f" since {posted.since}" if posted.since else ""
    what = "force stop" if force else "stop"
    return StopAnswer(
        Status.STOPPING,
        busy=(
            f"{what} recorded for run {run_id}; the store is busy ({holder} holds it{since}, "
            "e.g. for a long query), so the run's process reads the request beside it and the "
            "run stops at its next safe point"
            + (" (its current step is cancelled)" if force else "")
            + ". A run that is no longer running keeps its status."
        ),
    )


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
