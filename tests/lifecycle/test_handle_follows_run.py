"""The handle a user holds follows its run through every resume in this process.

``agent.start(...)`` returns a handle; the run may then be resumed here by an approval, an
answer or ``kx.resume``, each of which makes a new attempt (a new worker thread). The handle
the user kept waits for the latest attempt and reads its result, error, state and status,
and its stop reaches it. Real runs on a real DuckDB store; payments go to the local HTTP
server, which counts them.
"""

from __future__ import annotations

import threading
from typing import Any

from support.http_server import DeliveryServer, post_json
from support.live import name, wait_until

import kernelext as kx

WAIT = 60.0


def test_the_started_handle_gives_the_result_after_an_approval_resumes_the_run(
    store: Any, delivery_server: DeliveryServer
) -> None:
    @kx.effect(needs_approval=True)
    def pay(to: str, amount: int, *, idempotency_key: str | None = None) -> Any:
        body = {"to": to, "amount": amount}
        return post_json(delivery_server.url + "/pay", body, idempotency_key=idempotency_key).body

    @kx.agent(name=name("approved"))
    def approved(run: kx.Run, to: str) -> str:
        run.state["paid"] = pay(to, 500)["delivery"]
        return f"paid {to}"

    run_id = name("approved")
    h = approved.start("bob", run_id=run_id)
    assert h.wait(WAIT) == "suspended"
    kx.approvals(run_id)[0].approve(note="ok")  # resumes the run here, with a new handle
    assert h.wait(WAIT) == "completed"
    assert (h.result, h.error, h.status) == ("paid bob", None, "completed")
    assert h.run.state["paid"] == 1  # the state the resumed attempt left
    assert len(delivery_server.deliveries) == 1
    assert kx.panel(run_id).result == "paid bob"  # a panel opened afterwards reads it too


class Gate:
    """What the test lets the run do on its next attempt."""

    def __init__(self) -> None:
        self.pause = True  # the attempt after the answer suspends
        self.fail = False
        self.looping = threading.Event()


GATES: dict[str, Gate] = {}


@kx.agent(name="follows-resumes")
def follower(run: kx.Run) -> int:
    gate = GATES[run.id]
    seats: int = run.ask("How many seats?", schema=int)
    if gate.pause:
        gate.pause = False
        run.suspend("other")
    if gate.fail:
        raise ValueError(f"no room for {seats}")
    for _ in run.steps(range(2000), key=str):  # stops at a step boundary when asked
        gate.looping.set()
        threading.Event().wait(0.01)
    return seats


def test_the_started_handle_follows_an_answer_and_kx_resume_to_the_run_error(store: Any) -> None:
    run_id = name("follows")
    GATES[run_id] = gate = Gate()
    gate.fail = True
    h = follower.start(run_id=run_id)
    assert h.wait(WAIT) == "suspended"
    kx.answer(run_id, 3)  # the new handle it returns is dropped: h is the one the user kept
    assert h.wait(WAIT) == "suspended"
    assert not gate.pause  # the answered attempt ran, then suspended
    kx.resume(run_id)
    assert h.wait(WAIT) == "failed"
    assert isinstance(h.error, ValueError) and str(h.error) == "no room for 3"
    assert h.status == "failed"


def test_the_started_handle_stops_the_attempt_kx_resume_made(store: Any) -> None:
    run_id = name("follows")
    GATES[run_id] = gate = Gate()
    h = follower.start(run_id=run_id)
    assert h.wait(WAIT) == "suspended"
    kx.answer(run_id, 2)
    assert h.wait(WAIT) == "suspended"
    kx.resume(run_id)
    assert gate.looping.wait(WAIT)
    assert h.alive and h.wait(0.05) == "running"
    assert h.stop() == "stopping"  # reaches the resumed attempt's worker
    assert h.wait(WAIT) == "suspended"
    assert store.get_run(run_id)["reason"] == "user_stop"
    kx.resume(run_id)
    wait_until(lambda: h.alive, "the run to go on")
    h.force_stop()  # a force reaches the attempt too
    assert h.wait(WAIT) == "suspended"
