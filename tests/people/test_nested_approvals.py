"""An approval asked by a call made inside another recorded call (an ``@kx.effect`` called
in an ``@kx.effect``'s body, as a framework's tool call makes them).

The enclosing call is left before it returned, with nothing of the gated call made: it is
recorded ``not_applied`` with why, never ``unknown``, so that once a person decided the
resume makes it again under its key; the calls it made before replay from the ledger by
their own keys, and the approved call is made once. Real runs on a real DuckDB store; the
calls POST to the local ``DeliveryServer``, which counts what arrived.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support import nested_payer
from support.http_server import DeliveryServer, post_json
from support.live import name

import kernelext as kx
from kernelext._core.process.runtime import runtime
from kernelext._store import Store

WAIT = 60.0
TESTS_DIR = Path(__file__).resolve().parents[1]


def arrived(server: DeliveryServer, path: str) -> list[dict[str, Any]]:
    return [d["body"] for d in server.deliveries if d["path"] == path]


def ledger(run_id: str) -> dict[str, tuple[str, str]]:
    """tool -> (status, error) of the run's effects."""
    rows = kx.sql("SELECT tool, status, error FROM effects WHERE run_id = ?", [run_id])
    return {r.tool: (r.status, r.error or "") for r in rows.itertuples(index=False)}


def payments(
    server: DeliveryServer, *, outer_approval: bool = False, catch: dict[str, bool] | None = None
) -> Any:
    """An agent whose ``transfer`` (gated with ``outer_approval``) tells each payee
    (``notify``) and pays them (``pay``, gated), inside its own body; it takes another path
    after a rejection while ``catch["rejected"]`` (read at each run)."""
    catch = catch if catch is not None else {"rejected": False}

    @kx.effect
    def notify(to: str) -> Any:
        return post_json(f"{server.url}/notify", {"to": to}).body

    @kx.effect(needs_approval=True)
    def pay(to: str, amount: int) -> Any:
        return post_json(f"{server.url}/pay", {"to": to, "amount": amount}).body

    @kx.effect(needs_approval=outer_approval)
    def transfer(payees: list[str], amount: int) -> list[int]:
        made = []
        for to in payees:
            notify(to)
            made.append(pay(to, amount)["delivery"])
        return made

    @kx.agent(name=name("nested"))
    def payer(run: kx.Run, payees: list[str], amount: int) -> Any:
        with run.step("transfer"):
            try:
                return transfer(payees, amount)
            except kx.EffectRejected as exc:
                if not catch["rejected"]:
                    raise
                return f"declined: {exc.note}"

    return payer


def test_an_approval_asked_inside_an_effect_lets_the_enclosing_call_through(
    store: Store, delivery_server: DeliveryServer
) -> None:
    run_id = name("inner")
    payer = payments(delivery_server)
    assert payer.start(["ann"], 40, run_id=run_id).wait(WAIT) == "suspended"
    assert arrived(delivery_server, "/pay") == []  # nothing paid before a person said yes
    status, error = ledger(run_id)["transfer"]
    assert status == "not_applied", error  # not unknown: nothing waits in kx.reconcile
    assert error.startswith("left before it returned: a call made inside it waits for approval")
    assert f"pay waits for approval: kx.approvals({run_id!r})" in error
    assert "pay" not in ledger(run_id)  # the gated call has no intent at all
    assert store.get_run(run_id)["reason"] == "approval"

    [request] = kx.approvals(run_id)
    assert (request.tool, request.arguments) == ("pay", {"to": "ann", "amount": 40})
    resumed = request.approve()
    assert resumed.wait(WAIT) == "completed", resumed.error
    assert arrived(delivery_server, "/pay") == [{"to": "ann", "amount": 40}]
    assert {t: s for t, (s, _) in ledger(run_id).items()} == {
        "notify": "applied",
        "pay": "applied",
        "transfer": "applied",
    }
    assert resumed.result == [d["seq"] for d in delivery_server.deliveries if d["path"] == "/pay"]
    assert list(kx.reconcile(run_id)) == []


def test_calls_applied_inside_before_the_approval_are_not_made_again(
    store: Store, delivery_server: DeliveryServer
) -> None:
    """Two gated payments inside one call: the first is approved and made, the second asks;
    each resume makes the enclosing call again, and what it made replays."""
    run_id = name("twice")
    payer = payments(delivery_server)
    assert payer.start(["ann", "bob"], 5, run_id=run_id).wait(WAIT) == ("suspended")
    assert arrived(delivery_server, "/notify") == [{"to": "ann"}]
    [first] = kx.approvals(run_id)
    assert first.approve().wait(WAIT) == "suspended"  # bob's payment asks in its turn
    assert ledger(run_id)["transfer"][0] == "not_applied"
    [second] = kx.approvals(run_id)
    assert second.arguments == {"to": "bob", "amount": 5}
    assert second.approve().wait(WAIT) == "completed"

    # Each delivery arrived once, whatever number of times transfer was made again.
    assert arrived(delivery_server, "/notify") == [{"to": "ann"}, {"to": "bob"}]
    assert arrived(delivery_server, "/pay") == [
        {"to": "ann", "amount": 5},
        {"to": "bob", "amount": 5},
    ]
    asked = store.approval_rows(run_id=run_id)
    assert [(r["tool"], r["decision"]) for r in asked] == [("pay", "approved")] * 2
    assert all(r["consumed_at"] is not None for r in asked)
    assert ledger(run_id)["transfer"][0] == "applied"


def test_a_rejection_inside_an_effect_is_raised_at_the_call_on_every_replay(
    store: Store, delivery_server: DeliveryServer
) -> None:
    run_id = name("rejected")
    catch = {"rejected": False}
    payer = payments(delivery_server, catch=catch)
    assert payer.start(["dan"], 900, run_id=run_id).wait(WAIT) == "suspended"
    [request] = kx.approvals(run_id)
    failed = request.reject(note="over budget")
    assert failed.wait(WAIT) == "failed"  # the agent did not catch it: as a top-level call
    assert isinstance(failed.error, kx.EffectRejected), failed.error
    assert (failed.error.tool, failed.error.note) == ("pay", "over budget")
    status, error = ledger(run_id)["transfer"]
    assert status == "not_applied"
    assert f"pay (key {request.key}), called inside it, was rejected: over budget" in error

    again = kx.resume(run_id)  # the rejection again, not "transfer failed before"
    assert again.wait(WAIT) == "failed"
    assert isinstance(again.error, kx.EffectRejected), again.error
    catch["rejected"] = True  # the agent takes another path
    done = kx.resume(run_id)
    assert done.wait(WAIT) == "completed", done.error
    assert done.result == "declined: over budget"
    assert arrived(delivery_server, "/pay") == []  # never paid
    assert arrived(delivery_server, "/notify") == [{"to": "dan"}]  # told once, replayed since
    assert [r["decision"] for r in store.approval_rows(run_id=run_id)] == ["rejected"]


def test_a_gated_call_made_again_keeps_its_own_approval_and_its_edits(
    store: Store, delivery_server: DeliveryServer
) -> None:
    run_id = name("gated")
    payer = payments(delivery_server, outer_approval=True)
    assert payer.start(["eve"], 30, run_id=run_id).wait(WAIT) == ("suspended")
    [outer] = kx.approvals(run_id)
    assert outer.tool == "transfer"
    assert outer.approve(edit={"amount": 25}).wait(WAIT) == "suspended"  # pay asks in turn
    [inner] = kx.approvals(run_id)
    assert inner.arguments == {"to": "eve", "amount": 25}  # made as edited
    done = inner.approve()
    assert done.wait(WAIT) == "completed", done.error
    # transfer was made again under the approval it used, with its edit: nobody asked twice
    asked = store.approval_rows(run_id=run_id)
    assert [r["tool"] for r in asked] == ["transfer", "pay"]
    assert arrived(delivery_server, "/pay") == [{"to": "eve", "amount": 25}]
    assert arrived(delivery_server, "/notify") == [{"to": "eve"}]


def test_a_suspension_of_the_agent_inside_an_effect_still_leaves_it_unknown(
    store: Store,
) -> None:
    """Only kernelext's own wait for an approval asked inside counts: ``run.suspend``
    (even with the reason ``approval``) in an effect's body is a stop there, as before."""
    run_id = name("suspend")

    @kx.agent(name=name("suspender"))
    def suspender(run: kx.Run) -> None:
        @kx.effect
        def book() -> None:
            run.suspend("approval")

        with run.step("book"):
            book()

    assert suspender.start(run_id=run_id).wait(WAIT) == "suspended"
    assert ledger(run_id)["book"] == ("unknown", "interrupted during the call")


def test_a_question_asked_inside_an_effect_lets_the_enclosing_call_through(
    store: Store, delivery_server: DeliveryServer
) -> None:
    """``run.ask`` inside an effect's body waits as an approval does: nothing of the
    enclosing call waits in ``kx.reconcile``, and the answer lets it through once."""
    run_id = name("asked")

    @kx.agent(name=name("asker"))
    def asker(run: kx.Run, to: str) -> Any:
        @kx.effect
        def notify(to: str) -> Any:
            return post_json(f"{delivery_server.url}/notify", {"to": to}).body

        @kx.effect
        def pay(to: str) -> Any:
            notify(to)
            amount = run.ask(f"How much for {to}?", schema={"type": "integer"})
            return post_json(f"{delivery_server.url}/pay", {"to": to, "amount": amount}).body

        with run.step("pay"):
            return pay(to)["delivery"]

    assert asker.start("ann", run_id=run_id).wait(WAIT) == "suspended"
    status, error = ledger(run_id)["pay"]
    assert status == "not_applied", error
    assert error.startswith("left before it returned: a call made inside it waits for an answer")
    assert list(kx.reconcile(run_id)) == []
    resumed = kx.answer(run_id, 12)
    assert resumed is not None and resumed.wait(WAIT) == "completed", resumed.error
    assert arrived(delivery_server, "/notify") == [{"to": "ann"}]
    assert arrived(delivery_server, "/pay") == [{"to": "ann", "amount": 12}]
    assert {t: s for t, (s, _) in ledger(run_id).items()} == {"notify": "applied", "pay": "applied"}


@pytest.mark.slow
def test_an_approved_call_inside_an_effect_is_made_by_a_resume_in_a_new_process(
    store: Store, store_path: Path, delivery_server: DeliveryServer
) -> None:
    run_id = name("elsewhere")
    nested_payer.URL["delivery"] = delivery_server.url
    handle = nested_payer.nested_payer.start("gus", 12, run_id=run_id)
    assert handle.wait(WAIT) == "suspended"
    assert arrived(delivery_server, "/notify") == [{"to": "gus"}]
    [request] = kx.approvals(run_id)
    assert request.approve(resume=False) is None
    runtime().close()  # this kernel is gone; another one resumes the run
    argv = ["resume", str(store_path), run_id, delivery_server.url]
    done = subprocess.run(
        [sys.executable, "-m", "support.nested_payer", *argv],
        env={**os.environ, "PYTHONPATH": str(TESTS_DIR)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    end = json.loads(done.stdout.strip().splitlines()[-1])
    assert end["status"] == "completed", done.stderr
    assert arrived(delivery_server, "/notify") == [{"to": "gus"}]  # replayed there
    assert arrived(delivery_server, "/pay") == [{"to": "gus", "amount": 12}]
    assert end["result"] == delivery_server.deliveries[-1]["seq"]
