"""``kx.restart``: a new run from a kept snapshot, whose carried effects are not repeated.

Deliveries are counted on the real local HTTP server (tests/support/http_server.py).
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from typing import Any

import pytest
from support.clocks import TickingClock, store_on_clock  # noqa: F401  (the fixture `store`)
from support.http_server import DeliveryServer, post_json
from support.live import name as unique

import kernelext as kx
from kernelext._core.ledger.effect import effect_key
from kernelext._core.lifecycle.run import engine_of
from kernelext._store import Store

WAIT = 60.0
ITEMS = ["a", "b", "c", "d", "e"]


@pytest.fixture
def clock() -> TickingClock:
    return TickingClock(milliseconds=1)


@kx.effect
def deliver(url: str, item: str, *, idempotency_key: str | None = None) -> Any:
    return post_json(url + "/deliver", {"item": item}, idempotency_key=idempotency_key).body


def delivering_agent() -> kx.Agent:
    """Announces itself (an effect outside any step), delivers each item, may suspend."""

    @kx.agent(name=unique("deliverer"))
    def deliverer(run: kx.Run, url: str, items: list[str], pause_after: str | None) -> Any:
        deliver(url, "announce")
        for item in run.steps(items, key=str):
            deliver(url, item)
            run.state["done"] = [*run.state.get("done", []), item]
            if item == pause_after:
                run.suspend("approval")
        return run.state["done"]

    return deliverer


def counts(server: DeliveryServer) -> dict[str, int]:
    out: dict[str, int] = {}
    for record in server.deliveries:
        out[record["body"]["item"]] = out.get(record["body"]["item"], 0) + 1
    return out


def expired_run(
    store: Store, clock: TickingClock, server: DeliveryServer, run_id: str = "old"
) -> kx.Agent:
    """Run ``old`` delivers announce, a, b, c, suspends after c and expires."""
    agent = delivering_agent()
    handle = agent.start(server.url, ITEMS, "c", run_id=run_id)
    assert handle.wait(WAIT) == "suspended"
    clock.advance(days=4)
    assert kx.sweep().expired_ids == [run_id]
    assert counts(server) == {"announce": 1, "a": 1, "b": 1, "c": 1}
    return agent


def test_restart_from_the_last_step_repeats_nothing(
    store: Store, clock: TickingClock, delivery_server: DeliveryServer
) -> None:
    expired_run(store, clock, delivery_server)
    handle = kx.restart(
        "old", kwargs={"url": delivery_server.url, "items": ITEMS, "pause_after": None}
    )
    assert handle.run_id == "old-restart1"
    assert handle.wait(WAIT) == "completed"
    assert handle.result == ITEMS
    assert counts(delivery_server) == {"announce": 1, "a": 1, "b": 1, "c": 1, "d": 1, "e": 1}

    new = store.get_run("old-restart1")
    assert (new["parent_id"], new["completed_steps"]) == ("old", 5)
    assert store.get_run("old")["status"] == "expired"  # the old run stays as it was
    steps = store.steps("old-restart1")
    assert [(s["key"], s["status"]) for s in steps] == [(k, "completed") for k in ITEMS]
    # The new run's ledger knows what happened, under its own keys.
    ledger = store.load_effects("old-restart1")
    carried = {
        row["args"]: row
        for row in ledger.values()
        if "carried over from run old" in (row["decision_note"] or "")
    }
    assert len(carried) == 4
    for row in carried.values():
        assert row["key"] == effect_key(
            "old-restart1", row["step_key"], "deliver", row["call_ordinal"]
        )
        assert row["status"] == "applied" and row["result"] is not None
    created = [e for e in store.events("old-restart1") if e["kind"] == "created"]
    detail = json.loads(created[0]["detail"])
    assert (detail["parent"], detail["from_step"], detail["carried_steps"]) == ("old", 3, 3)
    assert [e["kind"] for e in store.events("old")][-1] == "restarted"


@pytest.mark.parametrize("from_step", [1, "b"])
def test_restart_from_an_earlier_step_does_not_repeat_carried_effects(
    store: Store, clock: TickingClock, delivery_server: DeliveryServer, from_step: int | str
) -> None:
    expired_run(store, clock, delivery_server)
    handle = kx.restart("old", from_step=from_step, args=(delivery_server.url, ITEMS, None))
    assert handle.wait(WAIT) == "completed"
    # State after step 0 ("a"), then b..e again: the step bodies of b and c run again,
    # but every effect the old run applied is carried over and replayed, never repeated.
    assert handle.result == ITEMS
    assert counts(delivery_server) == {"announce": 1, "a": 1, "b": 1, "c": 1, "d": 1, "e": 1}
    new_steps = store.steps(handle.run_id)
    assert [s["key"] for s in new_steps] == ITEMS
    # The replayed calls of b and c are in the new run's ledger under its own keys.
    ledger = store.load_effects(handle.run_id)
    row = ledger[effect_key(handle.run_id, "b", "deliver", 0)]
    assert row["status"] == "applied" and "carried over from run old" in row["decision_note"]


def test_a_restarted_run_is_superseded_and_restarting_a_restart_works(
    store: Store, clock: TickingClock, delivery_server: DeliveryServer
) -> None:
    expired_run(store, clock, delivery_server)
    args = (delivery_server.url, ITEMS, "d")
    first = kx.restart("old", args=args)
    assert first.wait(WAIT) == "suspended"  # paused again after d
    # A second restart of the same run is refused: its child goes on instead.
    with pytest.raises(kx.RunStateError, match=r"kx\.restart\('old-restart1'\)"):
        kx.restart("old", from_step=2, new_run_id="old-fork", args=args)
    assert store.find_run("old-fork") is None
    assert store.get_run("old-restart1")["status"] == "suspended"
    # A restart of the restarted run, from a step it carried over (a fresh copy).
    third = kx.restart("old-restart1", from_step=1, args=(delivery_server.url, ITEMS, None))
    assert third.wait(WAIT) == "completed"
    assert third.result == ITEMS
    assert store.get_run("old-restart1")["status"] == "cancelled"  # superseded
    assert store.get_run("old-restart1-restart1")["parent_id"] == "old-restart1"


def test_restart_with_unknown_effects_demands_reconciliation(
    store: Store, delivery_server: DeliveryServer
) -> None:
    entered = threading.Event()

    @kx.effect
    def hang(url: str, item: str) -> str:
        post_json(url + "/deliver", {"item": item})
        if not entered.is_set():
            entered.set()
            while True:  # the forced stop lands here, at a bytecode boundary
                threading.Event().wait(0.01)
        return "sent"

    @kx.agent(name=unique("hanger"))
    def hanger(run: kx.Run, url: str) -> list[str]:
        for item in run.steps(["x", "y"]):
            run.state[item] = hang(url, item)
        return sorted(run.state)

    handle = hanger.start(delivery_server.url, run_id="hung")
    assert entered.wait(WAIT)
    handle.force_stop(cut_calls=True)
    assert handle.wait(WAIT) == "suspended"
    assert [e["status"] for e in store.load_effects("hung").values()] == ["unknown"]
    with pytest.raises(kx.RunStateError, match=r"unknown \(hang\).*kx\.reconcile\('hung'\)"):
        kx.restart("hung")
    assert store.find_run("hung-restart1") is None
    [unknown] = kx.reconcile("hung")
    unknown.mark_applied(result="sent")
    restarted = kx.restart("hung")
    assert restarted.wait(WAIT) == "completed"
    assert restarted.result == ["x", "y"]
    assert store.get_run("hung")["status"] == "cancelled"  # superseded by the restart
    # No step had completed, so the new run starts from the beginning; the call decided
    # applied is carried with its result and replayed, not made again.
    assert counts(delivery_server) == {"x": 1, "y": 1}


def test_restart_takes_the_claims_back_and_refuses_when_someone_else_holds_them(
    store: Store, clock: TickingClock
) -> None:
    @kx.agent(name=unique("locker"))
    def locker(run: kx.Run, pause: bool) -> list[str]:
        for i in run.steps(range(2)):
            run.claim(f"row:{i}")
            if pause and i == 0:
                run.suspend("approval")
        return sorted(c["resource"] for c in engine_of(run).store.claims(run.id, active=True))

    assert locker.start(True, run_id="locked").wait(WAIT) == "suspended"
    clock.advance(days=4)
    kx.sweep()
    assert store.claims("locked", active=True) == []

    @kx.agent(name=unique("intruder"))
    def intruder(run: kx.Run) -> None:
        run.claim("row:0")
        run.suspend("approval")

    assert intruder.start(run_id="intruder").wait(WAIT) == "suspended"
    with pytest.raises(kx.ClaimConflict, match="'row:0' is claimed by run 'intruder'"):
        kx.restart("locked", args=(False,))
    assert store.find_run("locked-restart1") is None  # nothing half-made
    clock.advance(days=4)
    kx.sweep()
    handle = kx.restart("locked", args=(False,))
    assert handle.wait(WAIT) == "completed"
    assert handle.result == ["row:0", "row:1"]  # row:0 taken back at restart


def test_restart_refusals_are_clear(
    store: Store, clock: TickingClock, delivery_server: DeliveryServer
) -> None:
    agent = expired_run(store, clock, delivery_server)
    with pytest.raises(ValueError, match=r"from_step must be between 0 and 3"):
        kx.restart("old", from_step=7)
    with pytest.raises(ValueError, match="no completed step with key 'zz'"):
        kx.restart("old", from_step="zz")
    with pytest.raises(kx.RunNotFound):
        kx.restart("nope")
    with pytest.raises(kx.RunStateError, match="already exists"):
        kx.restart("old", new_run_id="old")
    gate = threading.Event()

    @kx.agent(name=unique("busy"))
    def busy(run: kx.Run) -> None:
        gate.wait(WAIT)

    live = busy.start(run_id="busy")
    try:
        with pytest.raises(kx.RunStateError, match="running run cannot be restarted"):
            kx.restart("busy")
    finally:
        gate.set()
        live.wait(WAIT)
    assert agent.name in kx.runs()["agent"].tolist()


def test_big_payloads_survive_the_old_runs_retention(store: Store, clock: TickingClock) -> None:
    kx.configure(retention_seconds=60)

    @kx.agent(name=unique("bulky"))
    def bulky(run: kx.Run, pause: bool) -> int:
        for i in run.steps(range(2)):
            run.state["blob"] = bytes([7]) * (3 << 19)  # a side file
            if pause and i == 0:
                run.suspend("approval")
        return len(run.state["blob"])

    assert bulky.start(True, run_id="bulk").wait(WAIT) == "suspended"
    clock.advance(days=4)
    kx.sweep()
    handle = kx.restart("bulk", args=(True,))  # suspends again? no: step 0 is carried
    assert handle.wait(WAIT) == "completed"
    clock.advance(seconds=61)
    assert kx.sweep().removed_ids == ["bulk"]
    assert not os.path.exists(store.blob_dir("bulk"))
    # The restarted run's copy of the payload is its own.
    snapshot = store.latest_snapshot("bulk-restart1")
    blobs = store.load_blobs(
        "bulk-restart1", [uuid.UUID(hex=h) for h in snapshot["manifest"].values()]
    )
    assert [len(b.data) for b in blobs.values()] == [3 << 19]


def test_the_panel_banner_says_expired_and_its_restart_button_works(
    store: Store, clock: TickingClock, delivery_server: DeliveryServer
) -> None:
    from kernelext.widgets import PANEL_ADDONS, panel_for
    from kernelext.widgets._expired import ExpiredBanner, expired_addon

    assert expired_addon in PANEL_ADDONS
    agent = delivering_agent()
    handle = agent.start(delivery_server.url, ITEMS, "c", run_id="paneled")
    assert handle.wait(WAIT) == "suspended"
    panel = panel_for(handle)
    [banner] = [a for a in panel.addons.children if isinstance(a, ExpiredBanner)]
    panel.refresh()
    assert banner.layout.display == "none" and banner.restart_button.disabled

    clock.advance(days=4)
    kx.sweep()
    assert panel.refresh().status == "expired"
    assert banner.layout.display is None and not banner.restart_button.disabled
    assert "expired (deadline:approval)" in banner.message.value
    banner.restart_button.click()
    new = banner.new_handle
    assert new is not None and panel.handle is new
    try:
        assert new.wait(WAIT) == "completed"  # c, where it paused, is carried over
        assert panel.refresh().status == "completed"
        assert counts(delivery_server) == {"announce": 1, "a": 1, "b": 1, "c": 1, "d": 1, "e": 1}
        assert banner.restart_button.disabled  # one restart per click
    finally:
        panel.detach()
