"""Approvals and questions on PostgreSQL (issue 13): the same path as on DuckDB (with the
consumption and the intent in one transaction), and processes racing to decide one
request: exactly one decision wins. Time: about 20 s.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support.http_server import DeliveryServer, post_json
from support.live import finish_live_runs, name

import kernelext as kx
from kernelext._core.process.runtime import runtime
from kernelext._store import Store, open_store

pytestmark = pytest.mark.postgres

WAIT = 60.0


@pytest.fixture
def pg(postgres_url: str) -> Iterator[Store]:
    opened = open_store(postgres_url)
    runtime().settings.use_store(opened)
    yield opened
    finish_live_runs()
    runtime().settings.close()


def agent(server: DeliveryServer, plan: dict[str, int]) -> Any:
    @kx.effect(needs_approval=lambda to, amount, **kw: amount > 100)
    def pay(to: str, amount: int, *, idempotency_key: str | None = None) -> Any:
        body = {"to": to, "amount": amount}
        return post_json(server.url + "/pay", body, idempotency_key=idempotency_key).body

    @kx.agent(name=name("pg-payer"))
    def payer(run: kx.Run, payees: list[str]) -> Any:
        for to in run.steps(payees):
            try:
                run.state[to] = pay(to, plan[to])["delivery"]
            except kx.EffectRejected:
                run.state[to] = "declined"
        run.state["note"] = run.ask("Anything to add?", schema=str, default="no")
        return dict(run.state)

    return payer


def test_approve_reject_replan_and_answer_on_postgresql(
    pg: Store, delivery_server: DeliveryServer
) -> None:
    plan = {"ann": 300, "bob": 700}
    run_id = name("pg")
    assert agent(delivery_server, plan).start(["ann", "bob"], run_id=run_id).wait(WAIT) == (
        "suspended"
    )
    [ann] = kx.approvals(run_id)
    plan["ann"] = 350  # re-planned: the approval of 300 does not count
    assert ann.approve().wait(WAIT) == "suspended"
    [ann2] = kx.approvals(run_id)
    assert ann2.arguments["amount"] == 350 and ann2.key == ann.key
    assert ann2.approve(note="ok").wait(WAIT) == "suspended"  # bob's 700 waits
    [bob] = kx.approvals(run_id)
    assert bob.reject(note="no").wait(WAIT) == "suspended"  # declined, then the question
    handle = kx.answer(run_id, "all good")
    assert handle.wait(WAIT) == "completed"
    assert handle.result == {"ann": 1, "bob": "declined", "note": "all good"}
    assert [d["body"] for d in delivery_server.deliveries] == [{"to": "ann", "amount": 350}]
    decided = kx.sql(
        "SELECT decision, consumed_at IS NOT NULL AS used, superseded_at IS NOT NULL AS old"
        " FROM approvals WHERE run_id = ? ORDER BY requested_at",
        [run_id],
    )
    assert decided.to_dict("records") == [
        {"decision": "approved", "used": False, "old": True},
        {"decision": "approved", "used": True, "old": False},
        {"decision": "rejected", "used": False, "old": False},
    ]


DECIDER = """
import json, sys, time
from kernelext import approve, reject
from kernelext.errors import LedgerError
from kernelext._store import open_store

url, ident, verb, start_at = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
store = open_store(url)
store.read("SELECT 1")  # connected before the start
while time.time() < start_at:
    time.sleep(0.001)
try:
    (approve if verb == "approve" else reject)(ident, store=store, note=verb, resume=False)
    outcome = "won"
except LedgerError as exc:
    outcome = "refused: " + str(exc)
store.close()
print(json.dumps(outcome))
"""
DECIDERS = 6


@pytest.mark.slow
def test_racing_deciders_exactly_one_decision_wins(
    pg: Store, postgres_url: str, delivery_server: DeliveryServer
) -> None:
    run_id = name("race")
    payer = agent(delivery_server, {"cy": 999})
    assert payer.start(["cy"], run_id=run_id).wait(WAIT) == "suspended"
    [request] = kx.approvals(run_id)
    start_at = time.time() + 4.0
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                DECIDER,
                postgres_url,
                str(request.id),
                "approve" if n % 2 else "reject",
                str(start_at),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(DECIDERS)
    ]
    outcomes = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        outcomes.append(json.loads(out))
    assert outcomes.count("won") == 1, outcomes
    [row] = pg.approval_rows(run_id=run_id)
    refused = [o for o in outcomes if o != "won"]
    assert all(f"already {row['decision']} by" in o for o in refused), outcomes
    decided = [e for e in pg.events(run_id) if e["kind"] == "approval_decided"]
    assert len(decided) == 1 and decided[0]["reason"] == row["note"]
    handle = kx.resume(run_id)
    assert handle.wait(WAIT) == "suspended"  # at the question, whichever decision won
    expected = 1 if row["decision"] == "approved" else 0
    assert len(delivery_server.deliveries) == expected
