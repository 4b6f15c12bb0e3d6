"""``kx.Run`` is a façade: the agent methods only, the engine behind it private.

The object an agent receives (and ``h.run``) has exactly the documented agent methods;
no engine name (the store, the ledger rows, the stop flag, the forced-stop gate, the step
bookkeeping) is reachable on it. kernelext gets the engine with ``engine_of(run)``.
"""

from __future__ import annotations

import inspect
import threading
import time
from typing import Any

import pytest
from support.live import name

import kernelext as kx
from kernelext._core.engine.forced_stop import ForceGate
from kernelext._core.engine.run_engine import RunEngine
from kernelext._core.lifecycle.run import AGENT_API, engine_of
from kernelext._store import Store

WAIT = 60.0

# The agent API of issue 20 (the design contract's names), written out: adding a name to
# the façade is a decision, made here as well.
AGENT_METHODS = {
    "amap",
    "ask",
    "checkpoint",
    "claim",
    "credential",
    "fact",
    "id",
    "map",
    "state",
    "step",
    "steps",
    "stop_requested",
    "suspend",
}

# What the old ``Run`` carried besides: none of it may be reachable on the façade.
ENGINE_NAMES = {
    "agent",
    "begin_step",
    "completed",
    "critical",
    "current",
    "effects",
    "enforce_stop",
    "epoch",
    "facade",
    "finish_open_step",
    "force",
    "forced",
    "force_wanted",
    "key_scheme",
    "last_completed",
    "listeners",
    "loop",
    "max_step_seconds",
    "next_call",
    "notify",
    "overrunning_after_force",
    "poll_external_stop",
    "run_id",
    "safe_point",
    "seal",
    "snapshotter",
    "stop_event",
    "stop_source",
    "store",
    "suspend_request",
    "thread_id",
    "total_steps",
    "try_force",
}


def public(obj: Any) -> set[str]:
    return {n for n in dir(obj) if not n.startswith("_")}


def test_the_class_has_the_agent_methods_only() -> None:
    assert public(kx.Run) == AGENT_METHODS == set(AGENT_API)
    assert not ENGINE_NAMES & public(kx.Run)


def test_every_agent_method_is_documented_with_an_example() -> None:
    for attr in sorted(AGENT_METHODS):
        doc = inspect.getdoc(getattr(kx.Run, attr)) or ""
        assert doc, f"kx.Run.{attr} has no docstring"
        assert "::\n\n    " in doc, f"kx.Run.{attr}'s docstring shows no example"
        assert "run." in doc.split("::", 1)[1], f"kx.Run.{attr}'s example does not use run"


def test_the_run_an_agent_receives_is_the_facade_and_nothing_more(store: Store) -> None:
    seen: dict[str, Any] = {}

    @kx.agent(name=name("facade"))
    def agent(run: kx.Run) -> int:
        seen["run"] = run
        seen["public"] = public(run)
        seen["engine"] = {n for n in ENGINE_NAMES if hasattr(run, n)}
        try:
            run.store = store  # type: ignore[attr-defined]
        except AttributeError:
            seen["settable"] = False
        else:
            seen["settable"] = True
        for item in run.steps([1, 2]):
            run.state[str(item)] = item
        with run.step("last"):
            run.checkpoint()
        return len(run.state)

    h = agent.start()
    assert h.wait(WAIT) == "completed" and h.result == 2
    run = seen["run"]
    assert type(run) is kx.Run and h.run is run
    assert seen["public"] == AGENT_METHODS
    assert seen["engine"] == set() and seen["settable"] is False
    engine = engine_of(run)
    assert isinstance(engine, RunEngine) and engine.facade is run
    assert run.id == engine.id == h.run_id and run.state is engine.state
    assert repr(run) == f"<kernelext run {h.run_id!r}>"


def test_the_engine_is_had_from_a_facade_only() -> None:
    with pytest.raises(TypeError, match=r"kx\.Run"):
        engine_of(object())  # type: ignore[arg-type]


def test_the_facade_attaches_itself_and_an_engine_without_one_says_so(store: Store) -> None:
    """The engine never makes its façade (run_engine imports no run.py): ``Run(engine)``
    attaches itself; an engine nothing made a ``Run`` of (an item in a worker process)
    refuses to hand one out instead of inventing it."""
    run_id = name("bare")
    assert store.create_run(run_id, "bare")
    engine = RunEngine(store, run_id, "bare", max_step_seconds=None)
    with pytest.raises(RuntimeError, match="no façade"):
        _ = engine.facade
    run = kx.Run(engine)
    assert engine.facade is run and engine_of(run) is engine


def test_a_skipped_step_block_exposes_no_engine(store: Store) -> None:
    blocks: list[Any] = []
    attempts: list[int] = []

    @kx.agent(name=name("skip"))
    def agent(run: kx.Run) -> None:
        attempts.append(1)
        with run.step("once") as block:
            blocks.append(block)
            run.state["done"] = True
        if len(attempts) == 1:
            run.suspend("other")

    h = agent.start()
    assert h.wait(WAIT) == "suspended"
    assert kx.resume(h.run_id).wait(WAIT) == "completed"
    # the second time the body was skipped: the block is entered once only
    assert len(blocks) == 1
    assert not ENGINE_NAMES & public(blocks[0]) and "engine" not in public(blocks[0])


def test_the_gate_raises_once_and_never_inside_a_critical_section() -> None:
    landed: list[str | None] = []
    gate = ForceGate(landed.append)
    ready, caught = threading.Event(), threading.Event()
    in_section = threading.Event()
    leave, section_done = threading.Event(), threading.Event()

    def worker() -> None:
        gate.thread_id = threading.get_ident()
        ready.set()
        try:
            with gate.critical():  # bookkeeping: nothing lands here
                in_section.set()
                leave.wait(WAIT)
                section_done.set()
            for _ in range(6000):  # the agent's code, pure Python: the stop lands here
                time.sleep(0.01)
        except kx.ForcedStop:
            caught.set()

    assert gate.try_raise() is False  # no worker thread yet
    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    assert ready.wait(WAIT) and in_section.wait(WAIT)
    assert gate.try_raise() is False and not gate.raised  # inside a critical section
    leave.set()
    deadline = time.monotonic() + WAIT
    while not gate.try_raise():
        assert time.monotonic() < deadline, "the section never closed"
        time.sleep(0.005)
    assert caught.wait(WAIT) and gate.raised and section_done.is_set()
    thread.join(WAIT)
    assert gate.try_raise() is False  # once per run
    with pytest.raises(kx.ForcedStop):
        gate.check("a safe point")  # landed and swallowed by the worker: raised again here
    assert landed == ["a safe point"]
