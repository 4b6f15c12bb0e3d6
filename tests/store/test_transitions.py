"""The one door for status changes: the transition table, deadlines, refusals."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from kernelext._expiry_policy import POLICY
from kernelext.errors import RunStateError
from kernelext.status import (
    FINAL,
    LIVE,
    RESUMABLE,
    TERMINAL,
    TRANSITIONS,
    WAITING,
    Reason,
    Status,
)

pytestmark = pytest.mark.both_backends


def _new_run(store: Any, run_id: str) -> None:
    assert store.create_run(run_id, "agent-x", owner="test")


def test_the_table_names_every_status_and_final_ones_lead_nowhere() -> None:
    assert set(TRANSITIONS) == {None, *Status}
    for status in TERMINAL:
        assert TRANSITIONS[status] == frozenset()
    for status in RESUMABLE:
        assert Status.RUNNING in TRANSITIONS[status], status
    assert WAITING.isdisjoint(FINAL) and LIVE.isdisjoint(FINAL)


def test_an_illegal_move_is_refused_with_what_the_run_can_do(store: Any) -> None:
    _new_run(store, "r1")
    assert store.transition("r1", Status.COMPLETED, LIVE, kind="completed").ok
    with pytest.raises(RunStateError) as caught:
        store.transition("r1", Status.RUNNING, (Status.COMPLETED,), kind="resumed")
    text = str(caught.value)
    assert "cannot move from completed to running" in text and "kx.restart('r1')" in text
    assert store.get_run("r1")["status"] == Status.COMPLETED
    assert [e["kind"] for e in store.events("r1")] == ["created", "completed"]


def test_a_move_from_a_status_the_caller_does_not_accept_changes_nothing(store: Any) -> None:
    _new_run(store, "r2")
    result = store.transition("r2", Status.RUNNING, (Status.SUSPENDED,), kind="resumed")
    assert (result.ok, result.before) == (False, Status.RUNNING)
    assert len(store.events("r2")) == 1


def test_waiting_statuses_get_their_deadline_from_the_policy(store: Any) -> None:
    _new_run(store, "r3")
    before = store.now()
    store.transition("r3", Status.NEEDS_DECISION, LIVE, kind="needs_decision", reason="x")
    row = store.get_run("r3")
    decision = POLICY.durations[Reason.DECISION]
    assert before + decision <= row["deadline"] <= store.now() + decision
    store.transition("r3", Status.RUNNING, WAITING, kind="resumed")
    assert store.get_run("r3")["deadline"] is None
    store.transition("r3", Status.SUSPENDED, LIVE, kind="suspended", reason=Reason.APPROVAL)
    row = store.get_run("r3")
    approval = POLICY.durations[Reason.APPROVAL]
    assert abs(row["deadline"] - (store.now() + approval)) < dt.timedelta(minutes=1)
    assert store.events("r3")[-1]["to_status"] == Status.SUSPENDED


def test_a_status_cannot_be_written_around_the_door(store: Any) -> None:
    _new_run(store, "r4")
    with pytest.raises(RunStateError, match="transition"):
        store.update_run("r4", status=Status.COMPLETED)
    assert store.get_run("r4")["status"] == Status.RUNNING
