"""The run engine end to end: @kx.agent, .start(), kx.resume() on a real DuckDB file."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

import kernelext as kx
from kernelext._core.process.runtime import runtime
from kernelext._store import Store
from kernelext.errors import AgentError

WAIT = 60.0
REPO_ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.both_backends


def name(prefix: str) -> str:
    """A unique agent name, so that agents of different tests never mix."""
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def kinds(store: Store, run_id: str) -> list[str]:
    return [e["kind"] for e in store.events(run_id)]


# -- a plain run -----------------------------------------------------------------------
def test_run_to_completion_records_steps_events_and_result(store: Store) -> None:
    @kx.agent(name=name("plain"))
    def plain(run: kx.Run, n: int) -> int:
        for i in run.steps(range(n)):
            run.state["total"] = run.state.get("total", 0) + i
        return int(run.state["total"])

    handle = plain.start(5, run_id="plain-1")
    assert isinstance(handle, kx.Handle)
    assert handle.wait(WAIT) == "completed"
    assert handle.result == 10
    steps = store.steps("plain-1")
    assert [(s["ordinal"], s["key"], s["status"]) for s in steps] == [
        (i, str(i), "completed") for i in range(5)
    ]
    assert all(s["snapshot_id"] is not None for s in steps)
    assert kinds(store, "plain-1") == ["created", "completed"]
    row = store.get_run("plain-1")
    assert (row["status"], row["completed_steps"]) == ("completed", 5)
    listed = kx.runs()
    assert list(listed["id"]) == ["plain-1"]
    assert list(kx.runs("completed")["id"]) == ["plain-1"]
    assert len(kx.runs("suspended")) == 0


def test_exception_in_a_step_fails_the_run_and_the_step(store: Store) -> None:
    @kx.agent(name=name("boom"))
    def boom(run: kx.Run) -> None:
        with run.step("fine"):
            run.state["fine"] = True
        with run.step("broken"):
            raise ValueError("the API said no")

    handle = boom.start(run_id="boom-1")
    assert handle.wait(WAIT) == "failed"
    assert isinstance(handle.error, ValueError)
    row = store.get_run("boom-1")
    assert "the API said no" in row["reason"]
    steps = {s["key"]: s for s in store.steps("boom-1")}
    assert steps["fine"]["status"] == "completed"
    assert steps["broken"]["status"] == "failed"
    assert "ValueError: the API said no" in steps["broken"]["error"]


def test_start_with_a_taken_run_id_is_refused(store: Store) -> None:
    @kx.agent(name=name("dup"))
    def dup(run: kx.Run) -> None:
        run.state["x"] = 1

    assert dup.start(run_id="dup-1").wait(WAIT) == "completed"
    with pytest.raises(kx.RunStateError, match=r"already exists.*kx\.resume\('dup-1'\)"):
        dup.start(run_id="dup-1")


def test_a_step_key_used_twice_is_a_clear_error(store: Store) -> None:
    @kx.agent(name=name("twice"))
    def twice(run: kx.Run) -> None:
        for _ in run.steps([1, 1], key=lambda item: item):
            pass

    handle = twice.start(run_id="twice-1")
    assert handle.wait(WAIT) == "failed"
    assert isinstance(handle.error, kx.KernelextError)
    assert "used twice" in str(handle.error)


# -- resume ----------------------------------------------------------------------------
def test_resume_skips_completed_steps_by_key_not_position(store: Store) -> None:
    bodies: list[str] = []
    stop_after = {"b", "f"}

    @kx.agent(name=name("bykey"))
    def by_key(run: kx.Run, items: list[dict[str, str]]) -> None:
        for item in run.steps(items, key=lambda t: t["id"]):
            bodies.append(item["id"])
            run.state.setdefault("seen", []).append(item["id"])
            if item["id"] in stop_after:
                kx.stop(run.id, source="test")

    items = [{"id": x} for x in "abcdef"]
    assert by_key.start(items, run_id="bykey-1").wait(WAIT) == "suspended"
    assert bodies == ["a", "b"]
    # The same items in reverse order: a and b are skipped by key although they
    # now sit at the last positions; the run stops again after f.
    reordered = list(reversed(items))
    assert kx.resume("bykey-1", args=(reordered,)).wait(WAIT) == "suspended"
    assert bodies == ["a", "b", "f"]
    final = kx.resume("bykey-1", args=(reordered,))
    assert final.wait(WAIT) == "completed"
    assert bodies == ["a", "b", "f", "e", "d", "c"]
    assert final.run.state == {"seen": ["a", "b", "f", "e", "d", "c"]}
    completed = [s["key"] for s in store.completed_steps("bykey-1")]
    assert sorted(completed) == list("abcdef")
    ordinals = [s["ordinal"] for s in store.completed_steps("bykey-1")]
    assert len(set(ordinals)) == len(ordinals), "each completed step has its own ordinal"


def agent_source(agent_name: str) -> Any:
    """A deterministic agent that changes many kinds of state at every step."""

    @kx.agent(name=agent_name)
    def worker(run: kx.Run, n: int, stop_at: list[int]) -> dict[str, Any]:
        for i in run.steps(range(n)):
            state = run.state
            state["count"] = state.get("count", 0) + 1
            state.setdefault("log", []).append({"i": i, "sq": i * i})
            state["last"] = f"item {i}"
            state.setdefault("by_parity", {"even": 0, "odd": 0})
            state["by_parity"]["even" if i % 2 == 0 else "odd"] += i
            if i % 5 == 0:
                state["fives"] = [*state.get("fives", []), i]
            if i in stop_at:
                kx.stop(run.id, source="test")
        return dict(run.state)

    return worker


def test_resumed_state_equals_uninterrupted_state(store: Store, store_path: Path) -> None:
    worker = agent_source(name("equal"))
    straight = worker.start(20, [], run_id="straight")
    assert straight.wait(WAIT) == "completed"
    expected = straight.result

    handle = worker.start(20, [3, 4, 11, 17], run_id="bumpy")
    resumes = 0
    while handle.wait(WAIT) == "suspended":
        resumes += 1
        # Each resume starts from the store alone: close it and open it again.
        runtime().settings.close()
        kx.open_store(str(store_path))
        handle = kx.resume("bumpy")
    assert handle.status == "completed"
    assert resumes == 4
    assert handle.result == expected
    reopened = runtime().settings.store()
    assert [s["key"] for s in reopened.completed_steps("bumpy")] == [str(i) for i in range(20)]
    assert kinds(reopened, "bumpy").count("resumed") == 4


def test_with_step_bodies_are_skipped_on_resume_and_tracing_is_restored(store: Store) -> None:
    bodies: list[str] = []
    observed: list[dict[str, Any]] = []

    @kx.agent(name=name("manual"))
    def manual(run: kx.Run) -> None:
        calls: list[str] = []

        def tracer(frame: Any, event: str, arg: Any) -> None:
            if event == "call":
                calls.append(frame.f_code.co_name)

        def probe() -> int:
            return 1

        previous = sys.gettrace()
        sys.settrace(tracer)
        try:
            with run.step("a"):
                bodies.append("a")
                run.state["a"] = 1
            for i in range(3):
                with run.step(f"loop-{i}"):
                    bodies.append(f"loop-{i}")
                    run.state[f"loop-{i}"] = i
                    if i == 1 and "stopped" not in run.state:
                        run.state["stopped"] = True
                        kx.stop(run.id, source="test")
                bodies.append(f"after-{i}")
            still_tracing = sys.gettrace() is tracer
            frame_clean = sys._getframe().f_trace is None
            probe()
            try:
                raise KeyError("handled in the agent")
            except KeyError:
                bodies.append("caught")
            with run.step("z"):
                bodies.append("z")
            observed.append(
                {
                    "tracing": still_tracing,
                    "frame_clean": frame_clean,
                    "probe_traced": "probe" in calls,
                }
            )
        finally:
            sys.settrace(previous)

    handle = manual.start(run_id="manual-1")
    assert handle.wait(WAIT) == "suspended"
    assert bodies == ["a", "loop-0", "after-0", "loop-1", "after-1"]
    bodies.clear()
    main_trace = sys.gettrace()
    resumed = kx.resume("manual-1")
    assert resumed.wait(WAIT) == "completed", resumed.error
    assert bodies == ["after-0", "after-1", "loop-2", "after-2", "caught", "z"]
    assert observed == [{"tracing": True, "frame_clean": True, "probe_traced": True}]
    assert sys.gettrace() is main_trace
    assert resumed.run.state == {"a": 1, "loop-0": 0, "loop-1": 1, "loop-2": 2, "stopped": True}


def test_code_change_is_refused_unless_allowed(store: Store) -> None:
    agent_name = name("changing")

    @kx.agent(name=agent_name)
    def v1(run: kx.Run) -> None:
        for i in run.steps(range(3)):
            run.state["v"] = 1
            if i == 0:
                kx.stop(run.id)

    assert v1.start(run_id="change-1").wait(WAIT) == "suspended"

    @kx.agent(name=agent_name)
    def v2(run: kx.Run) -> None:
        for _ in run.steps(range(3)):
            run.state["v"] = 2

    assert v2.fingerprint != v1.fingerprint
    with pytest.raises(kx.CodeChangedError, match=r"allow_code_change=True") as refused:
        kx.resume("change-1")
    assert v1.fingerprint in str(refused.value) and v2.fingerprint in str(refused.value)
    assert store.get_run("change-1")["status"] == "suspended"
    handle = kx.resume("change-1", allow_code_change=True)
    assert handle.wait(WAIT) == "completed"
    assert handle.run.state == {"v": 2}
    assert store.get_run("change-1")["fingerprint"] == v2.fingerprint


@pytest.mark.parametrize(
    ("final", "says"),
    [
        ("completed", "already completed"),
        ("cancelled", r"was cancelled.*kx\.restart"),
        ("expired", r"expired.*kx\.restart\('final-1'\)"),
    ],
)
def test_resuming_a_final_run_is_a_clear_error(store: Store, final: str, says: str) -> None:
    @kx.agent(name=name("final"))
    def finishing(run: kx.Run) -> None:
        for i in run.steps(range(2)):
            if i == 0 and final != "completed":
                kx.stop(run.id)

    handle = finishing.start(run_id="final-1")
    handle.wait(WAIT)
    if final != "completed":
        # What kx.cancel / the expiry sweeper do to the row.
        assert store.transition("final-1", final, ("suspended",), kind=final).ok
    assert store.get_run("final-1")["status"] == final
    with pytest.raises(kx.RunStateError, match=says):
        kx.resume("final-1")
    assert store.get_run("final-1")["status"] == final
    assert "resumed" not in kinds(store, "final-1")


@pytest.mark.duckdb_only
def test_resuming_an_unknown_run_is_run_not_found(store: Store) -> None:
    with pytest.raises(kx.RunNotFound, match=r"no-such-run.*kx\.runs\(\)"):
        kx.resume("no-such-run")


def test_resuming_a_run_that_is_executing_here_is_refused(store: Store) -> None:
    entered, go = threading.Event(), threading.Event()

    @kx.agent(name=name("busy"))
    def busy(run: kx.Run) -> None:
        with run.step("wait"):
            entered.set()
            go.wait(WAIT)

    handle = busy.start(run_id="busy-1")
    assert entered.wait(WAIT)
    try:
        with pytest.raises(kx.RunStateError, match="already executing"):
            kx.resume("busy-1")
    finally:
        go.set()
    assert handle.wait(WAIT) == "completed"


# -- arguments that are not JSON -----------------------------------------------------
class Config:
    """Not JSON: such arguments are not stored with the run."""

    def __init__(self, items: list[int]) -> None:
        self.items = items


@pytest.mark.duckdb_only
def test_non_json_arguments_resume_in_the_same_process(store: Store) -> None:
    @kx.agent(name=name("objarg"))
    def with_object(run: kx.Run, config: Config) -> None:
        for i in run.steps(config.items):
            run.state.setdefault("done", []).append(i)
            if i == 2:
                kx.stop(run.id)

    handle = with_object.start(Config([1, 2, 3, 4]), run_id="objarg-1")
    assert handle.wait(WAIT) == "suspended"
    assert store.get_run("objarg-1")["args"] is None
    resumed = kx.resume("objarg-1")
    assert resumed.wait(WAIT) == "completed"
    assert resumed.run.state == {"done": [1, 2, 3, 4]}


AGENT_MODULE = """
import kernelext as kx


class Config:
    def __init__(self, items):
        self.items = items


@kx.agent(name="objarg-xproc")
def with_object(run, config):
    for i in run.steps(config.items):
        run.state.setdefault("done", []).append(i)
        if i == 2:
            kx.stop(run.id)
"""

OTHER_PROCESS = """
import json, sys
sys.path.insert(0, sys.argv[1])
import kernelext as kx
from kernelext.errors import AgentError
import objarg_agent as mod

kx.open_store(sys.argv[2])
out = {}
try:
    kx.resume("xproc-1")
except AgentError as exc:
    out["error"] = str(exc)
handle = kx.resume("xproc-1", args=(mod.Config([1, 2, 3, 4]),))
out["status"] = handle.wait(60)
out["state"] = handle.run.state
print(json.dumps(out))
"""


def test_non_json_arguments_give_a_clear_error_in_another_process(
    store: Store, store_path: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "agentmod"
    folder.mkdir()
    (folder / "objarg_agent.py").write_text(textwrap.dedent(AGENT_MODULE))
    sys.path.insert(0, str(folder))
    try:
        import objarg_agent as mod  # type: ignore[import-not-found]

        handle = mod.with_object.start(mod.Config([1, 2, 3, 4]), run_id="xproc-1")
        assert handle.wait(WAIT) == "suspended"
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("objarg_agent", None)
    runtime().settings.close()  # hand the file to the other process
    done = subprocess.run(
        [sys.executable, "-c", OTHER_PROCESS, str(folder), str(store_path)],
        capture_output=True,
        text=True,
        timeout=WAIT * 2,
        cwd=REPO_ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert "not JSON" in out["error"]
    assert "kx.resume('xproc-1', args=(...)" in out["error"]
    assert out["status"] == "completed"
    assert out["state"] == {"done": [1, 2, 3, 4]}
    # AgentError is what a missing agent or missing arguments raise.
    assert issubclass(AgentError, kx.KernelextError)
