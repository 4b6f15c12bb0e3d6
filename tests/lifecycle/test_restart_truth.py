"""``kx.restart`` never repeats a call that may have reached its target, and every refusal
tells the truth: a key-less call answered with an error after its request left is carried
into the new run as ``unknown`` (it waits for a decision, not re-sent); a run whose last
step was a ``run.map`` item restarts (items have no snapshot: nothing was removed).

Deliveries are counted on the real local HTTP server (tests/support/http_server.py).
"""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest
from support.http_server import DeliveryServer, post_json
from support.live import name
from support.ports import refusing_port

import kernelext as kx
from kernelext._store import Store

WAIT = 60.0

pytestmark = pytest.mark.both_backends


def charger(server: DeliveryServer) -> kx.Effect:
    @kx.effect(name="charge_card")
    def charge_card(amount: int) -> Any:
        response = post_json(server.url + "/charge", {"amount": amount})
        if response.status >= 400:
            raise _HTTPError(response.status)
        return response.body

    return charge_card


def failed_paying(charge: kx.Effect, *, agent: str) -> kx.Handle:
    """A run of a new agent (named after ``agent``) whose one step, ``pay``, charges 40
    with ``charge``; the call fails, and so does the run."""

    @kx.agent(name=name(agent))
    def paying(run: kx.Run) -> Any:
        with run.step("pay"):
            return charge(40)

    parent = paying.start()
    assert parent.wait(WAIT) == "failed"
    return parent


class _HTTPError(Exception):
    """An answered error, with its status where clients keep it (``status_code``)."""

    def __init__(self, status: int) -> None:
        super().__init__(f"the payment API answered HTTP {status}")
        self.status_code = status


def test_a_keyless_call_answered_500_after_applying_is_carried_unknown_not_sent_again(
    store: Store, delivery_server: DeliveryServer
) -> None:
    charge_card = charger(delivery_server)
    delivery_server.fail_next(1, status=500, delivered=True)  # applied, then an error

    parent = failed_paying(charge_card, agent="checkout")
    assert delivery_server.count() == 1
    child = kx.restart(parent.run_id)
    assert child.wait(WAIT) == "needs_decision", child.error
    assert delivery_server.count() == 1  # not charged a second time
    (unknown,) = kx.reconcile(child.run_id)
    assert unknown.tool == "charge_card"
    assert "may have reached" in (unknown.row["decision_note"] or "")
    created = next(e for e in store.events(child.run_id) if e["kind"] == "created")
    assert json.loads(created["detail"])["called_again"] == []

    unknown.mark_applied(result={"ok": True}, note="the card statement shows it")
    done = kx.resume(child.run_id)
    assert done.wait(WAIT) == "completed", done.error
    assert done.result == {"ok": True} and delivery_server.count() == 1


def test_a_call_never_sent_is_made_again_by_a_restart(
    store: Store, delivery_server: DeliveryServer
) -> None:
    charge_card = charger(delivery_server)
    down = {"on": True}

    @kx.effect(name="charge_when_up")
    def charge_when_up(amount: int) -> Any:
        if down["on"]:  # nothing listens there: refused, the call's only connection
            with refusing_port() as port:
                socket.create_connection(("127.0.0.1", port), timeout=10).close()
        return charge_card.fn(amount)

    parent = failed_paying(charge_when_up, agent="retry-later")
    down["on"] = False
    child = kx.restart(parent.run_id)
    assert child.wait(WAIT) == "completed", child.error
    assert delivery_server.count() == 1


def test_a_run_whose_last_step_was_a_batch_item_restarts(
    store: Store, delivery_server: DeliveryServer
) -> None:
    @kx.effect(name="notify_item")
    def notify_item(item: int, *, idempotency_key: str | None = None) -> int:
        body = {"item": item}
        reply = post_json(delivery_server.url + "/item", body, idempotency_key=idempotency_key)
        return int(reply.body["delivery"])

    @kx.agent(name=name("batch"))
    def batch(run: kx.Run, fail: bool) -> Any:
        with run.step("prepare"):
            run.state["items"] = [1, 2, 3]
        done = run.map(notify_item, run.state["items"])
        if fail:
            raise RuntimeError("the report after the batch failed")
        return sorted(done)

    parent = batch.start(True)
    assert parent.wait(WAIT) == "failed"
    assert delivery_server.count() == 3
    child = kx.restart(parent.run_id, args=(False,))
    assert child.wait(WAIT) == "completed", child.error
    assert child.result == [1, 2, 3]  # each item's stored value: no item ran again
    assert delivery_server.count() == 3
