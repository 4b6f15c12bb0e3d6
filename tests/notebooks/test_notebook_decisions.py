"""Deciding from the notebook: the decision widgets in the control panel, the extension's
renderers, and notebooks/revalidation.ipynb and notebooks/reconcile_unknowns.ipynb.

In-process tests drive real runs in a real store with ``button.click()`` (as in
test_panel.py). The notebook tests run real kernels through nbclient with
``store_widget_state=True``; the reconciliation test kills the kernel in the middle of
a call and counts what reached the local HTTP server.
"""

from __future__ import annotations

import contextlib
import copy
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from IPython.core.interactiveshell import InteractiveShell
from support.clicks import with_clicks
from support.http_server import DeliveryServer
from support.kernels import KernelDied, KernelSession
from support.notebooks import execute, text_of

import kernelext as kx
from kernelext._core.process.runtime import runtime
from kernelext._ipython import extension
from kernelext.widgets import NEEDS_DECISION_WIDGETS, ControlPanel, panel_for
from kernelext.widgets import _addons as addons
from kernelext.widgets import _decisions as decisions
from kernelext.widgets._reconcile import ReconcileWidget
from kernelext.widgets._revalidation import RevalidationWidget

REPO_ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO_ROOT / "notebooks"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


# -- a small world for the in-process runs ----------------------------------------------
PRICES: dict[str, float] = {}
LOSE: set[str] = set()  # orders whose call is "lost" mid-way (outcome unknown)
SHIPPED: list[str] = []


def price_of(sku: str) -> float:
    """A named check: resolvable by its qualified name."""
    return PRICES[sku]


class Lost(BaseException):
    """Stands for the process going away in the middle of a call."""


@kx.effect
def ship(order: str, *, idempotency_key: str | None = None) -> dict[str, str]:
    if order in LOSE:
        raise Lost
    SHIPPED.append(order)
    return {"order": order}


@kx.agent(name="panel-decisions")
def dispatch(run: kx.Run, orders: list[str], pause_after: str | None = None) -> int:
    with run.step("quote"):
        run.fact("price:A", price_of("A"), check=price_of, args=("A",))
    for order in run.steps(orders, key=str):
        ship(order)
        if order == pause_after:
            run.suspend("user_stop")
    return len(orders)


@pytest.fixture
def store(store_path: Path) -> Iterator[Any]:
    PRICES.clear()
    PRICES["A"] = 10.0
    LOSE.clear()
    SHIPPED.clear()
    opened = kx.open_store(str(store_path))
    addons.install()
    yield opened
    addons.install()
    with runtime().live_lock:
        handles = list(runtime().live_runs.values())
    for handle in handles:
        if handle.alive:
            handle.wait(30)
    runtime().settings.close()
    runtime().settings.use_store(None)


def slot_widget(panel: ControlPanel) -> Any:
    panel.refresh()
    children = panel.decision_slot.children
    assert len(children) == 1, children
    return children[0]


def test_install_registers_the_factories_once() -> None:
    addons.uninstall()
    assert not addons.installed()
    addons.install()
    addons.install()
    assert NEEDS_DECISION_WIDGETS.count(decisions.reconciliation_for_panel) == 1
    assert NEEDS_DECISION_WIDGETS.count(decisions.revalidation_for_panel) == 1
    addons.uninstall()
    assert not addons.installed()
    addons.install()


def test_unknowns_then_contradiction_decided_in_one_panel(store: Any) -> None:
    """Both kinds of decision on one run, in the stated order: unknown effects first
    (the ledger is consulted before facts are re-checked), then the facts."""
    LOSE.add("A-2")
    assert dispatch.start(["A-1", "A-2", "A-3"], run_id="both").wait(30) == "failed"
    PRICES["A"] = 12.5  # the world moved on meanwhile
    handle = kx.resume("both")
    assert handle.status == "needs_decision"
    panel = panel_for(handle)

    widget = slot_widget(panel)
    assert isinstance(widget, ReconcileWidget)  # unknowns come first
    assert decisions.decision_widget(panel) is widget
    assert "1 of 1 effect(s)" in widget.summary.value
    LOSE.clear()
    widget.retry_button.click()  # "It did not happen — retry": the panel resumes the run
    assert panel.handle is not handle
    assert panel.handle.status == "needs_decision"  # now the facts: price:A changed

    widget = slot_widget(panel)
    assert isinstance(widget, RevalidationWidget)
    assert "price:A" in widget.table.value and "changed" in widget.table.value
    widget.note.value = "new price is fine"
    widget.accept_button.click()  # the run goes on from the same panel
    assert panel.handle.wait(30) == "completed"
    panel.refresh()
    assert panel.decision_slot.children == ()
    assert "completed" in panel.outcome.value
    assert SHIPPED == ["A-1", "A-2", "A-3"]  # the retried call once, nothing twice

    events = store.events("both")
    kinds = [e["kind"] for e in events]
    assert kinds.index("effect_decided") < kinds.index("revalidation_decision")
    decision = next(e for e in events if e["kind"] == "revalidation_decision")
    assert (decision["source"], decision["reason"]) == ("widget", "new price is fine")
    assert decision["actor"] and decision["occurred_at"] is not None
    facts = {r["name"]: r for r in store.facts("both")}
    assert json.loads(facts["price:A"]["value"]) == 12.5


def test_it_happened_with_a_result_resumes_past_the_call(store: Any) -> None:
    LOSE.add("A-1")
    assert dispatch.start(["A-1", "A-2"], run_id="happened").wait(30) == "failed"
    panel = panel_for(kx.resume("happened"))
    widget = slot_widget(panel)
    assert isinstance(widget, ReconcileWidget)
    widget.result.value = '{"order": "A-1"}'
    widget.happened_button.click()
    assert panel.handle.wait(30) == "completed"
    assert SHIPPED == ["A-2"]  # A-1 was not called again: its decided result was replayed
    statuses = {r["step_key"]: r["status"] for r in store.load_effects("happened").values()}
    assert statuses == {"A-1": "applied", "A-2": "applied"}


def test_panel_waits_until_every_unknown_is_decided_and_give_up_cancels(store: Any) -> None:
    @kx.effect
    def two_calls(order: str) -> None:
        raise Lost

    @kx.agent(name="panel-two-unknowns")
    def both_lost(run: kx.Run) -> None:
        with run.step("one"):
            for order in ("x", "y"):
                try:
                    two_calls(order)
                except Lost:
                    continue
        raise RuntimeError("the process went away")

    assert both_lost.start(run_id="two").wait(30) == "failed"
    handle = kx.resume("two")
    panel = panel_for(handle)
    widget = slot_widget(panel)
    widget.retry_button.click()  # one of two decided: nothing resumes yet
    assert panel.handle is handle and handle.status == "needs_decision"
    assert isinstance(slot_widget(panel), ReconcileWidget)
    widget.give_up_button.click()
    assert panel.handle is handle
    panel.refresh()
    assert store.get_run("two")["status"] == "cancelled"
    assert panel.decision_slot.children == () and "cancelled" in panel.header.value


def test_abort_from_the_panel_cancels_and_replan_follows(store: Any) -> None:
    for run_id in ("abort", "replan"):
        started = dispatch.start(["A-1", "A-2"], run_id=run_id, pause_after="A-1")
        assert started.wait(30) == "suspended"
    PRICES["A"] = 11.0
    aborting = panel_for(kx.resume("abort"))
    widget = slot_widget(aborting)
    assert isinstance(widget, RevalidationWidget)
    widget.abort_button.click()
    aborting.refresh()
    assert store.get_run("abort")["status"] == "cancelled"
    assert aborting.decision_slot.children == () and "cancelled" in aborting.header.value

    shipped = list(SHIPPED)
    replanning = panel_for(kx.resume("replan"))
    before = replanning.handle
    widget = slot_widget(replanning)
    assert isinstance(widget, RevalidationWidget)
    widget.step_picker.value = 1  # re-plan from step A-1: its call is replayed, not repeated
    widget.replan_button.click()
    assert replanning.handle is not before  # the panel follows the re-planned run
    assert replanning.handle.wait(30) == "suspended"  # pause_after="A-1" applies again
    assert shipped == SHIPPED


# -- the extension's renderers ---------------------------------------------------------------
@pytest.fixture
def ip(store: Any) -> Iterator[InteractiveShell]:
    shell = InteractiveShell.instance()
    runtime().settings.use_store(store)
    addons.uninstall()  # the extension installs them itself
    shell.run_line_magic("load_ext", "kernelext")
    yield shell
    shell.run_line_magic("unload_ext", "kernelext")
    for name in ("h", "rec", "rev"):
        shell.user_ns.pop(name, None)


def test_extension_displays_reconcile_and_revalidation_as_widgets(ip: InteractiveShell) -> None:
    assert runtime().settings.reconcile_renderer is extension.reconciliation_bundle
    assert runtime().settings.revalidation_renderer is extension.revalidation_bundle
    LOSE.add("A-1")
    assert dispatch.start(["A-1"], run_id="shown").wait(30) == "failed"
    kx.resume("shown")

    data, _ = ip.display_formatter.format(kx.reconcile("shown"))
    assert WIDGET_VIEW in data and "1 effect(s) with an unknown outcome" in data["text/plain"]
    data, _ = ip.display_formatter.format(kx.revalidation("shown"))
    assert WIDGET_VIEW in data and data["text/plain"].startswith("Run shown: needs_decision")

    assert addons.installed()  # the panel module is in use: installed at load
    ip.user_ns["h"] = kx.resume("shown")
    data, _ = ip.display_formatter.format(ip.user_ns["h"])
    assert WIDGET_VIEW in data
    assert isinstance(slot_widget(panel_for(ip.user_ns["h"])), ReconcileWidget)

    ip.run_line_magic("unload_ext", "kernelext")
    assert (
        runtime().settings.reconcile_renderer is None
        and runtime().settings.revalidation_renderer is None
    )
    assert not addons.installed()
    assert ip.display_formatter.format(kx.reconcile("shown"))[0].keys() == {"text/plain"}
    ip.run_line_magic("load_ext", "kernelext")  # for the fixture's unload


# -- notebooks through nbclient ------------------------------------------------------------------
def widget_state(nb: Any) -> str:
    return json.dumps(nb.metadata["widgets"][WIDGET_STATE]["state"], ensure_ascii=False)


def store_texts(store_path: Path) -> Iterator[tuple[str, str, str]]:
    """(table, column, value) for every text and blob value in the store."""
    import duckdb

    con = duckdb.connect(str(store_path), read_only=True)
    try:
        columns = con.execute(
            "SELECT table_name, column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = 'main'"
        ).fetchall()
        for table, column, kind in columns:
            if kind not in ("VARCHAR", "BLOB", "JSON"):
                continue
            for (value,) in con.execute(f'SELECT "{column}" FROM "{table}"').fetchall():
                if value is None:
                    continue
                text = value.decode("latin-1") if isinstance(value, bytes) else str(value)
                yield table, column, text
    finally:
        con.close()


@pytest.mark.slow
def test_revalidation_notebook(
    store_path: Path, tmp_path: Path, delivery_server: DeliveryServer
) -> None:
    nb = with_clicks(nbformat.read(NOTEBOOKS / "revalidation.ipynb", as_version=4), "revalidation")
    env = {
        "KERNELEXT_STORE": str(store_path),
        "KERNELEXT_DEMO_OUTBOX": delivery_server.url + "/outbox",
    }
    execute(nb, env, tmp_path)

    assert "suspended: waiting for an approval" in text_of(nb, "start")
    resumed = text_of(nb, "resume")
    assert resumed.startswith("needs_decision") and "price:flour changed" in resumed
    assert "price:flour: recorded 2.4, current 2.65" in text_of(nb, "side-by-side")
    assert text_of(nb, "click-accept").startswith("completed")
    state = widget_state(nb)
    assert "kernelext-revalidation" in state and '"description": "Accept and continue"' in state
    assert "Accepted — run is now running" in state or "Accepted — run is now completed" in state

    import duckdb

    con = duckdb.connect(str(store_path), read_only=True)
    try:
        (run_id, status) = con.execute("SELECT id, status FROM runs").fetchone() or ("", "")
        facts = dict(con.execute("SELECT name, value FROM facts WHERE kind = 'value'").fetchall())
        credential = con.execute(
            "SELECT value, fingerprint, check_status FROM facts WHERE kind = 'credential'"
        ).fetchall()
        decided = con.execute(
            "SELECT actor, occurred_at, source, reason FROM events "
            "WHERE kind = 'revalidation_decision'"
        ).fetchall()
    finally:
        con.close()
    assert status == "completed", run_id
    assert json.loads(facts["price:flour"]) == 2.65  # the accepted value is the fact now
    assert json.loads(facts["price:sugar"]) == 1.1
    [(value, fingerprint, check)] = credential
    assert value is None and fingerprint.startswith("sha256:") and check == "refreshed"
    [(who, when, source, note)] = decided
    assert who and when is not None and source == "widget"
    assert note == "flour is dearer; still within the approved budget"

    texts = list(store_texts(store_path))
    assert any(table == "facts" and text == "price:flour" for table, _, text in texts)
    assert any(table == "snapshots" for table, _, _ in texts)  # the scan sees every table
    leaks = [(table, column) for table, column, text in texts if "sk-demo-" in text]
    assert leaks == []  # no token, in any text or blob column of any table
    for path in store_path.parent.rglob("*"):
        if path.is_file():
            assert b"sk-demo-" not in path.read_bytes(), path  # nor in any file of the store

    delivery_server.settle()
    orders = sorted(d["body"]["sku"] for d in delivery_server.deliveries)
    assert orders == ["flour", "sugar", "yeast"]
    flour = next(d["body"] for d in delivery_server.deliveries if d["body"]["sku"] == "flour")
    assert flour["unit_price"] == 2.65


# The kernel that runs the agent dies in the middle of the second call, either once the
# carrier got the parcel (before the answer was recorded) or before it was handed over.
DIE_MID_CALL = """
import os as _os
_carrier_post = carrier_post

def carrier_post(parcel, key):
    if parcel["order"] == "A-101" and {before!r}:
        _os._exit(1)  # the kernel dies before handing the parcel over
    receipt = _carrier_post(parcel, key)
    if parcel["order"] == "A-101":
        _os._exit(1)  # the kernel dies after the carrier got it, before the answer is recorded
    return receipt
"""


def cells_tagged(nb: Any, *tags: str) -> list[Any]:
    return [c for c in nb.cells if set(c.metadata.get("tags", [])) & set(tags)]


@pytest.mark.slow
@pytest.mark.crash
@pytest.mark.parametrize("when", ["after-delivery", "before-delivery"])
def test_reconcile_notebook_after_a_kernel_death(
    when: str, store_path: Path, tmp_path: Path, delivery_server: DeliveryServer
) -> None:
    nb = nbformat.read(NOTEBOOKS / "reconcile_unknowns.ipynb", as_version=4)
    env = {
        "KERNELEXT_STORE": str(store_path),
        "KERNELEXT_DEMO_OUTBOX": delivery_server.url + "/outbox",
        "KERNELEXT_DEMO_STEP_SECONDS": "0.05",
    }
    with KernelSession(env) as first:
        for cell in cells_tagged(nb, "setup"):
            first.run(cell.source).ok()
        first.run(DIE_MID_CALL.format(before=when == "before-delivery")).ok()
        (start,) = cells_tagged(nb, "start")
        # The agent may reach the second call before the cell's reply goes out.
        with contextlib.suppress(KernelDied):
            first.run(start.source).ok()
        deadline = time.monotonic() + 60
        while first.km.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not first.km.is_alive(), "the kernel did not die mid-call"
    delivery_server.settle()
    before = [d["body"]["order"] for d in delivery_server.deliveries]
    assert before == (["A-100", "A-101"] if when == "after-delivery" else ["A-100"])

    fresh = copy.deepcopy(nb)
    fresh.cells = cells_tagged(fresh, "setup", "reconcile")
    fresh = with_clicks(fresh, "reconcile_unknowns")  # the person's decisions in the panel
    execute(fresh, env, tmp_path)

    assert "needs_decision" in text_of(fresh, "resume")
    decided = [line for line in text_of(fresh, "decide").splitlines() if line.strip()]
    expected = "applied" if when == "after-delivery" else "not_applied"
    assert decided[:2] == [f"ship A-101: {expected}", "completed"]  # decided, then resumed
    assert "parcels per order: {'A-100': 1, 'A-101': 1, 'A-102': 1, 'A-103': 1}" in text_of(
        fresh, "check"
    )
    state = widget_state(fresh)
    assert "kernelext-reconcile" in state and "It did not happen — retry" in state

    delivery_server.settle()
    per_order: dict[str, int] = {}
    for delivery in delivery_server.deliveries:
        order = delivery["body"]["order"]
        per_order[order] = per_order.get(order, 0) + 1
    assert per_order == {"A-100": 1, "A-101": 1, "A-102": 1, "A-103": 1}  # each exactly once
    keys = [d["idempotency_key"] for d in delivery_server.deliveries]
    assert len(set(keys)) == len(keys) == 4
