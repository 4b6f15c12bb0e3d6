"""Contradictions on resume and the three ways out: accept, re-plan from a step, abort."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import facts_support as fs
import pytest

import kernelext as kx
from kernelext._store import Store, actor, open_store

SKUS = ["A", "B", "C"]
PRICES = {"A": 10.0, "B": 20.0, "C": 30.0}


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / "world.json"
    monkeypatch.setenv("KX_TEST_WORLD", str(path))
    fs.set_world(prices=PRICES, crash_on=None)
    fs.CALLS.clear()
    yield path
    fs.CALLS.clear()


@pytest.fixture(params=["duckdb", pytest.param("postgres", marks=pytest.mark.postgres)])
def location(request: pytest.FixtureRequest, store_path: Path) -> str:
    """The same decisions on both backends: a DuckDB file, or a fresh PostgreSQL database."""
    if request.param == "postgres":
        return str(request.getfixturevalue("postgres_url"))
    return str(store_path)


@pytest.fixture
def store(location: str, world: Path) -> Iterator[Store]:
    opened = open_store(location)
    yield opened
    opened.close()


def contradicted(store: Store, run_id: str, stop_after: str = "B") -> kx.Revalidation:
    """A run suspended after ``stop_after`` whose price of A changed since."""
    handle = fs.pricing.start(SKUS, run_id=run_id, store=store, stop_after=stop_after)
    assert handle.wait(30) == "suspended"
    fs.set_world(prices={**PRICES, "A": 11.0})
    assert kx.resume(run_id, store=store).status == "needs_decision"
    return kx.revalidation(run_id, store=store)


def decisions(store: Store, run_id: str) -> list[dict[str, object]]:
    return [e for e in store.events(run_id) if e["kind"] == "revalidation_decision"]


def test_contradictions_are_shown_side_by_side(store: Store) -> None:
    rev = contradicted(store, "side")
    assert [f.name for f in rev.contradictions] == ["price:A"]
    fact = rev.contradictions[0]
    assert (fact.recorded, fact.current, fact.status) == (10.0, 11.0, "changed")
    assert fact.step_key == "A"
    assert fact.checked_at is not None and fact.checked_at >= fact.recorded_at
    assert [f.status for f in rev.facts] == ["changed", "ok"]
    text = repr(rev)
    assert "price:A: recorded 10.0, current 11.0" in text
    assert ".accept(" in text and ".replan(" in text and ".abort(" in text
    assert "kx.revalidation('side')" in store.get_run("side")["reason"]


def test_accept_makes_the_new_values_the_facts_and_the_run_goes_on(store: Store) -> None:
    rev = contradicted(store, "accept")
    handle = rev.accept(note="the new price is fine")
    assert handle.wait(30) == "completed"
    assert handle.result == 10.0 + 20.0 + 30.0  # steps A and B kept their state
    row = fs.fact_rows(store, "accept")["price:A"]
    assert json.loads(row["value"]) == 11.0
    assert row["check_status"] == "accepted"
    [event] = decisions(store, "accept")
    assert event["actor"] == actor()
    assert event["reason"] == "the new price is fine"
    detail = json.loads(str(event["detail"]))
    assert detail["decision"] == "accept"
    assert detail["facts"][0]["name"] == "price:A"
    kinds = fs.event_kinds(store, "accept")
    after = kinds[kinds.index("revalidation_decision") :]
    assert "facts_checked" not in after  # not re-checked again right after the decision
    assert after[-1] == "completed"
    assert rev.decision == "accept"


def test_replan_reruns_from_the_chosen_step_without_repeating_effects(store: Store) -> None:
    rev = contradicted(store, "replan")
    replayed = rev.replayed_effects("A")
    assert [(e["tool"], e["step_key"], e["status"]) for e in replayed] == [
        ("reserve", "A", "applied"),
        ("reserve", "B", "applied"),
    ]
    handle = rev.replan("A", note="redo with the new price", args=(SKUS,), kwargs={})
    assert handle.wait(30) == "completed"
    assert handle.result == 11.0 + 20.0 + 30.0  # A's step ran again with the new price
    # Effects of the replayed steps were not performed again; C was performed once.
    assert [e["sku"] for e in fs.log()] == ["A", "B", "C"]
    steps = store.steps("replan")
    assert [(s["key"], s["status"]) for s in steps] == [
        ("A", "superseded"),
        ("B", "superseded"),
        ("A", "completed"),
        ("B", "completed"),
        ("C", "completed"),
    ]
    assert store.get_run("replan")["completed_steps"] == 3
    [event] = decisions(store, "replan")
    detail = json.loads(str(event["detail"]))
    assert (detail["decision"], detail["from_step"], detail["step_key"]) == ("replan", 0, "A")
    assert [e["tool"] for e in detail["replayed_effects"]] == ["reserve", "reserve"]
    assert detail["superseded_steps"] == 2
    assert event["reason"] == "redo with the new price"
    assert json.loads(fs.fact_rows(store, "replan")["price:A"]["value"]) == 11.0


def test_replan_from_a_later_step_accepts_the_facts_of_the_kept_steps(store: Store) -> None:
    rev = contradicted(store, "replan-b")
    handle = rev.replan(1, args=(SKUS,), kwargs={})
    assert handle.wait(30) == "completed"
    assert handle.result == 10.0 + 20.0 + 30.0  # A kept, with its recorded state
    row = fs.fact_rows(store, "replan-b")["price:A"]
    assert (row["check_status"], json.loads(row["value"])) == ("accepted", 11.0)


def test_replan_refuses_a_step_that_did_not_complete(store: Store) -> None:
    rev = contradicted(store, "replan-bad")
    with pytest.raises(ValueError, match=r"0 \('A'\), 1 \('B'\)"):
        rev.replan("C")
    assert store.get_run("replan-bad")["status"] == "needs_decision"


def test_abort_cancels_the_run_and_releases_its_claims(store: Store) -> None:
    handle = fs.with_claim.start(SKUS, run_id="abort", store=store, stop_after="A")
    assert handle.wait(30) == "suspended"
    fs.set_world(prices={**PRICES, "A": 99.0})
    assert kx.resume("abort", store=store).status == "needs_decision"
    rev = kx.revalidation("abort", store=store)
    rev.abort(note="price moved too much")
    assert store.get_run("abort")["status"] == "cancelled"
    claims = store.read("SELECT released_at, release_reason FROM claims WHERE run_id = 'abort'")
    assert claims and all(row[0] is not None and row[1] == "cancelled" for row in claims)
    [event] = decisions(store, "abort")
    assert event["reason"] == "price moved too much"
    assert json.loads(str(event["detail"]))["decision"] == "abort"
    with pytest.raises(kx.RunStateError, match="cancelled"):
        kx.resume("abort", store=store)
    with pytest.raises(kx.RunStateError, match="not needs_decision"):
        rev.accept()


def test_resuming_again_rechecks_and_goes_on_once_the_world_is_back(store: Store) -> None:
    contradicted(store, "back")
    fs.set_world(prices=PRICES)
    handle = kx.resume("back", store=store)
    assert handle.wait(30) == "completed"
    assert decisions(store, "back") == []


def test_decisions_need_a_run_waiting_for_one(store: Store) -> None:
    handle = fs.pricing.start(SKUS, run_id="done", store=store)
    assert handle.wait(30) == "completed"
    rev = kx.revalidation("done", store=store)
    for decide in (rev.accept, rev.abort):
        with pytest.raises(kx.RunStateError, match="is completed, not needs_decision"):
            decide()
    assert rev.contradictions == []


def test_unknown_effects_are_decided_first_then_the_facts(store: Store, location: str) -> None:
    """A process dies inside an effect of step B while A's price changes: the ledger
    stops the resume first (reconcile), then the facts are re-checked (revalidate)."""
    store.close()
    fs.set_world(prices=PRICES, crash_on="B")
    out = fs.run_fresh(location, "start", "both", {"agent": "facts-pricing", "skus": SKUS})
    assert out.get("returncode") == 3, out  # died inside reserve("B")
    fs.set_world(prices={**PRICES, "A": 12.0}, crash_on=None)
    with fs.reopened(location) as again:
        first = kx.resume("both", store=again)
        assert first.status == "needs_decision"
        assert "unknown outcome" in again.get_run("both")["reason"]
        rev = kx.revalidation("both", store=again)
        assert len(rev.unknown_effects) == 1
        assert "kx.reconcile('both')" in repr(rev)
        with pytest.raises(kx.RunStateError, match=r"Decide those with kx.reconcile\('both'\)"):
            rev.accept()
        [unknown] = kx.reconcile("both", store=again)
        unknown.mark_applied({"reserved": "B"}, note="the warehouse confirmed it")
        second = kx.resume("both", store=again)
        assert second.status == "needs_decision"  # now the facts: price:A changed
        rev = kx.revalidation("both", store=again)
        assert [f.name for f in rev.contradictions] == ["price:A"]
        # B's fact belonged to a step that never completed: it is recorded again, not checked.
        assert fs.fact_rows(again, "both")["price:B"]["check_status"] is None
        handle = rev.accept(note="fine")
        assert handle.wait(30) == "completed"
        kinds = fs.event_kinds(again, "both")
    order = [
        k
        for k in kinds
        if k in ("effect_decided", "facts_checked", "revalidation_decision", "completed")
    ]
    assert order == ["effect_decided", "facts_checked", "revalidation_decision", "completed"]
    assert [e["sku"] for e in fs.log()] == ["A", "C"]  # B was applied per the reconciliation
