"""A run waiting for a person: suspending for one, what it waits for, going on after.

An approval (``approvals.py``) and a question (``questions.py``) both suspend the run
with :func:`wait_for_person` (reason ``approval`` or ``input``), list what waits as a
:class:`Waiting` (shown as cards in a notebook), and, once a person decided or answered,
:func:`go_on`: the run resumes when this process runs it. What resuming takes is
``control.resume_if_here``'s, installed here when ``control`` is imported (as
``kernelext`` does), so the people's side never imports the lifecycle above it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from ..._shown import shows
from ..._store import Store
from ...errors import StopRequested
from ...status import Reason
from ..engine.step_info import current_item
from ..process.runtime import runtime

if TYPE_CHECKING:
    import datetime as dt

    from ..engine.run_engine import RunEngine

__all__ = [
    "Waiting",
    "WaitingForPerson",
    "go_on",
    "install_go_on",
    "wait_for_person",
    "waiting_text",
]

T = TypeVar("T")

GoOn = Callable[[Store, str, str], Any]  # (store, run id, source) -> the new handle or None
_GO_ON: GoOn | None = None


def install_go_on(resume_if_here: GoOn) -> None:
    """Called by ``kernelext._core.lifecycle.control`` at import: how a run goes on after
    a person."""
    global _GO_ON
    _GO_ON = resume_if_here


def go_on(store: Store, run_id: str, source: str) -> Any:
    """After a person's decision or answer: resume ``run_id`` when this process runs it and
    it waits for nobody else. The new handle, or None (see ``control.resume_if_here``)."""
    if _GO_ON is None:  # never once kernelext is imported: its __init__ imports control
        raise RuntimeError(
            "kernelext._core.lifecycle.control is not loaded, so nothing can resume the run after "
            "the decision (which is recorded); import kernelext, then kx.resume the run"
        )
    return _GO_ON(store, run_id, source)


class WaitingForPerson(StopRequested):
    """The stop :func:`wait_for_person` raises: kernelext suspends the run for a person
    (``reason``: ``approval`` or ``input``; ``note``: what the run waits for). A recorded
    call whose body it leaves knows by it that a call made inside waits for a person
    (``ledger.effect_approval.left_inside``); a stop of any other origin is a plain
    ``StopRequested``."""

    def __init__(self, reason: str, note: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.note = note


def wait_for_person(
    run: RunEngine, reason: str, deadline: dt.datetime | None, note: str
) -> NoReturn:
    """Suspend ``run`` here, now, with ``reason`` and ``deadline``, for a person to act.

    The open step is not completed: it ends ``cancelled`` and runs again on resume. The
    stop is delivered like any other, so an agent that swallows it meets it again at its
    next kernelext call (as a plain ``StopRequested``).
    """
    item = current_item(run)
    if item is not None:  # a run.map item: it ends here, the others go on (see batch)
        item.waiting = (reason, deadline, note)
        raise WaitingForPerson(reason, note)
    run.suspend_request = (reason, deadline, note)
    run.stop_event.set()
    run.stop_event.delivered = StopRequested
    raise WaitingForPerson(reason, note)


def waiting_text(run_id: str, reason: str | None) -> str | None:
    """What a run suspended for a person waits for, and what to do (None for other reasons)."""
    if reason == Reason.APPROVAL:
        return (
            f"run {run_id!r} waits for an approval: nothing was sent. Approve or reject it in "
            f"the run's panel, with kx.approvals({run_id!r}), or `kernelext approve ID`; then "
            "the run goes on (a %%agent cell: run it again)."
        )
    if reason == Reason.INPUT:
        return (
            f"run {run_id!r} waits for an answer: kx.answer({run_id!r}, value), the run's panel, "
            f"or `kernelext answer {run_id} VALUE`; then the run goes on (a %%agent cell: run "
            "it again)."
        )
    return None


class Waiting(list[T]):
    """What waits for a person (of one run, or of every run); in a notebook it displays
    as cards with their buttons (``approvals_renderer``), elsewhere as ``text()``."""

    def __init__(self, run_id: str | None, store: Store, items: list[T]) -> None:
        super().__init__(items)
        self.run_id = run_id
        self.store = store

    @shows
    def text(self) -> str:
        raise NotImplementedError

    @shows
    def __repr__(self) -> str:
        return self.text()

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> Any:
        renderer = runtime().settings.approvals_renderer
        if renderer is None:
            return {"text/plain": self.text()}
        return renderer(self)
