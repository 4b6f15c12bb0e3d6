"""Approvals bound to the exact call (issue 13): ``@kx.effect(needs_approval=...)``.

Each test drives real runs on a real DuckDB store; payments go to the real local HTTP
server (``delivery_server``), which counts every delivery, so "sent once" and "not
sent" are read from the receiving side. The crash tests SIGKILL worker processes
(tests/crash/approval_worker.py) in each window of an approved call. Time: about 60 s
(the crash tests and the notebook take most of it).
"""

from __future__ import annotations

import datetime as dt
import getpass
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ipywidgets as w
import pytest
from crash import CRASH_DIR, Worker, WorkerPool
from IPython.core.interactiveshell import InteractiveShell
from support.http_server import DeliveryServer, post_json
from support.live import finish_live_runs, name
from support.notebooks import execute, text_of
from support.shells import cell_shell

import kernelext as kx
from kernelext._core.process.runtime import runtime
from kernelext._store import Store, open_store

WAIT = 60.0
REPO = Path(__file__).resolve().parents[2]


def payments(server: DeliveryServer, rule: Any = True, plan: dict[str, int] | None = None) -> Any:
    """A payment agent: one step per payee; ``plan`` (read at call time) overrides amounts."""

    @kx.effect(needs_approval=rule)
    def pay(
        to: str, amount: int, *, api_key: str | None = None, idempotency_key: str | None = None
    ) -> Any:
        body = {"to": to, "amount": amount}
        return post_json(server.url + "/pay", body, idempotency_key=idempotency_key).body

    @kx.effect
    def notify(to: str, text: str) -> Any:
        return post_json(server.url + "/notify", {"to": to, "text": text}).body

    @kx.agent(name=name("payer"))
    def payer(run: kx.Run, items: list[list[Any]]) -> dict[str, Any]:
        for to, amount in run.steps(items, key=lambda item: item[0]):
            amount = (plan or {}).get(to, amount)
            try:
                run.state[to] = pay(to, amount, api_key="sk-live-0123456789")["delivery"]
            except kx.EffectRejected as exc:  # another path: tell the payee
                run.state[to] = f"declined: {exc.note}"
                notify(to, f"payment of {amount} declined")
        return dict(run.state)

    return payer


def amounts(server: DeliveryServer, path: str = "/pay") -> list[int]:
    return [d["body"]["amount"] for d in server.deliveries if d["path"] == path]


def rows(store: Store, run_id: str) -> list[dict[str, Any]]:
    return store.approval_rows(run_id=run_id)


# -- the main path ------------------------------------------------------------------------
def test_a_call_that_needs_approval_waits_is_approved_and_is_sent_once(
    store: Store, delivery_server: DeliveryServer
) -> None:
    run_id = name("pay")
    payer = payments(delivery_server, rule=lambda to, amount, **kw: amount > 100)
    handle = payer.start([["ann", 40], ["bob", 500]], run_id=run_id)
    assert handle.wait(WAIT) == "suspended"
    assert amounts(delivery_server) == [40]  # small payments need nobody; bob's is not sent
    run = store.get_run(run_id)
    assert run["reason"] == "approval"

    [request] = kx.approvals(run_id)
    assert (request.tool, request.step, request.run_id) == ("pay", "bob", run_id)
    assert request.arguments == {"to": "bob", "amount": 500, "api_key": "***redacted***"}
    assert request.expires_at == run["deadline"]  # the approval expires with the run
    assert "sk-live" not in json.dumps(
        kx.sql("SELECT * FROM approvals").astype(str).values.tolist()
    )

    resumed = request.approve(note="invoice 7 checked")
    assert resumed is not None, "the run is this process's: approving resumes it"
    assert resumed.wait(WAIT) == "completed"
    assert amounts(delivery_server) == [40, 500]
    [row] = rows(store, run_id)
    assert (row["decision"], row["note"]) == ("approved", "invoice 7 checked")
    assert row["actor"].startswith(getpass.getuser() + "@")
    assert row["consumed_at"] is not None and row["decided_at"] <= row["consumed_at"]
    [decided] = [e for e in store.events(run_id) if e["kind"] == "approval_decided"]
    assert (decided["actor"], decided["reason"]) == (row["actor"], "invoice 7 checked")
    table = kx.sql(
        "SELECT tool, step, decision, consumed_at IS NOT NULL AS used FROM approvals"
        " WHERE run_id = ?",
        [run_id],
    )
    assert table.to_dict("records") == [
        {"tool": "pay", "step": "bob", "decision": "approved", "used": True}
    ]


def test_an_approval_is_bound_to_the_arguments_it_was_given_for(
    store: Store, delivery_server: DeliveryServer
) -> None:
    plan = {"carol": 500}
    run_id = name("bound")
    assert payments(delivery_server, plan=plan).start([["carol", 0]], run_id=run_id).wait(WAIT) == (
        "suspended"
    )
    [first] = kx.approvals(run_id)
    assert first.approve(resume=False) is None
    plan["carol"] = 550  # the agent re-plans before the approved call is made
    assert kx.resume(run_id).wait(WAIT) == "suspended"  # a new request, nothing sent
    assert amounts(delivery_server) == []
    [second] = kx.approvals(run_id)
    assert second.id != first.id and second.key == first.key
    assert second.arguments["amount"] == 550
    old = next(r for r in rows(store, run_id) if r["id"] == first.id)
    assert old["decision"] == "approved" and old["consumed_at"] is None
    assert old["superseded_at"] is not None  # the approval of 500 can never be used
    with pytest.raises(kx.LedgerError, match="replaced"):
        first.approve()
    assert second.approve().wait(WAIT) == "completed"
    assert amounts(delivery_server) == [550]


def test_a_rejection_raises_effect_rejected_at_the_call_and_the_agent_goes_another_way(
    store: Store, delivery_server: DeliveryServer
) -> None:
    run_id = name("reject")
    payer = payments(delivery_server)
    assert payer.start([["dan", 900]], run_id=run_id).wait(WAIT) == "suspended"
    [request] = kx.approvals(run_id)
    handle = request.reject(note="over budget")
    assert handle.wait(WAIT) == "completed"
    assert handle.result == {"dan": "declined: over budget"}
    assert amounts(delivery_server) == []  # never sent
    assert [d["body"]["to"] for d in delivery_server.deliveries if d["path"] == "/notify"] == [
        "dan"
    ]
    ledger = kx.sql("SELECT tool FROM effects WHERE run_id = ?", [run_id])
    assert ledger["tool"].tolist() == ["notify"]  # the rejected call has no intent at all
    [row] = rows(store, run_id)
    assert (row["decision"], row["consumed_at"]) == ("rejected", None)


def test_deciding_twice_a_used_request_or_an_unknown_one_is_refused_clearly(
    store: Store, delivery_server: DeliveryServer
) -> None:
    approve, reject = kx.approve, kx.reject  # by request id or effect key

    run_id = name("twice")
    assert payments(delivery_server).start([["eve", 300]], run_id=run_id).wait(WAIT) == (
        "suspended"
    )
    [request] = kx.approvals(run_id)
    assert request.approve(resume=False) is None
    with pytest.raises(kx.LedgerError, match=r"already approved by .*decided once"):
        request.approve()
    with pytest.raises(kx.LedgerError, match="already approved"):
        reject(request.id)
    assert kx.resume(run_id).wait(WAIT) == "completed"
    with pytest.raises(kx.LedgerError, match=r"its call used it .* allows one call"):
        approve(request.key)  # by the effect's key, as `kernelext approve KEY` does
    with pytest.raises(kx.LedgerError, match="No approval request with id or effect key"):
        approve(uuid.uuid4())
    with pytest.raises(kx.LedgerError, match="No approval request matches 'zzz'"):
        approve("zzz")
    assert amounts(delivery_server) == [300]
    assert len([e for e in store.events(run_id) if e["kind"] == "approval_decided"]) == 1


def test_a_stop_while_waiting_keeps_the_request_and_a_resume_asks_no_second_time(
    store: Store, delivery_server: DeliveryServer
) -> None:
    run_id = name("stopped")
    assert payments(delivery_server).start([["fay", 250]], run_id=run_id).wait(WAIT) == (
        "suspended"
    )
    [request] = kx.approvals(run_id)
    deadline = store.get_run(run_id)["deadline"]
    assert kx.stop(run_id) == "suspended"
    assert [r.id for r in kx.approvals(run_id)] == [request.id]  # still open
    assert kx.resume(run_id).wait(WAIT) == "suspended"  # resumed undecided: waits again
    run = store.get_run(run_id)
    assert (run["reason"], run["deadline"]) == ("approval", deadline)
    assert [r["id"] for r in rows(store, run_id)] == [request.id]  # no second request
    assert amounts(delivery_server) == []
    assert request.approve().wait(WAIT) == "completed"
    assert amounts(delivery_server) == [250]


def test_a_decision_from_another_process_waits_for_the_next_resume(
    store: Store, store_path: Path, delivery_server: DeliveryServer
) -> None:
    run_id = name("elsewhere")
    assert payments(delivery_server).start([["gus", 120]], run_id=run_id).wait(WAIT) == (
        "suspended"
    )
    script = (
        "import sys, kernelext as kx\n"
        "from kernelext._core.people.approvals import approvals\n"
        "store = kx.open_store(sys.argv[1])\n"
        "[request] = approvals(sys.argv[2], store=store)\n"
        "print(request.approve(note='from a terminal'))\n"
        "print(store.get_run(sys.argv[2])['status'])\n"
        "store.close()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(store_path), run_id],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stdout.split() == ["None", "suspended"]  # not that process's run
    assert amounts(delivery_server) == []
    assert kx.resume(run_id).wait(WAIT) == "completed"
    assert amounts(delivery_server) == [120]
    assert rows(store, run_id)[0]["note"] == "from a terminal"


def test_a_decision_goes_on_through_the_hook_control_installs_at_import() -> None:
    """approvals and questions never import control (the lifecycle above them): a decision
    goes on through ``waiting.go_on``, which ``control`` fills as soon as kernelext loads,
    whichever module a process imports first."""
    script = (
        "import kernelext._core.people.questions\n"
        "from kernelext._core.lifecycle import control\n"
        "from kernelext._core.people import waiting\n"
        "print(waiting._GO_ON is control.resume_if_here)\n"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True"]


def test_effect_declares_its_approval_rule_and_its_probe() -> None:
    probes = pytest.importorskip("kernelext._core.ledger.probes")

    def lookup(key: str, args: Any) -> str | None:
        return None

    tool = name("probed")
    try:
        made = kx.effect(name=tool, probe=lookup, needs_approval=True)(lambda: None)
        assert probes.probe_for(tool) is lookup
        assert "needs approval" in repr(made)
    finally:
        probes.unregister_probe(tool)
    with pytest.raises(TypeError, match=r"needs_approval=.* takes True/False or a function"):
        kx.effect(needs_approval="yes")(lambda: None)  # type: ignore[call-overload]


# -- the panel ---------------------------------------------------------------------------------
def test_the_panel_shows_the_request_and_its_approve_button_sends_once(
    store: Store, delivery_server: DeliveryServer
) -> None:
    from kernelext.widgets import _addons as addons
    from kernelext.widgets import _approvals as widgets
    from kernelext.widgets._panel import ControlPanel

    addons.install()
    try:
        run_id = name("panel")
        handle = payments(delivery_server).start([["kim", 450]], run_id=run_id)
        assert handle.wait(WAIT) == "suspended"
        bundle = widgets.approvals_mimebundle(kx.approvals(run_id))  # kx.approvals() shown
        assert "application/vnd.jupyter.widget-view+json" in bundle
        assert "1 approval request(s) waiting" in bundle["text/plain"]
        panel = ControlPanel(handle)
        [box] = [a for a in panel.requests.children if isinstance(a, widgets.ApprovalsBox)]
        [card] = box.cards
        assert isinstance(card, widgets.ApprovalCard)
        assert "kernelext-approval" in card._dom_classes
        assert "kernelext-approve" in card.approve_button._dom_classes
        assert (
            " · step 1 (kim) · " in card.header.value and "expires in 2 d 23 h" in card.header.value
        )
        assert "***redacted***" in card.args.value and "sk-live" not in card.args.value
        card.note.value = "ok by phone"
        card.approve_button.click()
        assert panel.handle is not handle  # the panel follows the resumed run
        assert panel.handle.wait(WAIT) == "completed"
        card.approve_button.click()  # a second click: refused, shown, nothing sent
        assert amounts(delivery_server) == [450]
        assert rows(store, run_id)[0]["note"] == "ok by phone"
        panel.refresh()
        [box] = [a for a in panel.requests.children if isinstance(a, widgets.ApprovalsBox)]
        assert box.cards == ()  # nothing waits any more
        panel.detach()
    finally:
        addons.install()  # every add-on in place for the next test, whatever this one did


def test_question_cards_fit_their_schema_and_answer_resumes(store: Store) -> None:
    from kernelext.widgets import _approvals as widgets

    form = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "nights": {"type": "integer", "minimum": 1}},
        "required": ["city", "nights"],
    }

    @kx.agent(name=name("booker"))
    def booker(run: kx.Run) -> Any:
        return [
            run.ask("Which room?", schema=["single", "double"], default="double"),
            run.ask("Breakfast?", schema=bool),
            run.ask("Where and how long?", schema=form),
        ]

    run_id = name("booking")
    handle = booker.start(run_id=run_id)
    for value in ("single", True, {"city": "Oslo", "nights": 2}):
        assert handle.wait(WAIT) == "suspended"
        [card] = widgets.cards(list(kx.questions(run_id)))
        assert isinstance(card, widgets.QuestionCard)
        if isinstance(value, str):
            assert isinstance(card.input, w.Dropdown) and card.value() == "double"
            card.input.value = 0
        elif isinstance(value, bool):
            assert isinstance(card.input, w.Checkbox) and card.value() is False
            card.input.value = True
        else:
            city, nights = (row.children[1] for row in card.input.children)
            assert isinstance(nights, w.BoundedIntText) and nights.value == 1
            city.value, nights.value = "Oslo", 2
        card.answer_button.click()
        assert card.message.value.count("resumed") == 1, card.message.value
        handle = card.handle
    assert handle.wait(WAIT) == "completed"
    assert handle.result == ["single", True, {"city": "Oslo", "nights": 2}]


# -- %%agent cells ------------------------------------------------------------------------
@pytest.fixture
def shell(store_path: Path) -> Iterator[InteractiveShell]:
    with cell_shell(store_path, forget=("pay", "SERVER", "receipt", "run")) as ip:
        yield ip


def test_an_agent_cell_waits_for_approval_and_its_rerun_sends_once(
    shell: InteractiveShell, delivery_server: DeliveryServer
) -> None:
    shell.user_ns["SERVER"] = delivery_server.url
    assert shell.run_cell(
        "import kernelext as kx\n"
        "from support.http_server import post_json\n"
        "@kx.effect(needs_approval=True)\n"
        "def pay(to, amount, *, idempotency_key=None):\n"
        "    return post_json(SERVER + '/pay', {'to': to, 'amount': amount},\n"
        "                     idempotency_key=idempotency_key).body\n"
    ).success
    run_id = name("cells")
    cell = f"%%agent {run_id}\nreceipt = pay('hal', 700)\n"
    first = shell.run_cell(cell)
    assert not first.success  # the cell stopped at the call, nothing sent
    store = runtime().settings.store()
    assert (store.get_run(run_id)["status"], store.get_run(run_id)["reason"]) == (
        "suspended",
        "approval",
    )
    assert amounts(delivery_server) == []
    [request] = kx.approvals(run_id)
    assert request.step.startswith("src:")  # the cell is the step
    assert request.approve() is not None  # this kernel's run: resumed (cells run again)
    assert store.get_run(run_id)["status"] == "running"
    assert shell.run_cell(cell).success
    assert shell.user_ns["receipt"]["delivery"] == 1
    assert shell.run_cell(cell).success  # completed: skipped
    assert amounts(delivery_server) == [700]


# -- expiry ----------------------------------------------------------------------------------
class FakeClock:
    def __init__(self) -> None:
        self.now = dt.datetime(2031, 5, 1, 12, 0, 0)

    def __call__(self) -> dt.datetime:
        return self.now


@pytest.fixture
def timed(store_path: Path) -> Iterator[tuple[Store, FakeClock]]:
    clock = FakeClock()
    opened = open_store(str(store_path), clock=clock)
    runtime().settings.use_store(opened)
    yield opened, clock
    finish_live_runs()
    runtime().settings.close()


def test_a_pending_approval_expires_with_its_run_and_releases_its_claims(
    timed: tuple[Store, FakeClock], delivery_server: DeliveryServer
) -> None:
    store, clock = timed
    run_id = name("lapse")

    @kx.effect(needs_approval=True)
    def pay(to: str, amount: int) -> Any:
        return post_json(delivery_server.url + "/pay", {"to": to, "amount": amount}).body

    @kx.agent(name=name("claimer"))
    def claimer(run: kx.Run) -> None:
        run.claim("account:ivy")
        with run.step("pay"):
            pay("ivy", 400)

    assert claimer.start(run_id=run_id).wait(WAIT) == "suspended"
    [request] = kx.approvals(run_id)
    assert request.expires_at == clock.now + dt.timedelta(days=3)  # the `approval` policy
    clock.now = request.expires_at
    assert kx.sweep().expired_ids == [run_id]
    assert store.get_run(run_id)["status"] == "expired"
    assert store.read(
        "SELECT count(*) FROM claims WHERE run_id = ? AND released_at IS NULL", (run_id,)
    ) == [(0,)]
    assert kx.approvals(run_id) == []
    with pytest.raises(kx.LedgerError, match=r"expired at .* can no longer be decided"):
        request.approve()
    assert amounts(delivery_server) == []


def test_an_approval_past_its_deadline_cannot_be_used(
    timed: tuple[Store, FakeClock], delivery_server: DeliveryServer
) -> None:
    store, clock = timed
    run_id = name("late")
    assert payments(delivery_server).start([["jo", 800]], run_id=run_id).wait(WAIT) == ("suspended")
    [request] = kx.approvals(run_id)
    assert request.approve(resume=False) is None
    clock.now = request.expires_at + dt.timedelta(seconds=1)  # no sweep ran meanwhile
    try:
        status = kx.resume(run_id).wait(WAIT)
    except kx.RunStateError:  # a resume may refuse a run past its deadline: nothing runs
        status = "refused"
    assert status in ("suspended", "refused")
    assert amounts(delivery_server) == []
    old = next(r for r in rows(store, run_id) if r["id"] == request.id)
    assert old["consumed_at"] is None
    if status == "suspended":  # the call asked again, with a fresh deadline
        [fresh] = kx.approvals(run_id)
        assert fresh.id != request.id and fresh.expires_at > clock.now


# -- single use under SIGKILL ------------------------------------------------------------------
@pytest.fixture
def pool(tmp_path: Path) -> Iterator[WorkerPool]:
    workers = WorkerPool(CRASH_DIR / "approval_worker.py", tmp_path)
    yield workers
    workers.close()


def attempt(pool: WorkerPool, kill_at: str | None = None, **go: Any) -> str:
    """One worker process: ``killed``, ``suspended``, ``needs_decision`` or ``done``."""
    worker: Worker = pool.take()
    worker.go(kill_at=kill_at, **go)
    if kill_at:
        code = worker.reap()
        assert code == -9, f"exit code {code}\n{worker.stderr()}"
        return "killed"
    line = worker.expect("ready", "needs_decision", "completed")
    if line.startswith("ready"):
        line = worker.expect("done", "ended")
    worker.reap()
    word = line.split(" ", 2)
    return word[1] if word[0] == "ended" else word[0]


def approve_only_request(path: Path, run_id: str) -> uuid.UUID:
    store = open_store(str(path))
    try:
        [request] = kx.approvals(run_id, store=store)
        request.approve(note="checked")
        return request.id
    finally:
        store.close()


@pytest.mark.crash
@pytest.mark.slow
@pytest.mark.parametrize("kill_at", ["consumed", "intent", "delivered"])
def test_an_approved_call_is_delivered_at_most_once_whatever_kill_lands(
    kill_at: str, tmp_path: Path, pool: WorkerPool, delivery_server: DeliveryServer
) -> None:
    path = tmp_path / "crash.duckdb"
    run_id = f"crash-{kill_at}"
    go = {"store": str(path), "run_id": run_id, "url": delivery_server.url, "amount": 640}
    assert attempt(pool, **go) == "suspended"
    first = approve_only_request(path, run_id)
    assert attempt(pool, kill_at=kill_at, **go) == "killed"
    delivery_server.settle()
    delivered = 1 if kill_at == "delivered" else 0
    assert len(delivery_server.deliveries) == delivered
    store = open_store(str(path))
    try:
        [used] = store.approval_rows(run_id=run_id)
        assert used["id"] == first and used["consumed_at"] is not None  # used by that attempt
    finally:
        store.close()
    outcome = attempt(pool, **go)
    if kill_at == "consumed":  # no intent: the call was not made, and it asks again
        assert outcome == "suspended"
    else:  # an intent without an outcome: a person decides, from the server's log
        assert outcome == "needs_decision"
        store = open_store(str(path))
        try:
            [unknown] = kx.reconcile(run_id, store=store)
            if delivered:
                unknown.mark_applied(result=delivery_server.deliveries[0]["body"])
            else:
                unknown.mark_not_applied(note="the server never saw it")
        finally:
            store.close()
        outcome = attempt(pool, **go)
    if not delivered:  # the spent approval is not used again: a new one is needed
        assert outcome == "suspended"
        assert len(delivery_server.deliveries) == 0
        second = approve_only_request(path, run_id)
        assert second != first
        outcome = attempt(pool, **go)
    assert outcome == "done"
    delivery_server.settle()
    assert len(delivery_server.deliveries) == 1  # exactly one payment, whatever happened
    store = open_store(str(path))
    try:
        consumed = [r for r in store.approval_rows(run_id=run_id) if r["consumed_at"]]
        assert len(consumed) == (1 if delivered else 2)
        assert store.get_run(run_id)["status"] == "completed"
    finally:
        store.close()


# -- the notebook --------------------------------------------------------------------------
@pytest.mark.slow
def test_the_approvals_notebook_runs_and_shows_each_path(
    tmp_path: Path, delivery_server: DeliveryServer
) -> None:
    import nbformat

    nb = nbformat.read(REPO / "notebooks" / "approvals.ipynb", as_version=4)
    env = {
        "KERNELEXT_STORE": str(tmp_path / "nb.duckdb"),
        "KERNELEXT_DEMO_OUTBOX": delivery_server.url + "/outbox",
    }
    execute(nb, env, tmp_path)
    delivery_server.settle()
    sent = [
        (d["body"]["kind"], d["body"]["to"], d["body"]["amount"])
        for d in delivery_server.deliveries
    ]
    assert sorted(sent) == [
        ("payment", "ann", 40),
        ("payment", "bob", 520),
        ("payment", "dan", 2500),  # approved again for the corrected amount
        ("ticket", "cat", 2400),  # rejected: the agent took the other path
    ]
    assert "declined (over budget)" in text_of(nb, "rejected")
    assert "new request: {'to': 'dan', 'amount': 2500}" in text_of(nb, "replanned")
    assert "completed" in text_of(nb, "final")
