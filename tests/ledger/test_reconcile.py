"""Reconciling effects whose outcome is unknown (issue 3), against a real HTTP server.

The unknowns are made the way a user meets them: a call hangs, the user forces the
stop, and the run is resumed; or a dead process left an intent without an outcome.
"""

from __future__ import annotations

import datetime as dt
import getpass
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.http_server import DeliveryServer, post_json

import kernelext as kx
from kernelext._core.encoding.keys import bound_hash
from kernelext._core.ledger.effect import effect_key
from kernelext._store import Store, open_store

WAIT = 60


@pytest.fixture
def store(store_path: Path) -> Iterator[Store]:
    opened = open_store(str(store_path))
    yield opened
    opened.close()


class Mailer:
    """A tool that hangs on its first call until the test forces the stop."""

    def __init__(self, server: DeliveryServer) -> None:
        self.server = server
        self.hang = True
        self.entered = threading.Event()
        self.calls: list[str | None] = []

    def send(self, to: str, body: str, *, idempotency_key: str | None = None) -> Any:
        self.calls.append(idempotency_key)
        if self.hang:
            self.entered.set()
            while True:  # the forced stop lands between two waits
                threading.Event().wait(0.01)
        return post_json(
            self.server.url + "/mail", {"to": to, "body": body}, idempotency_key=idempotency_key
        ).body


def unknown_run(
    store: Store, server: DeliveryServer, run_id: str, claim: bool = False
) -> tuple[Mailer, kx.Agent]:
    """A run in ``needs_decision`` with one unknown ``send`` in step ``notify``."""
    mailer = Mailer(server)
    send = kx.effect(name="send")(mailer.send)

    @kx.agent(name=f"reconcile-{run_id}")
    def agent(run: kx.Run) -> None:
        if claim:
            run.claim("mail-budget", 3.0)
        with run.step("notify"):
            run.state["answer"] = send("gus@example.org", "your order shipped")
        with run.step("after"):
            run.state["after"] = True

    handle = agent.start(run_id=run_id, store=store)
    assert mailer.entered.wait(WAIT)
    handle.force_stop(cut_calls=True)
    assert handle.wait(WAIT) == "suspended", handle.error
    resumed = kx.resume(run_id, store=store)
    assert resumed.status == "needs_decision", resumed.error
    mailer.hang = False
    return mailer, agent  # type: ignore[return-value]


def finish(handle: kx.Handle) -> str:
    status = handle.wait(WAIT)
    assert status != "running"
    return status


def test_lists_open_unknowns_with_tool_args_key_intent_time_and_step(
    store: Store, delivery_server: DeliveryServer
) -> None:
    before = store.now()
    unknown_run(store, delivery_server, "listing")
    unknowns = kx.reconcile("listing", store=store)
    assert len(unknowns) == 1 and unknowns.run_id == "listing"
    (item,) = unknowns
    assert item.tool == "send"
    assert item.key == effect_key("listing", "notify", "send", 0)
    assert item.step_key == "notify"
    assert json.loads(item.args or "") == {"to": "gus@example.org", "body": "your order shipped"}
    assert isinstance(item.intent_at, dt.datetime) and before <= item.intent_at <= store.now()
    assert item.run_id == "listing" and item.decision is None
    assert [u.key for u in unknowns.open] == [item.key]


def test_mark_applied_makes_resume_return_that_result_without_calling(
    store: Store, delivery_server: DeliveryServer
) -> None:
    mailer, _ = unknown_run(store, delivery_server, "applied")
    (item,) = kx.reconcile("applied", store=store)
    item.mark_applied(result={"message_id": "m-1"}, note="in the sent folder")
    assert item.decision == "applied"
    assert kx.reconcile("applied", store=store) == []
    handle = kx.resume("applied", store=store)
    assert finish(handle) == "completed"
    assert handle.run.state["answer"] == {"message_id": "m-1"}
    assert len(mailer.calls) == 1 and delivery_server.count() == 0
    row = store.effect(item.key)
    assert row is not None and row["status"] == "applied"
    assert json.loads(row["result"]) == {"message_id": "m-1"}
    assert row["decision_note"] == "in the sent folder"
    assert getpass.getuser() in row["decided_by"]


def test_mark_not_applied_calls_again_under_the_same_key(
    store: Store, delivery_server: DeliveryServer
) -> None:
    mailer, _ = unknown_run(store, delivery_server, "again")
    (item,) = kx.reconcile("again", store=store)
    assert delivery_server.count() == 0  # the hung call never reached the server
    item.mark_not_applied(note="not in the mail log")
    handle = kx.resume("again", store=store)
    assert finish(handle) == "completed"
    assert mailer.calls == [str(item.key), str(item.key)]
    assert delivery_server.count() == 1
    assert delivery_server.deliveries[0]["idempotency_key"] == str(item.key)
    assert handle.run.state["answer"]["idempotency_key"] == str(item.key)
    row = store.effect(item.key)
    assert row is not None and row["status"] == "applied"


def test_give_up_cancels_the_run_and_releases_its_claims(
    store: Store, delivery_server: DeliveryServer
) -> None:
    unknown_run(store, delivery_server, "giveup", claim=True)
    held = store.read_dicts("SELECT * FROM claims WHERE run_id = 'giveup'")
    assert len(held) == 1 and held[0]["released_at"] is None
    (item,) = kx.reconcile("giveup", store=store)
    item.give_up(note="too late to send")
    assert store.get_run("giveup")["status"] == "cancelled"
    (claim,) = store.read_dicts("SELECT * FROM claims WHERE run_id = 'giveup'")
    assert claim["released_at"] is not None and claim["release_reason"] == "cancelled"
    with pytest.raises(kx.RunStateError, match="cancelled"):
        kx.resume("giveup", store=store)
    assert delivery_server.count() == 0


@pytest.mark.parametrize("decision", ["mark_applied", "mark_not_applied", "give_up"])
def test_each_decision_is_an_event_with_user_time_and_note(
    store: Store, delivery_server: DeliveryServer, decision: str
) -> None:
    unknown_run(store, delivery_server, f"event-{decision}")
    (item,) = kx.reconcile(f"event-{decision}", store=store)
    before = store.now()
    getattr(item, decision)(note=f"decided by test: {decision}")
    after = store.now()
    events = [e for e in store.events(f"event-{decision}") if e["kind"] == "effect_decided"]
    assert len(events) == 1
    (event,) = events
    assert getpass.getuser() in event["actor"]
    assert before <= event["occurred_at"] <= after
    assert event["reason"] == f"decided by test: {decision}"
    detail = json.loads(event["detail"])
    assert detail["key"] == str(item.key) and detail["tool"] == "send"
    assert (
        detail["decision"]
        == {"mark_applied": "applied", "mark_not_applied": "not_applied", "give_up": "give_up"}[
            decision
        ]
    )


def test_reconciling_a_key_that_is_not_unknown_is_refused(
    store: Store, delivery_server: DeliveryServer
) -> None:
    unknown_run(store, delivery_server, "twice")
    (item,) = kx.reconcile("twice", store=store)
    item.mark_applied(result=None)
    with pytest.raises(kx.LedgerError, match=str(item.key)) as refused:
        item.mark_not_applied()
    message = str(refused.value)
    assert "'applied'" in message and "unknown" in message and "kx.reconcile" in message
    row = store.effect(item.key)
    assert row is not None and row["status"] == "applied"  # the first decision stands
    decided = [e for e in store.events("twice") if e["kind"] == "effect_decided"]
    assert len(decided) == 1


def test_pending_intent_left_by_a_dead_process_is_reconciled(
    store: Store, delivery_server: DeliveryServer
) -> None:
    calls: list[str | None] = []

    @kx.effect
    def book(room: str, *, idempotency_key: str | None = None) -> Any:
        calls.append(idempotency_key)
        return post_json(
            delivery_server.url + "/book", {"room": room}, idempotency_key=idempotency_key
        ).body

    stop_early = [True]

    @kx.agent(name="reconcile-dead")
    def agent(run: kx.Run) -> None:
        with run.step("book"):
            if stop_early[0]:
                raise RuntimeError("first attempt ends before the call")
            run.state["booking"] = book("blue")

    assert finish(agent.start(run_id="dead", store=store)) == "failed"
    stop_early[0] = False
    key = effect_key("dead", "book", "book", 0)
    store.write_intent(
        {
            "key": key,
            "run_id": "dead",
            "step_key": "book",
            "step_ordinal": 0,
            "tool": "book",
            "call_ordinal": 0,
            "args_hash": bound_hash({"room": "blue"}),
            "args": '{"room": "blue"}',
            "resumable": True,
        }
    )
    assert kx.reconcile("dead", store=store) == []  # pending is not unknown until resume
    assert kx.resume("dead", store=store).status == "needs_decision"
    (item,) = kx.reconcile("dead", store=store)
    assert (
        item.key == key and item.tool == "book" and json.loads(item.args or "") == {"room": "blue"}
    )
    item.mark_not_applied()
    assert finish(kx.resume("dead", store=store)) == "completed"
    assert calls == [str(key)] and delivery_server.count(str(key)) == 1


def test_text_repr_is_readable(store: Store, delivery_server: DeliveryServer) -> None:
    unknown_run(store, delivery_server, "text")
    unknowns = kx.reconcile("text", store=store)
    (item,) = unknowns
    text = repr(unknowns)
    assert text == unknowns.text()
    lines = text.splitlines()
    assert lines[0] == "Run text: 1 effect(s) with an unknown outcome"
    assert "send(" in lines[1] and "gus@example.org" in lines[1]
    assert str(item.key) in lines[1] and " step 1 (notify) " in lines[1] and "UTC" in lines[1]
    assert "mark_applied" in lines[-1] and "mark_not_applied" in lines[-1]
    assert "give_up" in lines[-1]
    assert "send" in repr(item) and str(item.key) in repr(item)
    item.mark_not_applied()
    assert unknowns.text().splitlines()[1].endswith("-> not_applied") and unknowns.open == []
    assert repr(kx.reconcile("text", store=store)) == (
        "Run text: no effects with an unknown outcome."
    )
