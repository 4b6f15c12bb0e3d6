"""The revalidation and reconciliation widgets, driven in-process with button.click()."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import facts_support as fs
import pytest

import kernelext as kx
from kernelext._store import Store, actor, open_store
from kernelext.widgets._reconcile import (
    ReconcileWidget,
    parse_result,
    reconcile_for_handle,
    reconciliation_mimebundle,
    render_reconciliation,
)
from kernelext.widgets._revalidation import (
    RevalidationWidget,
    render_revalidation,
    revalidation_for_handle,
    revalidation_mimebundle,
)

SKUS = ["A", "B", "C"]
PRICES = {"A": 10.0, "B": 20.0, "C": 30.0}


@pytest.fixture
def store(store_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
    monkeypatch.setenv("KX_TEST_WORLD", str(tmp_path / "world.json"))
    fs.set_world(prices=PRICES, crash_on=None)
    opened = open_store(str(store_path))
    yield opened
    opened.close()


def contradicted(store: Store, run_id: str) -> kx.Revalidation:
    handle = fs.pricing.start(SKUS, run_id=run_id, store=store, stop_after="B")
    assert handle.wait(30) == "suspended"
    fs.set_world(prices={**PRICES, "A": 11.0})
    assert kx.resume(run_id, store=store).status == "needs_decision"
    return kx.revalidation(run_id, store=store)


def test_accept_button_resumes_the_run(store: Store) -> None:
    decided: list[Any] = []
    widget = render_revalidation(contradicted(store, "w-accept"), on_decided=decided.append)
    assert isinstance(widget, RevalidationWidget)
    assert "price:A" in widget.table.value and "changed" in widget.table.value
    assert widget.table.value.index("price:A") < widget.table.value.index("price:B")
    assert not widget.accept_button.disabled
    widget.note.value = "new price accepted"
    widget.accept_button.click()
    [handle] = decided
    assert handle.wait(30) == "completed"
    assert "Accepted" in widget.message.value
    assert widget.accept_button.disabled and widget.abort_button.disabled
    assert widget.replan_button.disabled and widget.note.disabled, "decided: nothing to click"
    widget.rev.reload()
    widget.draw()  # a redraw after the decision keeps it decided
    assert widget.accept_button.disabled and widget.abort_button.disabled
    [event] = [e for e in store.events("w-accept") if e["kind"] == "revalidation_decision"]
    assert (event["source"], event["reason"]) == ("widget", "new price accepted")


def test_the_table_says_why_a_fact_could_not_be_checked(store: Store, store_path: Path) -> None:
    with pytest.warns(kx.CheckWarning, match="only a resume in this same process"):
        handle = fs.pricing.start(SKUS, run_id="w-why", store=store, mode="lambda", stop_after="A")
        assert handle.wait(30) == "suspended"
    store.close()
    out = fs.run_fresh(store_path, "resume", "w-why")  # another process: the lambda is unknown
    assert out.get("status") == "needs_decision", out
    with fs.reopened(store_path) as reopened:
        widget = render_revalidation(kx.revalidation("w-why", store=reopened))
        detail = fs.fact_rows(reopened, "w-why")["price:A"]["check_detail"]
        assert detail.startswith("cannot re-check")
        assert "unresolved: " in widget.table.value and detail[:40] in widget.table.value


def test_replan_button_uses_the_picked_step_and_lists_replayed_effects(store: Store) -> None:
    widget = render_revalidation(contradicted(store, "w-replan"))
    assert [value for _, value in widget.step_picker.options] == [0, 1]
    widget.step_picker.value = 1
    assert "replays 1 effect(s)" in widget.replayed.value
    widget.step_picker.value = 0
    assert "replays 2 effect(s)" in widget.replayed.value
    assert "not performed again" in widget.replayed.value
    steps = [s["key"] for s in store.steps("w-replan")][:2]
    for number, key in enumerate(steps, 1):  # a step reads as on every other surface
        label = (
            f"step {number}" if key in (str(number - 1), str(number)) else f"step {number} ({key})"
        )
        assert f"<td>{label}</td>" in widget.replayed.value
        assert f"<td>{label}</td></tr>" in widget.table.value
    widget.replan_button.click()
    assert widget.rev.decision == "replan"
    assert widget.rev.handle is not None
    assert widget.rev.handle.wait(30) == "suspended"  # stop_after="B" applies again
    assert [s["status"] for s in store.steps("w-replan")][:2] == ["superseded", "superseded"]
    assert [e["sku"] for e in fs.log()] == ["A", "B"]  # replayed, not repeated


def test_abort_button_cancels(store: Store) -> None:
    widget = render_revalidation(contradicted(store, "w-abort"))
    widget.abort_button.click()
    assert store.get_run("w-abort")["status"] == "cancelled"
    assert "cancelled" in widget.message.value


def test_a_refused_decision_is_shown_and_the_widget_stays_usable(store: Store) -> None:
    rev = contradicted(store, "w-refused")
    widget = render_revalidation(rev)
    rev.abort()  # decided elsewhere in the meantime
    widget.accept_button.click()
    assert "not needs_decision" in widget.message.value
    assert widget.accept_button.disabled


def test_revalidation_with_many_facts_is_a_scrollable_table(store: Store) -> None:
    skus = [f"S{i:03d}" for i in range(150)]
    fs.set_world(prices={sku: float(i) for i, sku in enumerate(skus)})
    handle = fs.pricing.start(skus, run_id="w-many", store=store, stop_after="S149")
    assert handle.wait(60) == "suspended"
    fs.set_world(prices={sku: float(i) + 1 for i, sku in enumerate(skus)})
    assert kx.resume("w-many", store=store).status == "needs_decision"
    rev = kx.revalidation("w-many", store=store)
    widget = render_revalidation(rev)
    assert widget.table.value.count("<tr><td>") == 150
    assert "overflow-y:auto" in widget.table.value
    assert len(widget.step_picker.options) == 150
    assert repr(widget) == rev.text()
    bundle = revalidation_mimebundle(rev)
    assert bundle["text/plain"] == rev.text()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert "150 of 150 fact(s) contradicted" in bundle["text/plain"]


# -- reconciliation ----------------------------------------------------------------------------
class Lost(BaseException):
    """Stands for the process going away in the middle of a call."""


@kx.effect
def ship(order: int, api_token: str, *, idempotency_key: str | None = None) -> dict[str, Any]:
    raise Lost


@kx.agent(name="widgets-unknowns")
def unknowns(run: kx.Run, count: int) -> None:
    with run.step("ship"):
        for order in range(count):
            try:
                ship(order, "secret-value")
            except Lost:
                continue
    raise RuntimeError("the process went away")


def waiting_on_unknowns(store: Store, run_id: str, count: int) -> kx.Handle:
    handle = unknowns.start(count, run_id=run_id, store=store)
    assert handle.wait(60) == "failed"
    resumed = kx.resume(run_id, store=store)
    assert resumed.status == "needs_decision"
    return resumed


def test_reconcile_widget_decides_the_picked_effect(store: Store) -> None:
    handle = waiting_on_unknowns(store, "w-rec", 2)
    assert revalidation_for_handle(handle) is None  # unknown effects come first
    widget = reconcile_for_handle(handle)
    assert isinstance(widget, ReconcileWidget)
    assert "***redacted***" in widget.table.value and "secret-value" not in widget.table.value
    assert "2 of 2 effect(s)" in widget.summary.value
    widget.result.value = '{"shipped": true}'
    widget.happened_button.click()
    widget.retry_button.click()
    decided = {item.decision for item in widget.rec}
    assert decided == {"applied", "not_applied"}
    assert "all decided" in widget.summary.value
    assert widget.happened_button.disabled
    rows = {str(r["key"]): r for r in store.load_effects("w-rec").values()}
    first = rows[str(widget.rec[0].key)]
    assert (first["status"], json.loads(first["result"])) == ("applied", {"shipped": True})
    assert first["decided_by"] == actor()


def test_reconcile_widget_with_many_unknowns_and_give_up(store: Store) -> None:
    waiting_on_unknowns(store, "w-rec-many", 120)
    rec = kx.reconcile("w-rec-many", store=store)
    widget = render_reconciliation(rec)
    assert widget.table.value.count("<tr><td>") == 120
    assert "overflow-y:auto" in widget.table.value
    assert len(widget.picker.options) == 120
    widget.picker.value = 5
    widget.note.value = "not worth it"
    widget.give_up_button.click()
    assert rec[5].decision == "give_up"
    assert store.get_run("w-rec-many")["status"] == "cancelled"
    assert "given up" in widget.summary.value
    assert widget.happened_button.disabled and widget.picker.disabled
    assert repr(widget) == rec.text()
    bundle = reconciliation_mimebundle(rec)
    assert bundle["text/plain"] == rec.text()


def test_result_field_parsing() -> None:
    assert parse_result("") is None
    assert parse_result(' {"a": 1} ') == {"a": 1}
    assert parse_result("sent by hand") == "sent by hand"
