"""``kx.restart`` carries every applied effect of the old run, whatever way its last
step ended: none is delivered twice (issue 19 item 6).

Each test counts deliveries on the real local HTTP server (tests/support/http_server.py)
that the effects POST to, under the ledger's key as ``Idempotency-Key`` (no dedupe:
a repeated call would be counted).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from crash import CRASH_DIR, Worker, WorkerPool
from support.clocks import TickingClock, store_on_clock  # noqa: F401  (the fixture `store`)
from support.http_server import DeliveryServer, post_json
from support.live import name as unique
from support.pool_calls import per_item

import kernelext as kx
from kernelext._core.ledger.effect import effect_key
from kernelext._core.people.reconcile import UnknownEffect
from kernelext._store import Store, open_store

WAIT = 60.0


@pytest.fixture
def clock() -> TickingClock:
    return TickingClock(milliseconds=1)


URL: dict[str, str] = {"url": ""}


@pytest.fixture
def server(delivery_server: DeliveryServer) -> DeliveryServer:
    URL["url"] = delivery_server.url
    return delivery_server


@kx.effect
def notify(item: str, *, idempotency_key: str | None = None) -> Any:
    return post_json(URL["url"] + "/notify", {"item": item}, idempotency_key=idempotency_key).body


@kx.effect(needs_approval=True)
def pay(amount: int, *, idempotency_key: str | None = None) -> Any:
    body = {"item": f"pay {amount}"}
    return post_json(URL["url"] + "/pay", body, idempotency_key=idempotency_key).body


def carried(store: Store, run_id: str) -> dict[str, dict[str, Any]]:
    """The carried ledger rows of ``run_id`` by their arguments' ``item``."""
    out = {}
    for row in store.load_effects(run_id).values():
        if "carried over from run" in (row["decision_note"] or ""):
            args = json.loads(row["args"])
            out[str(args.get("item", row["args"]))] = row
    return out


def approval_agent() -> kx.Agent:
    """One step that notifies, then makes a payment that needs approval."""

    @kx.agent(name=unique("payer"))
    def payer(run: kx.Run) -> Any:
        with run.step("checkout"):
            run.state["note"] = notify("checkout")
            run.state["receipt"] = pay(40)
        with run.step("thanks"):
            notify("thanks")
        return sorted(run.state)

    return payer


def expire(clock: TickingClock, run_id: str, days: float = 8) -> None:
    clock.advance(days=days)
    assert run_id in kx.sweep().expired_ids


def expired_waiting_for_approval(clock: TickingClock, run_id: str) -> None:
    """Run ``run_id`` of the approval agent, suspended on its payment's approval, which
    then expired (the clock moved on and the sweep ended the run)."""
    assert approval_agent().start(run_id=run_id).wait(WAIT) == "suspended"
    expire(clock, run_id)


# -- (a) the case: an approval that expired ---------------------------------------
def test_a_step_whose_approval_expired_does_not_notify_again(
    store: Store, clock: TickingClock, server: DeliveryServer
) -> None:
    handle = approval_agent().start(run_id="shop")
    assert handle.wait(WAIT) == "suspended"
    assert store.get_run("shop")["reason"] == "approval"
    expire(clock, "shop")
    assert per_item(server) == {"checkout": 1}

    child = kx.restart("shop")
    assert child.wait(WAIT) == "suspended"  # the payment asks for a new approval
    assert per_item(server) == {"checkout": 1}  # the notification was replayed
    [request] = kx.approvals(child.run_id)
    done = request.approve()
    assert done.wait(WAIT) == "completed"
    assert per_item(server) == {"checkout": 1, "pay 40": 1, "thanks": 1}
    row = carried(store, child.run_id)["checkout"]
    assert row["key"] == effect_key(child.run_id, "checkout", "notify", 0)
    assert row["step_key"] == "checkout" and row["status"] == "applied"
    # The same notification under the new key is what the step got back on replay.
    assert done.run.state["note"] == json.loads(row["result"])


def test_a_restart_of_a_restart_carries_the_grandparents_effects(
    store: Store, clock: TickingClock, server: DeliveryServer
) -> None:
    expired_waiting_for_approval(clock, "gp")
    first = kx.restart("gp")
    assert first.wait(WAIT) == "suspended"
    expire(clock, first.run_id)  # the new approval request expired too
    second = kx.restart(first.run_id)
    assert second.run_id == "gp-restart1-restart1"
    assert second.wait(WAIT) == "suspended"
    assert kx.approvals(second.run_id)[0].approve().wait(WAIT) == "completed"
    assert per_item(server) == {"checkout": 1, "pay 40": 1, "thanks": 1}
    note = carried(store, second.run_id)["checkout"]["decision_note"]
    assert note.startswith("carried over from run gp-restart1") and "from run gp " in note


def test_a_restarted_run_cannot_be_restarted_again(
    store: Store, clock: TickingClock, server: DeliveryServer
) -> None:
    expired_waiting_for_approval(clock, "twice")
    one = kx.restart("twice")
    with pytest.raises(kx.RunStateError, match=r"restarted as 'twice-restart1'.*kx\.resume"):
        kx.restart("twice")
    assert store.find_run("twice-restart2") is None
    assert one.wait(WAIT) == "suspended"
    assert per_item(server) == {"checkout": 1}
    assert carried(store, one.run_id)["checkout"]["key"] == effect_key(
        one.run_id, "checkout", "notify", 0
    )


# -- (b) the step raised an error after an effect -----------------------------------------
def test_a_step_that_raised_after_an_effect_does_not_repeat_it(
    store: Store, server: DeliveryServer
) -> None:
    @kx.agent(name=unique("crasher"))
    def crasher(run: kx.Run, fail: bool) -> Any:
        with run.step("one"):
            notify("one")
        with run.step("two"):
            notify("two")
            if fail:
                raise RuntimeError("the model answered nonsense")
            notify("two-b")
        return "ok"

    handle = crasher.start(True, run_id="raised")
    assert handle.wait(WAIT) == "failed"
    child = kx.restart("raised", args=(False,))
    assert child.wait(WAIT) == "completed" and child.result == "ok"
    assert per_item(server) == {"one": 1, "two": 1, "two-b": 1}
    assert set(carried(store, child.run_id)) == {"one", "two"}


def test_failed_and_not_applied_effects_are_called_again(
    store: Store, server: DeliveryServer
) -> None:
    attempts: list[str] = []

    @kx.effect
    def flaky(item: str) -> Any:
        attempts.append(item)
        if len(attempts) == 1:
            raise ConnectionError("the API is down")
        return post_json(URL["url"] + "/flaky", {"item": item}).body

    @kx.agent(name=unique("flaker"))
    def flaker(run: kx.Run) -> Any:
        with run.step("only"):
            notify("before")
            return flaky("x")

    assert flaker.start(run_id="flaked").wait(WAIT) == "failed"
    child = kx.restart("flaked")
    assert child.wait(WAIT) == "completed"
    assert attempts == ["x", "x"]  # restarting is the deliberate retry of a failed call
    assert per_item(server) == {"before": 1, "x": 1}
    created = next(e for e in store.events(child.run_id) if e["kind"] == "created")
    [again] = json.loads(created["detail"])["called_again"]
    assert (again["tool"], again["status"]) == ("flaky", "failed")


def test_a_failed_resumable_false_call_must_be_reconciled_first(
    store: Store, server: DeliveryServer
) -> None:
    calls: list[int] = []

    @kx.effect(resumable=False)
    def legacy(item: str) -> Any:
        calls.append(1)
        post_json(URL["url"] + "/legacy", {"item": item})
        if len(calls) == 1:
            raise RuntimeError("garbled answer")  # it may have happened (it did)
        return "ok"

    @kx.agent(name=unique("legacy"))
    def legacy_agent(run: kx.Run) -> Any:
        with run.step("only"):
            return legacy("L")

    assert legacy_agent.start(run_id="legacy").wait(WAIT) == "failed"
    with pytest.raises(kx.RunStateError, match=r"unknown \(legacy\)"):
        kx.restart("legacy")
    [unknown] = kx.reconcile("legacy")
    unknown.mark_applied(result="ok", note="the server log shows it")
    child = kx.restart("legacy")
    assert child.wait(WAIT) == "completed" and child.result == "ok"
    assert calls == [1] and per_item(server) == {"L": 1}


# -- (c) a forced stop during the step, after an effect completed -------------------------
def test_a_forced_stop_after_an_effect_carries_it_once_the_unknown_one_is_decided(
    store: Store, server: DeliveryServer
) -> None:
    entered = threading.Event()

    @kx.effect
    def hang(item: str) -> str:
        post_json(URL["url"] + "/hang", {"item": item})
        if not entered.is_set():
            entered.set()
            while True:  # the forced stop lands here, at a bytecode boundary
                time.sleep(0.01)
        return "sent"

    @kx.agent(name=unique("hanger"), max_step_seconds=0.3)
    def hanger(run: kx.Run) -> Any:
        with run.step("first"):
            notify("first")
        with run.step("slow"):
            notify("slow")
            run.state["hang"] = hang("h")
            notify("slow-after")
        return run.state["hang"]

    handle = hanger.start(run_id="forced")
    assert entered.wait(WAIT)
    handle.stop(source="button")  # past max_step_seconds: forced
    assert handle.wait(WAIT) == "suspended"
    statuses = {
        e["tool"] + "/" + e["step_key"]: e["status"] for e in store.load_effects("forced").values()
    }
    assert statuses == {"notify/first": "applied", "notify/slow": "applied", "hang/slow": "unknown"}
    with pytest.raises(kx.RunStateError, match=r"unknown \(hang\)"):
        kx.restart("forced")
    [unknown] = kx.reconcile("forced")
    unknown.mark_applied(result="sent-by-hand")  # the server log shows the POST
    child = kx.restart("forced")
    assert child.wait(WAIT) == "completed"
    assert child.result == "sent-by-hand"  # the decided result is replayed
    assert per_item(server) == {"first": 1, "slow": 1, "h": 1, "slow-after": 1}
    assert store.get_run("forced")["status"] == "cancelled"  # superseded


def _stopped_in_the_slow_step(
    hang: Any, entered: threading.Event, agent: str, run_id: str
) -> UnknownEffect:
    """Runs an agent whose one step notifies, then calls ``hang``, which sets ``entered``
    and never comes back; stops it there (past max_step_seconds: forced) and returns the
    one call the stop left unknown, to be decided by the test."""

    @kx.agent(name=unique(agent), max_step_seconds=0.3)
    def hanger(run: kx.Run) -> Any:
        with run.step("slow"):
            notify("slow")
            return hang("h")

    handle = hanger.start(run_id=run_id)
    assert entered.wait(WAIT)
    handle.stop()
    assert handle.wait(WAIT) == "suspended"
    [unknown] = kx.reconcile(run_id)
    return unknown


def test_a_call_decided_not_applied_is_made_again(store: Store, server: DeliveryServer) -> None:
    entered = threading.Event()

    @kx.effect
    def hang(item: str) -> str:
        if not entered.is_set():
            entered.set()
            while True:
                time.sleep(0.01)
        post_json(URL["url"] + "/hang", {"item": item})
        return "sent"

    unknown = _stopped_in_the_slow_step(hang, entered, "hanger", "undecided")
    unknown.mark_not_applied(note="the server never saw it")
    child = kx.restart("undecided")
    assert child.wait(WAIT) == "completed" and child.result == "sent"
    assert per_item(server) == {"slow": 1, "h": 1}


def test_a_given_up_call_is_decided_again_in_the_restart_not_made_again(
    store: Store, server: DeliveryServer
) -> None:
    entered = threading.Event()

    @kx.effect
    def hang(item: str, *, idempotency_key: str | None = None) -> str:
        post_json(URL["url"] + "/hang", {"item": item}, idempotency_key=idempotency_key)
        if not entered.is_set():
            entered.set()
            while True:  # it went out; the answer never comes back
                time.sleep(0.01)
        return "sent"

    unknown = _stopped_in_the_slow_step(hang, entered, "quitter", "gaveup")
    unknown.give_up(note="nobody can tell")
    assert store.get_run("gaveup")["status"] == "cancelled"
    # Giving up did not say whether it happened: the restart carries it as unknown and
    # stops at its take-over, before anything is called again.
    child = kx.restart("gaveup")
    assert child.wait(WAIT) == "needs_decision"
    assert per_item(server) == {"slow": 1, "h": 1}
    created = next(e for e in store.events(child.run_id) if e["kind"] == "created")
    assert json.loads(created["detail"])["called_again"] == []
    [again] = kx.reconcile(child.run_id)
    assert again.tool == "hang"
    again.mark_applied(result="sent")  # the server log shows the POST
    assert kx.resume(child.run_id).wait(WAIT) == "completed"
    assert per_item(server) == {"slow": 1, "h": 1}


# -- (d) the process was SIGKILLed mid-step after an effect applied -----------------------
@pytest.mark.crash
def test_a_killed_process_mid_step_then_reconcile_then_restart_repeats_nothing(
    tmp_path: Path, delivery_server: DeliveryServer
) -> None:
    path = tmp_path / "killed.duckdb"
    pool = WorkerPool(CRASH_DIR / "restart_worker.py", tmp_path)
    go = {"store": str(path), "run_id": "killed", "url": delivery_server.url}
    try:
        worker: Worker = pool.take()
        worker.go(kill_at="delivered", **go)
        assert worker.reap() == -9, worker.stderr()
        assert per_item(delivery_server) == {"work": 1, "parcel": 1}
        # The dead process's run still says running: a restart refuses it.
        worker = pool.take()
        worker.go(restart=True, **go)
        line = worker.expect("refused")
        worker.reap()
        assert "running run cannot be restarted" in line and "kx.resume('killed')" in line
        # A resume takes the run over: the open intent becomes unknown, a person decides.
        worker = pool.take()
        worker.go(**go)
        assert worker.expect("needs_decision").startswith("needs_decision")
        worker.reap()
        opened = open_store(str(path))
        try:
            [unknown] = kx.reconcile("killed", store=opened)
            assert unknown.tool == "deliver"
            unknown.mark_applied(result=delivery_server.deliveries[1]["body"])
        finally:
            opened.close()
        worker = pool.take()
        worker.go(restart=True, **go)
        line = worker.expect("restarted")
        worker.reap()
        assert line == "restarted killed-restart1 completed"
    finally:
        pool.close()
    assert per_item(delivery_server) == {"work": 1, "parcel": 1, "after": 1}
    opened = open_store(str(path))
    try:
        ledger = opened.load_effects("killed-restart1")
        assert sorted(
            (r["step_key"], r["tool"])
            for r in ledger.values()
            if "carried" in (r["decision_note"] or "")
        ) == [("work", "deliver"), ("work", "notify")]
    finally:
        opened.close()


# -- (e) a user stop mid-step in a hand-written loop, then expiry -------------------------
def test_a_user_stop_mid_step_then_expiry_does_not_repeat_the_steps_effects(
    store: Store, clock: TickingClock, server: DeliveryServer
) -> None:
    sent = threading.Event()
    go_on = threading.Event()

    @kx.agent(name=unique("looper"))
    def looper(run: kx.Run) -> Any:
        for name in ("one", "two", "three"):
            with run.step(name):
                notify(name)
                if name == "two" and not go_on.is_set():
                    sent.set()
                    go_on.wait(WAIT)
                run.checkpoint()  # the stop lands here, inside step "two"
                notify(name + "-done")
        return "looped"

    handle = looper.start(run_id="looped")
    assert sent.wait(WAIT)
    handle.stop(source="button")
    go_on.set()
    assert handle.wait(WAIT) == "suspended"
    assert store.get_run("looped")["reason"] == "user_stop"
    assert [s["key"] for s in store.steps("looped") if s["status"] == "completed"] == ["one"]
    expire(clock, "looped")
    child = kx.restart("looped")
    assert child.wait(WAIT) == "completed" and child.result == "looped"
    assert per_item(server) == {
        "one": 1,
        "one-done": 1,
        "two": 1,
        "two-done": 1,
        "three": 1,
        "three-done": 1,
    }


def test_from_step_reruns_the_steps_but_replays_their_effects(
    store: Store, clock: TickingClock, server: DeliveryServer
) -> None:
    bodies: list[str] = []

    @kx.agent(name=unique("stepper"))
    def stepper(run: kx.Run, stop_at: str | None) -> Any:
        for item in run.steps(["a", "b", "c"], key=str):
            bodies.append(item)
            run.state[item] = notify(item)
            if item == stop_at:
                run.suspend("approval")
        notify("summary")  # outside any step
        return sorted(run.state)

    assert stepper.start(None, run_id="full").wait(WAIT) == "completed"
    # Restart a completed run from step 1, and past its end (nothing runs again).
    again = kx.restart("full", from_step="b", args=(None,))
    assert again.wait(WAIT) == "completed" and again.result == ["a", "b", "c"]
    assert bodies == ["a", "b", "c", "b", "c"]  # the step bodies ran again ...
    assert per_item(server) == {"a": 1, "b": 1, "c": 1, "summary": 1}  # ... replaying
    end = kx.restart(again.run_id, from_step=3, args=(None,))  # "full" is superseded
    assert end.wait(WAIT) == "completed"
    assert bodies == ["a", "b", "c", "b", "c"]
    assert per_item(server) == {"a": 1, "b": 1, "c": 1, "summary": 1}
    with pytest.raises(ValueError, match="between 0 and 3"):
        kx.restart(end.run_id, from_step=4)


def test_a_replayed_call_with_other_arguments_stops_with_a_mismatch(
    store: Store, server: DeliveryServer
) -> None:
    @kx.agent(name=unique("changer"))
    def changer(run: kx.Run, item: str) -> Any:
        with run.step("only"):
            return notify(item)

    assert changer.start("first", run_id="changed").wait(WAIT) == "completed"
    child = kx.restart("changed", from_step=0, args=("second",))
    assert child.wait(WAIT) == "failed"
    assert isinstance(child.error, kx.EffectArgumentsMismatch), child.error
    message = str(child.error)  # the advice is what works: not "restart it"
    assert "Restore the original arguments" in message
    assert "kx.restart does not help" in message and "new step" in message
    assert per_item(server) == {"first": 1}


# -- (f) %%agent cell runs ------------------------------------------------------------------
CELL_EFFECTS = """
import kernelext as kx
from support.http_server import post_json

@kx.effect
def notify(item, *, idempotency_key=None):
    return post_json(SERVER + "/notify", {"item": item}, idempotency_key=idempotency_key).body

@kx.effect(needs_approval=True)
def pay(amount, *, idempotency_key=None):
    body = {"item": f"pay {amount}"}
    return post_json(SERVER + "/pay", body, idempotency_key=idempotency_key).body
"""


@pytest.fixture
def shell(store: Store) -> Iterator[Any]:
    from IPython.core.interactiveshell import InteractiveShell

    from kernelext._core.lifecycle.cell_runs import forget_cell_runs

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "kernelext")
    yield ip
    ip.run_line_magic("unload_ext", "kernelext")
    for key in ("notify", "pay", "SERVER", "note", "receipt", "post_json"):
        ip.user_ns.pop(key, None)
    forget_cell_runs()


def test_a_cell_run_restarts_and_its_cells_replay_what_the_old_run_applied(
    shell: Any, store: Store, clock: TickingClock, server: DeliveryServer
) -> None:
    shell.user_ns["SERVER"] = server.url
    assert shell.run_cell(CELL_EFFECTS).success
    first = "note = notify('first cell')\n"
    second = "note = notify('checkout')\nreceipt = pay(40)\n"
    assert shell.run_cell("%%agent cells\n" + first).success
    assert not shell.run_cell("%%agent cells\n" + second).success  # waits for approval
    expire(clock, "cells")
    child = kx.restart("cells")
    assert child.run_id == "cells-restart1"
    # The notebook's cells are the code: run them again under the new run id.
    assert shell.run_cell("%%agent cells-restart1\n" + first).success  # completed: skipped
    assert not shell.run_cell("%%agent cells-restart1\n" + second).success  # a new approval
    assert per_item(server) == {"first cell": 1, "checkout": 1}
    [request] = kx.approvals("cells-restart1")
    request.approve()
    assert shell.run_cell("%%agent cells-restart1\n" + second).success
    assert shell.user_ns["receipt"]["delivery"] == 3
    assert per_item(server) == {"first cell": 1, "checkout": 1, "pay 40": 1}


# -- the ledger changed between the core's read and the transaction -----------------------
def test_the_restart_transaction_refuses_a_ledger_that_changed(
    store: Store, clock: TickingClock, server: DeliveryServer
) -> None:
    expired_waiting_for_approval(clock, "moved")
    real = store.write_restart

    def stale(plan: Any) -> None:
        plan.effects = []  # as if the core had read the ledger before the notification
        real(plan)

    store.write_restart = stale  # type: ignore[method-assign]
    try:
        with pytest.raises(kx.RunStateError, match="ledger of run 'moved' changed"):
            kx.restart("moved")
    finally:
        del store.write_restart
    assert store.find_run("moved-restart1") is None
    assert kx.restart("moved").wait(WAIT) == "suspended"
    assert per_item(server) == {"checkout": 1}
