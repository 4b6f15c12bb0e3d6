"""Effect probes (issue 14, part 4): unknown outcomes settled by asking the external system.

The crash test runs this file as its worker process (``python tests/ledger/test_probes.py``): an
agent whose effect POSTs to the test's delivery server with the ledger's key as
Idempotency-Key, and whose probe asks the server ``GET /deliveries?key=``. The test
SIGKILLs the worker at chosen points of a call (intent recorded and nothing sent; sent and
answered, outcome not recorded; returned to the agent) and checks that the probes leave
nothing for a person and that every delivery happened exactly once.

The in-process tests make the unknown effect the way a user does: a call hangs and the
user forces the stop.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from crash import Worker, WorkerPool, drive_run, read_go
from support.http_server import DeliveryServer, post_json, read_log
from support.live import finish_live_runs, name

import kernelext as kx
from kernelext._core.ledger.effect import effect_key
from kernelext._core.ledger.probes import probe_for, settle_unknowns
from kernelext._store import Store, open_store
from kernelext.status import EffectStatus, Status

WAIT = 60
STEPS, PER_STEP = 6, 3
TOOL = "probed_deliver"
CONFIG: dict[str, Any] = {"url": "", "hang": None}


# -- the agent of the crash test (also imported by the worker process) ------------------------
def lookup_delivery(key: str, args: Any) -> Any:
    """The probe: ask the server whether it received a request with this idempotency key."""
    url = f"{CONFIG['url']}/deliveries?key={key}"
    with urllib.request.urlopen(url, timeout=10) as response:
        found = json.load(response)
    if not found["applied"]:
        return "not_applied"
    first = found["first"]
    return "applied", {
        "ok": True,
        "delivery": first["seq"],
        "path": first["path"],
        "idempotency_key": key,
    }


def hang_at(point: str, step: int, index: int) -> None:
    """Where the test kills the worker: say so, then wait for the SIGKILL."""
    if CONFIG["hang"] == [point, step, index]:
        print(f"hanging {point} {step} {index}", flush=True)
        while True:
            time.sleep(1)


@kx.effect(name=TOOL, probe=lookup_delivery)
def deliver(run_id: str, step: int, index: int, *, idempotency_key: str | None = None) -> Any:
    hang_at("intent", step, index)
    body = {"run": run_id, "step": step, "index": index}
    response = post_json(CONFIG["url"] + "/deliver", body, idempotency_key=idempotency_key)
    if response.status != 200:
        raise RuntimeError(f"delivery refused: HTTP {response.status}")
    hang_at("delivered", step, index)
    return response.body


@kx.agent(name="probed-deliveries")
def probed_deliveries(run: kx.Run, steps: int, per_step: int) -> None:
    for step in run.steps(range(steps), key=lambda s: f"step-{s}"):
        for index in range(per_step):
            body = deliver(run.id, step, index)
            run.state.setdefault("deliveries", {})[f"{step}.{index}"] = body["delivery"]
            hang_at("returned", step, index)


def worker_main() -> int:
    """The worker's side: see ``tests/crash/__init__.py`` for the protocol."""
    print("loaded", flush=True)
    command = read_go(sys.stdin)
    if command is None:
        return 0
    CONFIG.update(url=command["url"], hang=command["hang"])
    store = open_store(command["store"])
    try:
        return drive_run(
            store,
            command["run_id"],
            lambda: probed_deliveries.start(STEPS, PER_STEP, run_id=command["run_id"], store=store),
        )
    finally:
        store.close()


# -- the crash test ---------------------------------------------------------------------------
# Kill points: intent durable, nothing sent (the server can tell: not applied); sent and
# answered, the outcome not recorded (applied); returned to the agent (applied, or already
# recorded); then a last attempt that runs to the end.
HANGS: list[list[Any] | None] = [["intent", 1, 2], ["delivered", 3, 1], ["returned", 4, 0], None]


def attempt(pool: WorkerPool, server: DeliveryServer, store_path: Path, rid: str, hang: Any) -> str:
    """One worker: ``killed`` (at ``hang``), ``done <state>`` or ``needs_decision``."""
    worker: Worker = pool.take()
    worker.go(store=str(store_path), run_id=rid, url=server.url, hang=hang)
    line = worker.expect("ready", "needs_decision", "hanging")
    if line.startswith("needs_decision"):
        assert worker.reap() == 0, worker.stderr()
        return "needs_decision"
    if hang is None:
        done = worker.expect("done")
        assert worker.reap() == 0, worker.stderr()
        return done
    while not line.startswith("hanging"):  # the agent's thread may get there first
        line = worker.expect("ready", "hanging")
    assert worker.kill()
    server.settle()  # bytes a dead client left in a socket are handled first
    return "killed"


@pytest.mark.crash
@pytest.mark.timeout(300)
def test_probes_settle_sigkilled_effects_and_nothing_is_delivered_twice(
    tmp_path: Path, delivery_server: DeliveryServer
) -> None:
    assert not delivery_server.dedupe, "duplicates must be visible"
    CONFIG["url"] = delivery_server.url  # the probe, called in this process
    store_path = tmp_path / "store" / "probes.duckdb"
    rid = name("probed")
    pool = WorkerPool(Path(__file__), tmp_path)
    outcomes: list[str] = []
    try:
        for hang in HANGS:
            outcomes.append(attempt(pool, delivery_server, store_path, rid, hang))
            # kx.resume asked the probes before a person: nothing is left to reconcile.
            assert outcomes[-1] != "needs_decision", outcomes
    finally:
        pool.close()

    assert outcomes.count("killed") == 3 and outcomes[-1].startswith("done"), outcomes
    log = read_log(delivery_server.log_path or "")
    counts = Counter(d["idempotency_key"] for d in log)
    assert len(log) == STEPS * PER_STEP and set(counts.values()) == {1}, "a duplicate"
    seq = {f"{d['body']['step']}.{d['body']['index']}": d["seq"] for d in log}
    assert json.loads(outcomes[-1].split(" ", 1)[1])["deliveries"] == seq
    with open_store(str(store_path)) as store:
        assert isinstance(store, Store)
        assert store.get_run(rid)["status"] == Status.COMPLETED
        rows = {str(k): r for k, r in store.load_effects(rid).items()}
        events = [e for e in store.events(rid) if e["kind"] == "effect_decided"]
    assert set(rows) == set(counts)
    assert {r["status"] for r in rows.values()} == {EffectStatus.APPLIED}
    # Each kill left at most one unknown call; its probe decided it, nobody else did.
    assert len(events) >= 2 and {e["actor"] for e in events} == {f"probe:{TOOL}"}
    decisions = [json.loads(e["detail"]) for e in events]
    assert (decisions[0]["key"], decisions[0]["decision"]) == (
        str(effect_key(rid, "step-1", TOOL, 2)),  # killed before sending: sent again
        EffectStatus.NOT_APPLIED,
    )
    assert (decisions[1]["key"], decisions[1]["decision"]) == (
        str(effect_key(rid, "step-3", TOOL, 1)),  # killed after the server answered
        EffectStatus.APPLIED,
    )
    assert {r["decided_by"] for r in rows.values()} == {None, f"probe:{TOOL}"}


# -- in-process: what a probe's answer does ------------------------------------------------------
@pytest.fixture
def store(store_path: Path) -> Iterator[Store]:
    opened = open_store(str(store_path))
    yield opened
    finish_live_runs()
    opened.close()


class Hanging:
    """A tool whose first call hangs until the forced stop; later calls return at once."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.calls: list[str | None] = []

    def __call__(self, to: str, *, idempotency_key: str | None = None) -> Any:
        self.calls.append(idempotency_key)
        if len(self.calls) == 1:
            self.entered.set()
            while True:
                threading.Event().wait(0.01)
        return {"sent_to": to, "call": len(self.calls)}


def unknown_send(store: Store, probe: Callable[[str, Any], Any]) -> tuple[str, Hanging]:
    """A suspended run whose ``send`` in step ``notify`` has an unknown outcome."""
    rid = name("probe")
    tool = Hanging()
    send = kx.effect(name=name("send"), probe=probe)(tool)

    @kx.agent(name=name("probe-agent"))
    def notifier(run: kx.Run) -> None:
        with run.step("notify"):
            run.state["answer"] = send("gus@example.org")

    handle = notifier.start(run_id=rid, store=store)
    assert tool.entered.wait(WAIT)
    handle.force_stop(cut_calls=True)
    assert handle.wait(WAIT) == Status.SUSPENDED
    assert [r["tool"] for r in store.open_unknowns(rid)] == [send.tool]
    return rid, tool


def test_an_applied_answer_is_a_decision_by_the_probe_and_the_call_is_not_repeated(
    store: Store,
) -> None:
    asked: list[tuple[str, Any]] = []

    def probe(key: str, args: Any) -> Any:
        asked.append((key, args))
        return "applied", {"message_id": "m-1"}

    rid, tool = unknown_send(store, probe)
    (settled,) = settle_unknowns(rid, store)
    (row,) = store.load_effects(rid).values()
    assert asked == [(tool.calls[0], {"to": "gus@example.org"})], "key and stored arguments"
    assert (settled.key, settled.decision, settled.result) == (
        tool.calls[0],
        EffectStatus.APPLIED,
        {"message_id": "m-1"},
    )
    assert row["status"] == EffectStatus.APPLIED and row["decided_by"] == f"probe:{row['tool']}"
    assert json.loads(row["result"]) == {"message_id": "m-1"}
    (event,) = [e for e in store.events(rid) if e["kind"] == "effect_decided"]
    assert (event["actor"], event["source"]) == (f"probe:{row['tool']}", "probe")
    assert json.loads(event["detail"])["decision"] == EffectStatus.APPLIED
    assert store.open_unknowns(rid) == []

    handle = kx.resume(rid, store=store)
    assert handle.wait(WAIT) == Status.COMPLETED
    assert handle.run.state["answer"] == {"message_id": "m-1"} and len(tool.calls) == 1


def test_a_not_applied_answer_makes_the_resume_call_again_under_the_same_key(
    store: Store,
) -> None:
    rid, tool = unknown_send(store, lambda key, args: "not_applied")
    assert [s.decision for s in settle_unknowns(rid, store)] == [EffectStatus.NOT_APPLIED]
    handle = kx.resume(rid, store=store)
    assert handle.wait(WAIT) == Status.COMPLETED
    assert len(tool.calls) == 2 and tool.calls[0] == tool.calls[1]
    assert handle.run.state["answer"] == {"sent_to": "gus@example.org", "call": 2}


def _raises(key: str, args: Any) -> Any:
    raise ConnectionError("lookup API down")


def _slow(release: threading.Event) -> Callable[[str, Any], Any]:
    def probe(key: str, args: Any) -> Any:
        release.wait(30)  # past the time bound: abandoned, its late answer ignored
        return "applied"

    return probe


PROBES: dict[str, tuple[Callable[[threading.Event], Any], str]] = {
    "raises": (lambda release: _raises, "raised ConnectionError: lookup API down"),
    "cannot-tell": (lambda release: lambda k, a: None, "could not tell (answered None)"),
    "unclear": (lambda release: lambda k, a: "maybe", "could not tell (answered 'maybe')"),
    "times-out": (_slow, "timed out"),
}


@pytest.mark.parametrize("case", sorted(PROBES))
def test_a_probe_that_cannot_settle_leaves_the_effect_unknown_and_logs_one_line(
    store: Store, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    make, logged = PROBES[case]
    release = threading.Event()
    rid, _tool = unknown_send(store, make(release))
    (before,) = store.open_unknowns(rid)
    caplog.clear()
    try:
        with caplog.at_level(logging.WARNING, logger="kernelext"):
            assert settle_unknowns(rid, store, timeout=0.5) == []
    finally:
        release.set()
    lines = [r.getMessage() for r in caplog.records if r.name == "kernelext"]
    assert len(lines) == 1, lines
    assert logged in lines[0] and str(before["key"]) in lines[0]
    assert f"it stays unknown: decide it with kx.reconcile({rid!r})" in lines[0]
    assert store.open_unknowns(rid) == [before]
    assert not [e for e in store.events(rid) if e["kind"] == "effect_decided"]


def test_effects_without_a_probe_are_left_to_a_person(store: Store) -> None:
    rid = name("probe")
    tool = Hanging()
    send = kx.effect(name=name("send"))(tool)

    @kx.agent(name=name("probe-agent"))
    def notifier(run: kx.Run) -> None:
        with run.step("notify"):
            send("gus@example.org")

    handle = notifier.start(run_id=rid, store=store)
    assert tool.entered.wait(WAIT)
    handle.force_stop(cut_calls=True)
    assert handle.wait(WAIT) == Status.SUSPENDED
    assert probe_for(send.tool) is None
    assert settle_unknowns(rid, store) == []
    assert len(store.open_unknowns(rid)) == 1


if __name__ == "__main__":
    sys.exit(worker_main())
