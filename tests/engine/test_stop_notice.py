"""A stop of a run that no longer runs says so and what to do instead (a notebook shows
the notice as the cell's result); the answer still equals the run's status."""

from __future__ import annotations

import json
import threading

import pytest
from IPython.lib.pretty import pretty
from support.live import name

import kernelext as kx
from kernelext._store import Store

WAIT = 60.0

pytestmark = pytest.mark.both_backends


def test_stopping_a_completed_run_says_there_is_nothing_to_stop_and_how_to_start_again(
    store: Store,
) -> None:
    @kx.agent(name=name("done"))
    def done(run: kx.Run) -> int:
        for i in run.steps(range(2)):
            run.state["n"] = i
        return 2

    handle = done.start(run_id="done-1")
    assert handle.wait(WAIT) == "completed"
    answer = handle.stop()
    assert answer == "completed" and json.dumps(answer) == '"completed"'
    assert answer.notice is not None
    assert "run 'done-1' already completed; nothing to stop" in answer.notice
    assert pretty(answer) == answer.notice  # what the notebook shows for h.stop()
    assert kx.stop("done-1").notice == answer.notice
    with pytest.raises(kx.RunStateError, match=r"nothing to resume\. Start a new run") as refused:
        kx.resume("done-1")
    assert "kx.restart('done-1')" in str(refused.value) and "kx.restart('done-1')" in answer.notice
    assert kx.restart("done-1").wait(WAIT) == "completed"  # the advice holds
    assert store.get_run("done-1")["status"] == "completed"  # the stop changed nothing


def test_a_stop_that_is_taken_has_no_notice_and_a_waiting_run_points_at_resume(
    store: Store,
) -> None:
    began, go = threading.Event(), threading.Event()

    @kx.agent(name=name("slow"))
    def slow(run: kx.Run) -> None:
        for _i in run.steps(range(3)):
            began.set()
            go.wait(WAIT)

    handle = slow.start(run_id="slow-1")
    assert began.wait(WAIT)
    taken = handle.stop()
    go.set()
    assert taken == "stopping" and taken.notice is None and pretty(taken) == "'stopping'"
    assert handle.wait(WAIT) == "suspended"
    waiting = handle.stop()
    assert waiting == "suspended" and waiting.notice is not None
    assert "nothing to stop" in waiting.notice and "kx.resume('slow-1')" in waiting.notice
