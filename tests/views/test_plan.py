"""The resume plan (issue 14, part 1): what a resume would do, seen before it happens.

Runs are made the way a user meets them: real agents in worker threads on a real DuckDB
file, effects POSTing to the local delivery server, a forced stop leaving an unknown
effect, an agent redefined in the same process, and a second process resuming the run
while a preview is on screen. The store's clock runs two days ahead to age the facts.
"""

from __future__ import annotations

import argparse
import datetime as dt
import inspect
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.http_server import DeliveryServer, post_json
from support.live import finish_live_runs, name

import kernelext as kx
from kernelext._cli.plan import plan_command
from kernelext._core.encoding.names import source_hash
from kernelext._core.ledger.effect import effect_key
from kernelext._core.lifecycle.cell_runs import forget_cell_runs, open_cell_run, stop_cell_run
from kernelext._core.plan.code import remember_cell_source
from kernelext._core.plan.resume_plan import (
    STALE_AFTER,
    ResumePlan,
    check_plan,
    plan,
)
from kernelext._store import Store, open_store, utcnow
from kernelext.errors import PlanChanged
from kernelext.status import Reason, Status, StepStatus

WAIT = 60
TESTS_DIR = Path(__file__).resolve().parents[1]
PRICES = {"sku-1": 10.0}


def get_price(sku: str) -> float:
    return PRICES[sku]


def fetch_token() -> str:
    return "plan-token-value-0123456789"


class ShiftedClock:
    """Real time, moved forward on request (the facts age, the deadline comes closer)."""

    def __init__(self) -> None:
        self.offset = dt.timedelta(0)

    def __call__(self) -> dt.datetime:
        return utcnow() + self.offset


@pytest.fixture
def clock() -> ShiftedClock:
    return ShiftedClock()


@pytest.fixture
def store(store_path: Path, clock: ShiftedClock) -> Iterator[Store]:
    opened = open_store(str(store_path), clock=clock)
    kx.credentials.register("plan-token", refresh=fetch_token)
    yield opened
    finish_live_runs()
    kx.credentials.unregister("plan-token")
    opened.close()


class Suspended:
    """A run stopped by force in step ``c`` (``send`` unknown), and its agent's versions."""

    def __init__(self, store: Store, server: DeliveryServer) -> None:
        self.run_id = name("plan")
        self.agent_name = name("plan-agent")
        entered = threading.Event()

        @kx.effect(name="post")
        def post(step: str, *, idempotency_key: str | None = None) -> Any:
            url = server.url + "/post"
            return post_json(url, {"step": step}, idempotency_key=idempotency_key).body

        @kx.effect(name="send")
        def send(to: str, *, idempotency_key: str | None = None) -> Any:
            entered.set()
            while True:  # hangs until the forced stop lands
                threading.Event().wait(0.01)

        @kx.agent(name=self.agent_name)
        def first(run: kx.Run, keys: list[str]) -> None:
            for key in run.steps(keys, key=str):
                if key == "a":
                    run.fact("price:sku-1", get_price("sku-1"), check=get_price, args=("sku-1",))
                    run.fact("plan-token", fetch_token(), kind="credential")
                    run.claim(f"mail-budget-{self.run_id}", 3.0)
                post(key)
                if key == "c":
                    send("gus@example.org")

        self.first = first
        self.post = post
        handle = first.start(["a", "b", "c", "d"], run_id=self.run_id, store=store)
        assert entered.wait(WAIT)
        handle.force_stop(cut_calls=True)
        assert handle.wait(WAIT) == Status.SUSPENDED

    def redefine(self) -> kx.Agent:
        """The user edits the agent (same name) after the run stopped."""
        post = self.post

        @kx.agent(name=self.agent_name)
        def second(run: kx.Run, keys: list[str]) -> None:
            for key in run.steps(keys, key=str):
                post(key)  # the facts, the claim and the send are gone

        return second


def test_the_plan_of_a_suspended_run_item_by_item(
    store: Store, clock: ShiftedClock, delivery_server: DeliveryServer
) -> None:
    run = Suspended(store, delivery_server)
    rid = run.run_id
    before = plan(rid, store)  # previewed before the code changed: it remembers the source
    assert before.code[0].state == "same" and not before.facts[0].stale
    second = run.redefine()
    clock.offset = dt.timedelta(days=2)
    row, events = store.get_run(rid), store.events(rid)

    p = plan(rid, store)

    assert (store.get_run(rid), store.events(rid)) == (row, events), "a plan changes nothing"
    assert isinstance(p, ResumePlan) and p.run_id == rid and p.agent == run.agent_name
    assert (p.status, p.reason) == (Status.SUSPENDED, Reason.USER_STOP)
    # steps: a and b are skipped, c was cancelled by the forced stop and runs again
    assert [(s.key, s.note) for s in p.completed] == [("a", "skipped"), ("b", "skipped")]
    assert [(s.key, s.status) for s in p.rerun] == [("c", StepStatus.CANCELLED)]
    assert p.next_step is not None and p.next_step.key == "c"
    # effects: c's post is replayed from the ledger, a's and b's are skipped with their steps
    assert p.replayed == {"post": 1}
    assert p.skipped_effects == {"post": 2} and p.called_again == {}
    (unknown,) = p.unknown
    assert (unknown.tool, unknown.step_key) == ("send", "c")
    assert unknown.key == str(effect_key(rid, "c", "send", 1))  # after c's post
    assert json.loads(unknown.args or "") == {"to": "gus@example.org"}
    assert unknown.probe is False and p.in_flight == []
    # facts: recorded two days ago, past the default max age of an hour
    (fact,) = p.facts
    assert fact.name == "price:sku-1" and fact.checkable and fact.max_age_s == STALE_AFTER
    assert fact.stale and "older than its max age" in fact.why
    assert dt.timedelta(days=2) <= dt.timedelta(seconds=fact.age_s) < dt.timedelta(days=2, hours=1)
    assert [(c.name, c.refresh) for c in p.credentials] == [("plan-token", "kx.credentials")]
    # code: the agent's fingerprint changed, with a diff of what this process saw
    (code,) = p.code
    assert (code.kind, code.name, code.state) == ("agent", run.agent_name, "changed")
    assert (code.recorded, code.current) == (run.first.fingerprint, second.fingerprint)
    assert '-                    send("gus@example.org")' in code.diff
    assert [(c.resource, c.amount) for c in p.claims] == [(f"mail-budget-{rid}", 3.0)]
    # deadline: a user's stop waits 7 days; 2 of them have passed
    assert p.deadline == row["deadline"] and p.time_left is not None
    assert dt.timedelta(days=4, hours=23) < p.time_left <= dt.timedelta(days=5)
    assert (p.approvals, p.questions) == ([], [])
    assert not p.ready and len(p.blockers) == 2
    assert "1 effect(s) with an unknown outcome" in p.blockers[0]
    assert f"kx.reconcile({rid!r})" in p.blockers[0]
    assert "allow_code_change=True" in p.blockers[1]
    with pytest.raises(PlanChanged) as refused:  # previewed before the agent was edited
        check_plan(before, store)
    assert refused.value.differences == [
        f"the code of agent {run.agent_name!r} changed since the preview "
        f"({run.first.fingerprint} -> {second.fingerprint})"
    ]


def test_the_plan_renders_as_text_html_json_and_on_the_command_line(
    store: Store, clock: ShiftedClock, delivery_server: DeliveryServer, capsys: Any
) -> None:
    run = Suspended(store, delivery_server)
    clock.offset = dt.timedelta(days=2)
    p = plan(run.run_id, store)

    text = str(p)
    assert text == p.text() == repr(p)
    lines = text.splitlines()
    assert lines[0].startswith(f"Resume plan for run {run.run_id} [{run.agent_name}]: suspended")
    assert lines[1].startswith("  Blocked: 1 effect(s) with an unknown outcome")
    assert "  skipped (completed steps): 2: step 1 (a), step 2 (b)" in lines
    assert "  runs again: step 3 (c) (cancelled: runs again)" in lines
    assert "  replayed from the ledger: post ×1" in lines
    assert any(ln.startswith("  unknown effects: send(") and "step 3 (c)" in ln for ln in lines)
    assert any("price:sku-1: recorded 2 d ago, max age 1 h, STALE" in ln for ln in lines)
    assert not any(ln.rstrip().endswith(": none") for ln in lines)  # empty rows are left out
    assert "open approvals" not in text and "open questions" not in text

    page = p._repr_html_()
    assert page.startswith("<div class='kernelext-plan'") and "<script" not in page
    assert "Blocked: 1 effect(s) with an unknown outcome" in page
    assert "send({&quot;to&quot;:&quot;gus@example.org&quot;})" in page  # escaped
    assert "STALE" in page and "mail-budget-" in page
    assert ">none<" not in page and "open approvals" not in page

    data = json.loads(p.to_json())
    assert data == p.to_dict() and data["run_id"] == run.run_id and data["ready"] is False
    assert [e["tool"] for e in data["unknown"]] == ["send"]
    assert data["facts"][0]["stale"] is True and data["replayed"] == {"post": 1}
    assert 4 * 86400 < data["time_left_s"] <= 5 * 86400
    assert dt.datetime.fromisoformat(data["computed_at"]) == p.computed_at

    code = plan_command(argparse.Namespace(run_id=run.run_id, json=False), store)
    out = capsys.readouterr().out
    assert code == 0 and out.startswith(f"Resume plan for run {run.run_id}")
    code = plan_command(argparse.Namespace(run_id=run.run_id, json=True), store)
    shown = json.loads(capsys.readouterr().out)
    assert code == 0 and shown["unknown"][0]["tool"] == "send" and shown["status"] == "suspended"


@pytest.mark.skipif(
    "needs_approval" not in inspect.signature(kx.effect).parameters,
    reason="approvals are not part of this release",
)
def test_the_plan_lists_an_open_approval(store: Store) -> None:
    rid = name("plan-approval")
    pay = kx.effect(name="pay", needs_approval=True)(lambda to, amount: {"paid": amount})

    @kx.agent(name=name("plan-approval"))
    def payer(run: kx.Run) -> None:
        with run.step("quote"):
            run.state["quoted"] = 120
        with run.step("pay"):
            pay("acme", 120)

    handle = payer.start(run_id=rid, store=store)
    assert handle.wait(WAIT) == Status.SUSPENDED
    p = plan(rid, store)
    assert p.reason == Reason.APPROVAL and [s.key for s in p.completed] == ["quote"]
    (request,) = p.approvals
    assert request.kind == "approval" and request.summary == "pay in step 2 (pay)"
    assert request.row["tool"] == "pay" and request.row["decision"] is None
    assert p.blockers == [f"1 open approval request(s): decide with kx.approvals({rid!r})"]
    assert "open approvals: pay in step 2 (pay)" in p.text()


@kx.agent(name="plan-resumed-elsewhere")
def resumed_elsewhere(run: kx.Run, keys: list[str], pauses: list[str]) -> None:
    """Suspends itself after each step listed in ``pauses``."""
    for key in run.steps(keys, key=str):
        run.state[key] = True
        if key in pauses:
            run.suspend(Reason.OTHER)


RESUME_ELSEWHERE = """
import sys
sys.path.insert(0, {tests!r})
import kernelext as kx
import test_plan  # defines the agent, as the other notebook's cell did
store = kx.open_store({store!r})
handle = kx.resume({run_id!r}, store=store)
print(handle.wait(60))
store.close()
"""


def test_a_plan_is_refused_after_another_process_resumed_the_run(
    store: Store, store_path: Path
) -> None:
    rid = name("plan-elsewhere")
    handle = resumed_elsewhere.start(["a", "b", "c", "d", "e"], ["b", "d"], run_id=rid, store=store)
    assert handle.wait(WAIT) == Status.SUSPENDED
    p = plan(rid, store)
    assert p.ready and [s.key for s in p.completed] == ["a", "b"]
    assert (
        p.next_step is not None and p.next_step.note == "step 3 of 5: the first item not completed"
    )
    assert check_plan(p, store).completed == p.completed  # nothing changed: accepted

    # Another notebook resumes the run meanwhile; it runs c and d and suspends again.
    here = Path(__file__).resolve().parent  # this module defines the agent
    code = RESUME_ELSEWHERE.format(tests=str(here), store=str(store_path), run_id=rid)
    env = {**os.environ, "PYTHONPATH": str(TESTS_DIR)}
    child = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert child.returncode == 0 and child.stdout.strip() == "suspended", child.stderr

    with pytest.raises(PlanChanged) as refused:
        check_plan(p, store)
    message = str(refused.value)
    assert f"Run {rid!r} changed since its plan was previewed" in message
    assert f"resumed 1 time(s) in between, by {refused.value.plan.owner}" in message
    assert "2 step(s) completed since: c, d" in message
    assert "Nothing was run" in message and f"kx.plan({rid!r})" in message
    assert refused.value.plan.owner != p.owner and "status" not in refused.value.differences[0]
    with pytest.raises(PlanChanged):
        p.verify(store)
    before = store.events(rid)
    with pytest.raises(PlanChanged):  # kx.resume as previewed: refused, nothing runs
        kx.resume(rid, plan=p, store=store)
    assert store.events(rid) == before and store.get_run(rid)["status"] == Status.SUSPENDED
    assert [s.key for s in plan(rid, store).completed] == ["a", "b", "c", "d"]


def test_a_plan_is_refused_after_a_new_unknown_effect(store: Store) -> None:
    rid = name("plan-unknown")
    entered = threading.Event()

    @kx.effect(name="send")
    def send(to: str) -> None:
        entered.set()
        while True:
            threading.Event().wait(0.01)

    @kx.agent(name=name("plan-unknown"))
    def mailer(run: kx.Run) -> None:
        with run.step("a"):
            run.state["a"] = 1
        with run.step("b"):
            send("gus@example.org")

    handle = mailer.start(run_id=rid, store=store)
    assert entered.wait(WAIT)
    assert handle.stop() == Status.STOPPING  # the step hangs: the stop stays pending
    p = plan(rid, store)  # previewed while the stop is pending
    assert p.status == Status.STOPPING and p.unknown == []
    assert [e.tool for e in p.in_flight] == ["send"]
    assert p.blockers == ["the run is executing in this process"]
    handle.force_stop(cut_calls=True)
    assert handle.wait(WAIT) == Status.SUSPENDED

    with pytest.raises(PlanChanged) as refused:
        check_plan(p, store)
    assert refused.value.differences[:2] == [
        "status stopping -> suspended",
        "1 new effect(s) with an unknown outcome: send in step 2 (b)",
    ]
    fresh = refused.value.plan
    assert [e.tool for e in fresh.unknown] == ["send"] and fresh.in_flight == []
    assert check_plan(fresh, store).unknown == fresh.unknown  # the new preview holds


def test_the_plan_of_an_agent_cell_run_shows_which_cells_changed(store: Store) -> None:
    rid = name("plan-cells")
    old, new = "x = 1\nrun.state['x'] = x", "x = 2\nrun.state['x'] = x"
    try:
        cell = open_cell_run(rid, store=store)
        remember_cell_source(rid, "cell:one", old)
        assert cell.run_step("cell:one", source_hash(old), lambda: None).kind == "completed"
        remember_cell_source(rid, "cell:two", "print('two')")  # seen, not run yet
        assert stop_cell_run(rid, store=store) == Status.SUSPENDED
        remember_cell_source(rid, "cell:one", new)  # the user edits the first cell

        p = plan(rid, store)
    finally:
        forget_cell_runs(rid)
    assert p.agent == "%%agent" and p.status == Status.SUSPENDED
    (done,) = p.completed
    assert (done.key, done.note) == ("cell:one", "source changed: reported, not re-run")
    assert p.next_step is not None and p.next_step.key == "cell:two"
    (change,) = p.code
    assert (change.kind, change.name, change.state) == ("cell", "cell:one", "changed")
    assert (change.recorded, change.current) == (source_hash(old), source_hash(new))
    assert change.diff.splitlines() == [
        "@@ -1,2 +1,2 @@",
        "-x = 1",
        "+x = 2",
        " run.state['x'] = x",
    ]
    assert "diff of cell 'cell:one':" in p.text() and p.code_changed


def test_the_panel_of_a_waiting_run_shows_its_plan_collapsed_under_the_buttons(
    store: Store, delivery_server: DeliveryServer
) -> None:
    from kernelext.widgets import _addons as addons
    from kernelext.widgets import _plan as plan_widget
    from kernelext.widgets._panel import ControlPanel

    run = Suspended(store, delivery_server)
    handle = kx.resume(run.run_id, store=store)  # stops at once for the unknown send
    assert handle.status == Status.NEEDS_DECISION
    addons.install()
    try:
        panel = ControlPanel(handle)
    finally:
        addons.install()  # every add-on in place for the next test, whatever this one did
    try:
        (preview,) = [a for a in panel.addons.children if isinstance(a, plan_widget.PlanPreview)]
        rows = list(panel.children)
        buttons = next(r for r in rows if panel.resume_button in getattr(r, "children", ()))
        assert rows.index(buttons) < rows.index(panel.addons), "the buttons never move"
        assert preview.section.selected_index is None, "collapsed until opened"
        assert preview.section.get_title(0).startswith("Resume plan: ")
    finally:
        panel.detach()
    shown = plan_widget.previewed_plan(panel)
    assert isinstance(shown, ResumePlan) and shown.status == Status.NEEDS_DECISION
    assert preview.layout.display is None
    assert preview.body.value == shown._repr_html_()
    assert "unknown effects" in preview.body.value and "send(" in preview.body.value
    assert preview.refresh() is shown, "not computed again while nothing changed"
    assert preview.refresh(force=True) is not shown
