"""``run.claim``: exclusive per resource, idempotent per run, released when the run ends."""

from __future__ import annotations

import datetime as dt
import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.live import finish_live_runs

import kernelext as kx
from kernelext._core.lifecycle.run import engine_of
from kernelext._core.process.runtime import runtime
from kernelext._store import Store, open_store

WAIT = 60.0
T0 = dt.datetime(2031, 5, 1, 12, 0, 0)


@pytest.fixture
def store(store_path: Path) -> Iterator[Store]:
    opened = open_store(str(store_path), clock=lambda: T0)
    runtime().settings.use_store(opened)
    yield opened
    finish_live_runs()
    runtime().settings.close()


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def claimer(*, suspend: bool) -> kx.Agent:
    """Claims ``resources`` (resource, amount) outside steps, then optionally suspends."""

    @kx.agent(name=unique("claimer"))
    def agent(run: kx.Run, resources: list[list[Any]]) -> list[str]:
        for resource, amount in resources:
            run.claim(resource, amount)
        for i in run.steps(range(2)):
            if suspend and i == 0:
                run.suspend("approval")
        return [c["resource"] for c in engine_of(run).store.claims(run.id, active=True)]

    return agent


def test_a_held_claim_blocks_another_run_and_the_error_names_the_holder(store: Store) -> None:
    first = claimer(suspend=True).start(
        [["customer:42", None], ["budget:openai", 12.5]], run_id="holder"
    )
    assert first.wait(WAIT) == "suspended"
    rows = store.claims("holder", active=True)
    assert [(r["resource"], r["amount"]) for r in rows] == [
        ("budget:openai", 12.5),
        ("customer:42", None),
    ]

    second = claimer(suspend=False).start([["customer:42", None]], run_id="other")
    assert second.wait(WAIT) == "failed"
    error = second.error
    assert isinstance(error, kx.ClaimConflict)
    text = str(error)
    assert "'customer:42' is claimed by run 'holder'" in text
    assert "since 2031-05-01 12:00:00 UTC" in text
    assert "suspended" in text and "kx.resume('holder')" in text
    assert "deadline 2031-05-04 12:00:00 UTC" in text
    assert store.claims("other") == []

    # The amount does not make a resource shareable: still exclusive.
    third = claimer(suspend=False).start([["budget:openai", 1]], run_id="third")
    assert third.wait(WAIT) == "failed"
    assert "(amount 12.5)" in str(third.error)


def test_claiming_again_in_the_same_run_is_idempotent_also_on_resume(store: Store) -> None:
    agent = claimer(suspend=True)
    handle = agent.start([["gpu:0", 1], ["gpu:0", 1], ["lock:a", None]], run_id="again")
    assert handle.wait(WAIT) == "suspended"
    assert len(store.claims("again")) == 2
    resumed = kx.resume("again")
    assert resumed.wait(WAIT) == "completed"
    assert sorted(resumed.result) == ["gpu:0", "lock:a"]
    rows = store.claims("again")
    assert len(rows) == 2  # the replayed claims added no row
    taken = [e for e in store.events("again") if e["kind"] == "claim_taken"]
    assert len(taken) == 2


def test_a_different_amount_for_a_held_resource_is_refused(store: Store) -> None:
    handle = claimer(suspend=False).start([["budget", 5], ["budget", 7]], run_id="amounts")
    assert handle.wait(WAIT) == "failed"
    assert isinstance(handle.error, kx.ClaimConflict)
    assert "already holds 'budget' with amount 5" in str(handle.error)


def test_claims_are_released_on_completion_and_failure_with_an_event_each(store: Store) -> None:
    done = claimer(suspend=False).start([["customer:1", None], ["customer:2", 3]], run_id="done")
    assert done.wait(WAIT) == "completed"
    assert sorted(done.result) == ["customer:1", "customer:2"]
    assert {(r["resource"], r["release_reason"]) for r in store.claims("done")} == {
        ("customer:1", "completed"),
        ("customer:2", "completed"),
    }
    released = [
        json.loads(e["detail"])["resource"]
        for e in store.events("done")
        if e["kind"] == "claim_released"
    ]
    assert sorted(released) == ["customer:1", "customer:2"]

    @kx.agent(name=unique("crasher"))
    def crasher(run: kx.Run) -> None:
        run.claim("customer:1")
        raise RuntimeError("boom")

    failed = crasher.start(run_id="crashed")
    assert failed.wait(WAIT) == "failed"
    assert [r["release_reason"] for r in store.claims("crashed")] == ["failed"]
    # Released resources can be taken again.
    again = claimer(suspend=False).start([["customer:1", None]], run_id="after")
    assert again.wait(WAIT) == "completed"


def test_two_runs_racing_for_one_resource_get_exactly_one_claim(store: Store) -> None:
    for i in range(10):
        before = threading.Barrier(2)
        after = threading.Barrier(3)

        @kx.agent(name=unique("racer"))
        def racer(
            run: kx.Run,
            resource: str,
            before: threading.Barrier = before,
            after: threading.Barrier = after,
        ) -> None:
            before.wait(WAIT)
            try:
                run.claim(resource)
            finally:
                after.wait(WAIT)  # both attempts are over; the test looks at the claims

        handles = [racer.start(f"slot:{i}", run_id=f"racer-{i}-{n}") for n in range(2)]
        after.wait(WAIT)
        holders = [r["run_id"] for r in store.claims() if r["resource"] == f"slot:{i}"]
        assert len(holders) == 1, holders
        statuses = {h.run_id: h.wait(WAIT) for h in handles}
        assert sorted(statuses.values()) == ["completed", "failed"]
        [loser] = [h for h in handles if statuses[h.run_id] == "failed"]
        assert isinstance(loser.error, kx.ClaimConflict)
        assert f"run {holders[0]!r}" in str(loser.error)


@pytest.mark.parametrize(
    ("resource", "amount", "says"),
    [
        ("", None, "non-empty resource name"),
        (42, None, "non-empty resource name"),
        ("ok", -1, "non-negative number"),
        ("ok", float("nan"), "non-negative number"),
        ("ok", True, "non-negative number"),
    ],
)
def test_bad_claims_are_clear_errors(store: Store, resource: Any, amount: Any, says: str) -> None:
    @kx.agent(name=unique("bad"))
    def bad(run: kx.Run) -> None:
        run.claim(resource, amount)

    handle = bad.start(run_id=unique("bad-run"))
    assert handle.wait(WAIT) == "failed"
    assert isinstance(handle.error, ValueError)
    assert says in str(handle.error)
