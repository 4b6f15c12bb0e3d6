"""run.fact: recording facts, resolving checks by name, time-bounded re-checks, comparison."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import facts_support as fs
import pytest

import kernelext as kx
from kernelext._core.process.runtime import runtime
from kernelext._store import Store, open_store

SKUS = ["A", "B", "C"]


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / "world.json"
    monkeypatch.setenv("KX_TEST_WORLD", str(path))
    fs.set_world(prices={"A": 10.0, "B": 20.0, "C": 30.0}, stock={"A": 5, "B": 7})
    fs.CALLS.clear()
    fs.RELEASE_HANGING.clear()
    yield path
    fs.RELEASE_HANGING.set()  # lets an abandoned hanging check finish
    fs.CALLS.clear()


@pytest.fixture
def store(store_path: Path, world: Path) -> Iterator[Store]:
    opened = open_store(str(store_path))
    yield opened
    opened.close()


def suspended_run(store: Store, run_id: str, mode: str = "named") -> kx.Handle:
    handle = fs.pricing.start(SKUS, run_id=run_id, store=store, mode=mode, stop_after="A")
    assert handle.wait(30) == "suspended"
    return handle


def test_fact_is_recorded_as_json_with_its_step_and_check_name(store: Store) -> None:
    handle = fs.pricing.start(SKUS, run_id="rec", store=store)
    assert handle.wait(30) == "completed"
    assert handle.result == 60.0
    rows = fs.fact_rows(store, "rec")
    assert sorted(rows) == ["price:A", "price:B", "price:C"]
    row = rows["price:B"]
    assert row["kind"] == "value"
    assert json.loads(row["value"]) == 20.0
    assert row["check_name"] == "facts_support:get_price"
    assert json.loads(row["check_args"]) == ["B"]
    assert row["step_ordinal"] == 1
    assert row["fingerprint"] is None
    assert row["check_status"] is None  # never re-checked: the run never resumed


def test_fact_rows_are_durable_when_the_step_completes(store: Store) -> None:
    handle = suspended_run(store, "durable")
    store.close()
    reopened = open_store(store.location)
    try:
        rows = fs.fact_rows(reopened, "durable")
        assert list(rows) == ["price:A"]
        assert reopened.completed_steps("durable")[0]["ordinal"] == rows["price:A"]["step_ordinal"]
    finally:
        reopened.close()
    assert handle.run.id == "durable"


@kx.agent(name="facts-misuse")
def misuse(run: kx.Run, what: str) -> None:
    with run.step("only"):
        if what == "args":
            run.fact("f", 1, check=fs.get_price, args=(object(),))
        elif what == "value":
            run.fact("f", {1, 2}, check=fs.get_price, args=("A",))
        elif what == "no-check":
            run.fact("f", 1)
        elif what == "tolerance-text":
            run.fact("f", "x", check=fs.get_price, tolerance=0.1)
        elif what == "args-string":
            run.fact("f", 1, check=fs.get_price, args="A")


@pytest.mark.parametrize(
    ("what", "error", "says"),
    [
        ("args", kx.SerializationError, "JSON-serialisable"),
        ("value", kx.SerializationError, "never pickled"),
        ("no-check", TypeError, "kx.checks.register"),
        ("tolerance-text", TypeError, "compare="),
        ("args-string", TypeError, "tuple or list"),
    ],
)
def test_fact_refuses_what_it_cannot_store_or_recheck(
    store: Store, what: str, error: type[Exception], says: str
) -> None:
    handle = misuse.start(what, run_id=f"misuse-{what}", store=store)
    assert handle.wait(30) == "failed"
    assert isinstance(handle.error, error)
    assert says in str(handle.error)
    assert fs.fact_rows(store, f"misuse-{what}") == {}


def test_same_process_resume_rechecks_every_fact_before_the_first_step(store: Store) -> None:
    suspended_run(store, "same")
    fs.CALLS.clear()
    handle = kx.resume("same", store=store)
    assert handle.wait(30) == "completed"
    assert handle.result == 60.0
    # The recheck of A (a check call) came before step B's body ran.
    assert fs.CALLS.index(("check", "A")) < fs.CALLS.index(("step", "B"))
    row = fs.fact_rows(store, "same")["price:A"]
    assert row["check_status"] == "ok"
    assert json.loads(row["current_value"]) == 10.0
    assert row["checked_at"] >= row["recorded_at"]
    kinds = fs.event_kinds(store, "same")
    assert kinds.index("facts_checked") < kinds.index("completed")


def test_fresh_process_resolves_the_check_by_name(store: Store, store_path: Path) -> None:
    suspended_run(store, "fresh")
    store.close()
    fs.set_world(prices={"A": 12.5, "B": 20.0, "C": 30.0})
    out = fs.run_fresh(store_path, "resume", "fresh")
    assert out.get("status") == "needs_decision", out
    assert ["step", "B"] not in out["calls"]  # nothing ran
    with fs.reopened(store_path) as again:
        row = fs.fact_rows(again, "fresh")["price:A"]
        assert row["check_status"] == "changed"
        assert json.loads(row["value"]) == 10.0
        assert json.loads(row["current_value"]) == 12.5
        assert row["checked_at"] is not None
    fs.set_world(prices={"A": 10.0, "B": 20.0, "C": 30.0})  # the world is back as recorded
    out = fs.run_fresh(store_path, "resume", "fresh")
    assert out.get("status") == "completed", out
    assert out["result"] == 60.0


def test_lambda_check_warns_and_only_works_in_the_same_process(
    store: Store, store_path: Path
) -> None:
    with pytest.warns(kx.CheckWarning, match="only a resume in this same process"):
        handle = fs.pricing.start(SKUS, run_id="lam", store=store, mode="lambda", stop_after="A")
        assert handle.wait(30) == "suspended"
    assert "<lambda>" in fs.fact_rows(store, "lam")["price:A"]["check_name"]
    store.close()
    out = fs.run_fresh(store_path, "resume", "lam")
    assert out.get("status") == "needs_decision", out
    reopened = open_store(str(store_path))
    try:
        row = fs.fact_rows(reopened, "lam")["price:A"]
        assert row["check_status"] == "unresolved"
        assert row["check_detail"].startswith("cannot re-check")
        # In this process the lambda is still known: the same fact re-checks fine.
        with pytest.warns(kx.CheckWarning):
            handle = kx.resume("lam", store=reopened)
            assert handle.wait(30) == "completed"
        assert fs.fact_rows(reopened, "lam")["price:A"]["check_status"] == "ok"
    finally:
        reopened.close()


def test_a_check_that_raises_is_a_contradiction_with_its_reason(store: Store) -> None:
    suspended_run(store, "raises", mode="raises")
    handle = kx.resume("raises", store=store)
    assert handle.status == "needs_decision"
    row = fs.fact_rows(store, "raises")["price:A"]
    assert row["check_status"] == "error"
    assert "ConnectionError: price service unreachable for A" in row["check_detail"]
    assert "price:A error" in store.get_run("raises")["reason"]


def test_a_check_that_hangs_times_out(store: Store) -> None:
    suspended_run(store, "hangs", mode="hangs")
    saved = runtime().settings.check_timeout
    runtime().settings.check_timeout = 0.3
    try:
        handle = kx.resume("hangs", store=store)
        assert handle.status == "needs_decision"
    finally:
        runtime().settings.check_timeout = saved
        fs.RELEASE_HANGING.set()
    row = fs.fact_rows(store, "hangs")["price:A"]
    assert row["check_status"] == "timeout"
    assert "no answer within 300 ms" in row["check_detail"]
    assert row["current_value"] is None


@pytest.mark.parametrize(("new_price", "status"), [(10.4, "completed"), (10.6, "needs_decision")])
def test_tolerance_for_numbers(store: Store, new_price: float, status: str) -> None:
    suspended_run(store, "tol", mode="tolerance")
    assert fs.fact_rows(store, "tol")["price:A"]["tolerance"] == 0.5
    fs.set_world(prices={"A": new_price, "B": 20.0, "C": 30.0})
    handle = kx.resume("tol", store=store)
    assert handle.wait(30) == status
    expected = "ok" if status == "completed" else "changed"
    assert fs.fact_rows(store, "tol")["price:A"]["check_status"] == expected


@pytest.mark.parametrize(("new_price", "status"), [(10.45, "completed"), (9.0, "needs_decision")])
def test_custom_comparator_is_found_by_name(
    store: Store, store_path: Path, new_price: float, status: str
) -> None:
    suspended_run(store, "cmp", mode="compare")
    assert fs.fact_rows(store, "cmp")["price:A"]["compare_name"] == "facts_support:within_percent"
    store.close()
    fs.set_world(prices={"A": new_price, "B": 20.0, "C": 30.0})
    out = fs.run_fresh(store_path, "resume", "cmp")
    assert out.get("status") == status, out


def test_prefix_registered_check_in_a_fresh_process(store: Store, store_path: Path) -> None:
    handle = fs.stock.start(["A", "B"], run_id="stock", store=store, stop_after="A")
    assert handle.wait(30) == "suspended"
    assert fs.fact_rows(store, "stock")["stock:A"]["check_name"] is None
    store.close()
    fs.set_world(stock={"A": 4, "B": 7})
    out = fs.run_fresh(store_path, "resume", "stock")
    assert out.get("status") == "needs_decision", out
    with fs.reopened(store_path) as again:
        row = fs.fact_rows(again, "stock")["stock:A"]
        assert (row["check_status"], row["current_value"]) == ("changed", "4")


def test_registry_matching_rules() -> None:
    registry = kx.checks
    calls: list[Any] = []

    def exact(*args: Any) -> None:
        calls.append(args)

    registry.register("t-prefix:*", fs.get_stock)
    registry.register("t-prefix:long:*", exact)
    registry.register("t-exact", exact)
    try:
        assert registry.lookup(None, "t-prefix:long:x") is exact
        assert registry.lookup(None, "t-prefix:x") is fs.get_stock
        assert registry.lookup("t-exact", "t-prefix:x") is exact
        assert registry.lookup(None, "other") is None
        assert registry.name_of(exact) == "t-exact"
        with pytest.raises(ValueError, match="name or a prefix"):
            registry.register("*", exact)
    finally:
        for name in ("t-prefix:*", "t-prefix:long:*", "t-exact"):
            registry.unregister(name)


@kx.agent(name="facts-twice")
def twice(run: kx.Run) -> None:
    with run.step("first"):
        run.fact("rate", fs.get_price("A"), check=fs.get_price, args=("A",))
    with run.step("second"):
        run.fact("rate", fs.get_price("A"), check=fs.get_price, args=("A",))
        if fs.world().get("fail_second"):
            raise RuntimeError("the second step breaks")


def test_a_fact_recorded_again_by_an_unfinished_step_is_still_checked(store: Store) -> None:
    fs.set_world(fail_second=True)
    handle = twice.start(run_id="twice", store=store)
    assert handle.wait(30) == "failed"
    assert fs.fact_rows(store, "twice")["rate"]["step_ordinal"] == 0  # the earliest step
    fs.set_world(fail_second=False, prices={"A": 99.0, "B": 20.0, "C": 30.0})
    # The completed step "first" relied on the rate: it is re-checked before "second" runs.
    assert kx.resume("twice", store=store).status == "needs_decision"
    assert fs.fact_rows(store, "twice")["rate"]["check_status"] == "changed"


def test_accepting_an_unresolvable_check_in_a_fresh_process_lets_the_run_go_on(
    store: Store, store_path: Path
) -> None:
    with pytest.warns(kx.CheckWarning):
        handle = fs.pricing.start(SKUS, run_id="lam2", store=store, mode="lambda", stop_after="A")
        assert handle.wait(30) == "suspended"
    store.close()
    assert fs.run_fresh(store_path, "resume", "lam2").get("status") == "needs_decision"
    out = fs.run_fresh(store_path, "accept", "lam2")
    assert out.get("status") == "completed", out  # not stopped again on the same fact
    assert "CheckWarning" in out["stderr"]  # step B recorded another lambda check
    with fs.reopened(store_path) as again:
        assert fs.fact_rows(again, "lam2")["price:A"]["check_status"] == "accepted"
