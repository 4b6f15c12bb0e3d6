"""Store conformance: claims (resources a run holds) and recorded facts (see ``store_suite.py``).

Claims: exclusive per resource while the holder can still go on (live or waiting),
idempotent for the holder, released with a reason (and one event per claim) in the
transaction that ends the run. Facts: one row per run and name, replaced when recorded
again (keeping the earliest step), re-checked and decided on in one transaction each.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from kernelext._store import Store
from kernelext.errors import ClaimConflict, RunStateError
from kernelext.status import FINAL, EffectStatus, Status, StepStatus

from .store_suite_support import (
    FakeClock,
    StoreFactory,
    complete,
    effect_row,
    events,
    fact,
    move,
    with_runs,
)

__all__ = ["TestClaims", "TestFacts"]


def end_run(store: Store, run_id: str, status: Status) -> int:
    """End a live run as the engine does: the transition and the release in one transaction."""

    def job(tx: Any) -> int:
        assert store.transition_tx(tx, run_id, status, (Status.RUNNING,), kind=status).ok
        return store.release_run_claims_tx(tx, run_id, status)

    return store.write(job)


def check(name: str, status: str, current: Any, at: Any, fingerprint: str | None = None) -> Any:
    return {
        "name": name,
        "status": status,
        "current_value": json.dumps(current),
        "detail": f"{name} is {status}",
        "checked_at": at,
        "fingerprint": fingerprint,
    }


class TestClaims:
    def test_a_claim_is_recorded_with_one_event(self, store_factory: StoreFactory) -> None:
        clock = FakeClock()
        store = store_factory(clock)
        store.create_run("r1", "agent")
        claim = store.claim("r1", "customer:42", 2.5)
        assert claim.new and (claim.resource, claim.run_id, claim.amount) == (
            "customer:42",
            "r1",
            2.5,
        )
        assert claim.claimed_at == clock.current
        (row,) = store.claims("r1")
        assert (row["id"], row["amount"], row["released_at"], row["release_reason"]) == (
            claim.id,
            2.5,
            None,
            None,
        )
        (event,) = events(store, "r1", "claim_taken")
        assert event["source"] == "agent"
        assert json.loads(event["detail"]) == {"resource": "customer:42", "amount": 2.5}

    def test_claiming_again_from_the_holder_is_idempotent(
        self, store_factory: StoreFactory
    ) -> None:
        clock = FakeClock()
        store = store_factory(clock)
        store.create_run("r1", "agent")
        first = store.claim("r1", "budget", 10.0)
        clock.advance(5)
        for amount in (10.0, None):  # a resume replays the call; no amount means "as held"
            again = store.claim("r1", "budget", amount)
            assert not again.new
            assert (again.id, again.amount, again.claimed_at) == (first.id, 10.0, first.claimed_at)
        with pytest.raises(ClaimConflict, match="already holds 'budget' with amount 10"):
            store.claim("r1", "budget", 11.0)
        assert len(store.claims("r1")) == 1
        assert len(events(store, "r1", "claim_taken")) == 1

    @pytest.mark.parametrize(
        "status",
        [Status.RUNNING, Status.STOPPING, Status.SUSPENDED, Status.NEEDS_DECISION],
        ids=str,
    )
    def test_a_resource_is_exclusive_while_its_holder_can_go_on(
        self, store_factory: StoreFactory, status: Status
    ) -> None:
        store = with_runs(store_factory(), "r1", "r2")
        store.claim("r1", "customer:42")
        move(store, "r1", status)
        with pytest.raises(ClaimConflict, match=r"'customer:42' is claimed by run 'r1'") as err:
            store.claim("r2", "customer:42")
        assert f"that run is {status}" in str(err.value)
        assert store.claims("r2") == []
        assert events(store, "r2", "claim_taken") == []
        # Other resources stay free for everyone.
        assert store.claim("r2", "customer:43").new

    def test_the_conflict_says_how_a_suspended_holder_lets_go(
        self, store_factory: StoreFactory
    ) -> None:
        store = with_runs(store_factory(), "r1", "r2")
        store.claim("r1", "slot", 1.0)
        store.transition("r1", Status.SUSPENDED, (Status.RUNNING,))
        with pytest.raises(ClaimConflict, match=r"kx\.resume\('r1'\)"):
            store.claim("r2", "slot")

    @pytest.mark.parametrize("status", sorted(FINAL), ids=str)
    def test_a_final_holder_blocks_nobody(
        self, store_factory: StoreFactory, status: Status
    ) -> None:
        store = with_runs(store_factory(), "r1", "r2")
        store.claim("r1", "customer:42")
        move(store, "r1", status)  # even a claim nobody released does not hold any more
        assert store.get_run("r1")["status"] == status
        taken = store.claim("r2", "customer:42")
        assert taken.new and taken.run_id == "r2"
        assert [r["run_id"] for r in store.claims(active=True)] == ["r1", "r2"]

    def test_ending_a_run_releases_its_claims_with_the_reason(
        self, store_factory: StoreFactory
    ) -> None:
        clock = FakeClock()
        store = with_runs(store_factory(clock), "r1", "r2")
        store.claim("r1", "a", 1.0)
        store.claim("r1", "b")
        store.claim("r2", "c")
        ended_at = clock.advance(30)
        assert end_run(store, "r1", Status.COMPLETED) == 2
        rows = {r["resource"]: r for r in store.claims("r1")}
        assert {(r["released_at"], r["release_reason"]) for r in rows.values()} == {
            (ended_at, Status.COMPLETED)
        }
        released = events(store, "r1", "claim_released")
        assert sorted(json.loads(e["detail"])["resource"] for e in released) == ["a", "b"]
        assert {e["reason"] for e in released} == {Status.COMPLETED}
        # Releasing again finds nothing; the other run keeps its claim.
        assert store.write(lambda tx: store.release_run_claims_tx(tx, "r1", Status.FAILED)) == 0
        assert len(events(store, "r1", "claim_released")) == 2
        assert [(r["run_id"], r["resource"]) for r in store.claims(active=True)] == [("r2", "c")]
        assert store.claim("r2", "a", 3.0).new

    def test_last_claims_are_one_per_resource_latest_amount(
        self, store_factory: StoreFactory
    ) -> None:
        clock = FakeClock()
        store = store_factory(clock)
        store.create_run("r1", "agent")
        store.claim("r1", "a", 1.0)
        clock.advance(1)
        store.claim("r1", "b")
        clock.advance(1)
        store.write(lambda tx: store.release_run_claims_tx(tx, "r1", "test"))
        clock.advance(1)
        store.claim("r1", "a", 3.0)  # claimed again after the release: a new row
        assert len(store.claims("r1")) == 3
        last = store.write(lambda tx: store.last_claims_tx(tx, "r1"))
        assert last == [("b", None), ("a", 3.0)]


class TestFacts:
    def test_a_fact_is_stored_with_everything_needed_to_check_it(
        self, store_factory: StoreFactory
    ) -> None:
        clock = FakeClock()
        store = store_factory(clock)
        store.create_run("r1", "agent")
        store.record_fact(fact("r1", "price", 9.5, 0, tolerance=0.1, fingerprint="fp1"))
        (row,) = store.facts("r1")
        assert row["run_id"] == "r1" and row["name"] == "price"
        assert json.loads(row["value"]) == 9.5
        assert (row["kind"], row["check_name"], row["tolerance"], row["fingerprint"]) == (
            "value",
            "tests.lookup",
            0.1,
            "fp1",
        )
        assert (row["step_ordinal"], row["recorded_at"]) == (0, clock.current)
        assert (row["checked_at"], row["current_value"], row["check_status"]) == (None, None, None)

    def test_recording_again_replaces_it_and_keeps_the_earliest_step(
        self, store_factory: StoreFactory
    ) -> None:
        clock = FakeClock()
        store = store_factory(clock)
        store.create_run("r1", "agent")
        store.record_fact(fact("r1", "price", 9.5, 2))
        store.save_fact_checks("r1", [check("price", "changed", 10.0, clock.advance(1))])
        later = clock.advance(1)
        store.record_fact(fact("r1", "price", 11.0, 5))
        (row,) = store.facts("r1")
        assert (json.loads(row["value"]), row["step_ordinal"], row["recorded_at"]) == (
            11.0,
            2,
            later,
        )
        # A new value starts unchecked.
        assert (row["checked_at"], row["current_value"], row["check_status"]) == (None, None, None)
        store.record_fact(fact("r1", "price", 12.0, 1))
        assert [r["step_ordinal"] for r in store.facts("r1")] == [1]

    def test_facts_belong_to_their_run_in_step_order(self, store_factory: StoreFactory) -> None:
        store = store_factory()
        for run_id in ("r1", "r2"):
            store.create_run(run_id, "agent")
        store.record_fact(fact("r1", "b", 1, 3))
        store.record_fact(fact("r1", "a", 2, 1))
        store.record_fact(fact("r1", "z", 3, None))  # recorded outside any step
        store.record_fact(fact("r2", "a", "other run", 0))
        assert [r["name"] for r in store.facts("r1")] == ["z", "a", "b"]
        (other,) = store.facts("r2")
        assert json.loads(other["value"]) == "other run"
        assert store.facts("nobody") == []

    def test_checks_are_saved_with_one_event(self, store_factory: StoreFactory) -> None:
        clock = FakeClock()
        store = store_factory(clock)
        store.create_run("r1", "agent")
        store.record_fact(fact("r1", "a", 1, 0, fingerprint="old"))
        store.record_fact(fact("r1", "b", 2, 0, fingerprint="old"))
        at = clock.advance(60)
        store.save_fact_checks("r1", [check("a", "ok", 1, at), check("b", "changed", 3, at, "new")])
        rows = {r["name"]: r for r in store.facts("r1")}
        assert (rows["a"]["check_status"], rows["a"]["checked_at"]) == ("ok", at)
        assert (rows["b"]["check_status"], json.loads(rows["b"]["current_value"])) == ("changed", 3)
        assert rows["b"]["check_detail"] == "b is changed"
        assert json.loads(rows["b"]["value"]) == 2  # the recorded value stays until accepted
        # A check without a fingerprint keeps the recorded one.
        assert (rows["a"]["fingerprint"], rows["b"]["fingerprint"]) == ("old", "new")
        (event,) = events(store, "r1", "facts_checked")
        assert json.loads(event["detail"]) == {"ok": 1, "changed": 1}
        store.save_fact_checks("r1", [check("a", "ok", 1, at)], event_kind="credentials_refreshed")
        assert len(events(store, "r1", "credentials_refreshed")) == 1
        store.save_fact_checks("r1", [])  # nothing checked: nothing written
        assert len(events(store, "r1", "facts_checked")) == 1

    def test_accepting_takes_the_rechecked_values(self, store_factory: StoreFactory) -> None:
        clock = FakeClock()
        store = store_factory(clock)
        store.create_run("r1", "agent")
        store.record_fact(fact("r1", "a", 1, 0))
        store.record_fact(fact("r1", "b", 2, 0))
        recorded_at = clock.current
        at = clock.advance(60)
        store.save_fact_checks("r1", [check("a", "changed", 5, at), check("b", "ok", 2, at)])
        store.transition("r1", Status.NEEDS_DECISION, (Status.RUNNING,))

        def accept(tx: Any) -> str:
            status = store.lock_for_decision_tx(tx, "r1")
            store.accept_facts_tx(tx, "r1", ["a", "b"])
            return status

        assert store.write(accept) == Status.NEEDS_DECISION
        rows = {r["name"]: r for r in store.facts("r1")}
        assert (json.loads(rows["a"]["value"]), rows["a"]["recorded_at"]) == (5, at)
        assert (json.loads(rows["b"]["value"]), rows["b"]["recorded_at"]) == (2, recorded_at)
        assert {r["check_status"] for r in rows.values()} == {"accepted"}

    @pytest.mark.parametrize("status", [Status.RUNNING, Status.SUSPENDED], ids=str)
    def test_a_decision_needs_a_run_that_waits_for_one(
        self, store_factory: StoreFactory, status: Status
    ) -> None:
        store = store_factory()
        store.create_run("r1", "agent")
        move(store, "r1", status)
        store.record_fact(fact("r1", "a", 1, 0))
        store.save_fact_checks("r1", [check("a", "changed", 5, store.now())])

        def accept(tx: Any) -> None:
            store.lock_for_decision_tx(tx, "r1")
            store.accept_facts_tx(tx, "r1", ["a"])

        with pytest.raises(RunStateError, match=f"is {status}, not needs_decision"):
            store.write(accept)
        (row,) = store.facts("r1")
        assert (json.loads(row["value"]), row["check_status"]) == (1, "changed")
        with pytest.raises(RunStateError, match="'nobody' is missing"):
            store.write(lambda tx: store.lock_for_decision_tx(tx, "nobody"))

    def test_a_replan_supersedes_later_steps_and_their_facts(
        self, store_factory: StoreFactory
    ) -> None:
        store = store_factory()
        store.create_run("r1", "agent")
        for ordinal in range(4):
            complete(store, "r1", ordinal, f"k{ordinal}")
            store.record_fact(fact("r1", f"f{ordinal}", ordinal, ordinal))
        early, late = effect_row("r1"), {**effect_row("r1"), "step_key": "k3", "step_ordinal": 3}
        for row in (early, late):
            store.write_intent(row)
        assert store.get_run("r1")["completed_steps"] == 4
        assert store.write(lambda tx: store.supersede_steps_tx(tx, "r1", 2)) == 2
        status = {s["key"]: s["status"] for s in store.steps("r1")}
        assert status == {
            "k0": StepStatus.COMPLETED,
            "k1": StepStatus.COMPLETED,
            "k2": StepStatus.SUPERSEDED,
            "k3": StepStatus.SUPERSEDED,
        }
        assert store.get_run("r1")["completed_steps"] == 2
        checks = {r["name"]: r["check_status"] for r in store.facts("r1")}
        assert checks == {
            "f0": None,
            "f1": None,
            "f2": StepStatus.SUPERSEDED,
            "f3": StepStatus.SUPERSEDED,
        }
        # The ledger rows of the re-planned steps stay as they are.
        (kept,) = store.effects_from_step("r1", 2)
        assert (kept["key"], kept["step_ordinal"], kept["status"]) == (
            late["key"],
            3,
            EffectStatus.PENDING,
        )
