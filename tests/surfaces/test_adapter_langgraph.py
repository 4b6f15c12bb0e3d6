"""``kx.langgraph``: LangGraph graphs as kernelext runs, against the real ``langgraph``.

* ``KernelextSaver`` passes LangGraph's own conformance suite
  (``langgraph-checkpoint-conformance``) on DuckDB and on PostgreSQL: every base
  capability and the three extended ones (``delete_for_runs``, ``copy_thread``, ``prune``).
* A stop lands at the next superstep boundary; ``kx.resume`` continues from the
  checkpoint. (``interrupt()`` and its answers: ``test_adapter_langgraph_questions.py``.)
* In real kernels: a ``ToolNode`` whose tool POSTs to the local delivery server, cut
  mid-node by the panel's Stop + Force stop and resumed, delivers each order exactly once;
  the same graph with LangGraph's ``SqliteSaver``, cut by the notebook's interrupt button
  and invoked again, delivers the orders twice (the node runs again from its start). A
  kernel SIGKILLed while the tools are in flight: a fresh kernel registers the graph again,
  the resume stops in ``needs_decision``, the calls are reconciled, nothing is repeated.
"""

from __future__ import annotations

import ast
import asyncio
import json
import threading
from pathlib import Path
from typing import Any, TypedDict

import pytest
from support.fresh_python import printed_by_fresh_python
from support.http_server import DeliveryServer
from support.kernels import KernelSession
from support.live import wait_until

import kernelext as kx
from kernelext._adapters import langgraph as kx_langgraph
from kernelext._adapters.langgraph_saver import KernelextSaver
from kernelext._store import Store, open_store
from kernelext.status import EffectStatus, Status

TESTS_DIR = Path(__file__).resolve().parents[1]
ALL_CAPABILITIES = {
    "put",
    "put_writes",
    "get_tuple",
    "list",
    "delete_thread",
    "delete_for_runs",
    "copy_thread",
    "prune",
}


# -- LangGraph's conformance suite -------------------------------------------------------------
def conformance(store: Store) -> dict[str, Any]:
    from langgraph.checkpoint.conformance import checkpointer_test, validate

    @checkpointer_test(name="KernelextSaver")
    async def saver() -> Any:
        yield KernelextSaver(store)

    report = asyncio.run(validate(saver))
    assert report.passed_all_base(), json.dumps(report.to_dict(), indent=1)
    return dict(report.to_dict()["results"])


def assert_every_capability_passes(results: dict[str, Any]) -> None:
    passed = {name for name, r in results.items() if r["detected"] and r["passed"]}
    assert passed == ALL_CAPABILITIES, json.dumps(results, indent=1)
    assert all(r["tests_failed"] == 0 and r["tests_passed"] > 0 for r in results.values())


def test_conformance_on_duckdb(store: Store) -> None:
    assert_every_capability_passes(conformance(store))


@pytest.mark.postgres
def test_conformance_on_postgresql(postgres_url: str) -> None:
    store = open_store(postgres_url)
    try:
        assert_every_capability_passes(conformance(store))
    finally:
        store.close()


def test_metadata_is_stored_with_secrets_scrubbed(store: Store) -> None:
    saver = KernelextSaver(store)
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": "", "api_key": "sk-live-123"}}
    checkpoint = {"v": 1, "id": "1", "ts": "now", "channel_values": {}, "channel_versions": {}}
    checkpoint |= {"versions_seen": {}, "updated_channels": None}
    saver.put(config, checkpoint, {"source": "input", "step": -1, "parents": {}}, {})  # type: ignore[arg-type]
    (text,) = store.read("SELECT metadata FROM langgraph_checkpoints")[0]
    assert "sk-live-123" not in text and json.loads(text)["api_key"] == "***redacted***"
    assert saver.get_tuple({"configurable": {"thread_id": "t"}}) is not None


# -- stop and resume (in this process) ---------------------------------------------------------
class Log(TypedDict):
    log: list[str]


def test_stop_lands_at_the_next_superstep_boundary(store: Store) -> None:
    from langgraph.graph import END, START, StateGraph

    entered, release, ran = threading.Event(), threading.Event(), []

    def node(name: str) -> Any:
        def body(state: Log) -> Log:
            ran.append(name)
            if name == "a":
                entered.set()
                assert release.wait(30)
            return {"log": [*state["log"], name]}

        return body

    builder = StateGraph(Log)
    for name in "abc":
        builder.add_node(name, node(name))
    builder.add_edge(START, "a")
    builder.add_edge("a", "b")
    builder.add_edge("b", "c")
    builder.add_edge("c", END)
    handle = kx_langgraph.start(builder.compile(), {"log": []}, run_id="lg-boundary")
    assert entered.wait(30)
    assert handle.stop(source="test") == Status.STOPPING
    release.set()
    assert handle.wait(30) == Status.SUSPENDED
    assert ran == ["a"]  # node a finished its superstep; b never started
    tuple_ = KernelextSaver(store).get_tuple({"configurable": {"thread_id": "lg-boundary"}})
    assert tuple_ is not None and tuple_.checkpoint["channel_values"]["log"] == ["a"]
    resumed = kx.resume("lg-boundary")
    assert resumed.wait(30) == Status.COMPLETED
    assert ran == ["a", "b", "c"] and resumed.result == {"log": ["a", "b", "c"]}
    steps = store.steps("lg-boundary")
    assert [s["name"] for s in steps if s["status"] == "completed"][-3:] == ["a", "b", "c"]


# -- in real kernels: cut mid-node, resumed -----------------------------------------------------
SETUP = """
import os, sys, time
sys.path.insert(0, {tests!r})
from support.langgraph_graphs import build_graph, orders_input
URL, GATE = {url!r}, {gate!r}
"""

KERNELEXT_RUN = """
import kernelext as kx
from kernelext._adapters import langgraph as kx_langgraph
from kernelext.widgets import panel_for
graph = build_graph(URL, GATE)
h = kx_langgraph.start(graph, orders_input("A", "B"), run_id="lg-kernel", max_step_seconds=0.2)
panel = panel_for(h)
"""

PANEL_STOP = """
from kernelext._core.lifecycle.run import engine_of
panel.stop_button.click()    # Stop: lands at the next superstep boundary...
panel.force_button.click()   # ...Force stop: cancel the running superstep now
deadline = time.monotonic() + 30
while not engine_of(h.run).force.raised and time.monotonic() < deadline:
    time.sleep(0.01)
print(engine_of(h.run).force.raised)
"""


@pytest.fixture
def gate(tmp_path: Path) -> Path:
    """The file the tool waits for after it POSTed (its confirmation)."""
    return tmp_path / "confirmed"


def kernel_setup(server: DeliveryServer, gate: Path) -> str:
    return SETUP.format(tests=str(TESTS_DIR), url=server.url, gate=str(gate))


@pytest.mark.slow
def test_tool_node_stopped_mid_node_in_a_kernel_delivers_exactly_once(
    store_path: Path, delivery_server: DeliveryServer, gate: Path
) -> None:
    with KernelSession() as kernel:
        kernel.run(kernel_setup(delivery_server, gate)).ok()
        kernel.run(KERNELEXT_RUN).ok()
        delivery_server.wait_for(2, timeout=60)  # both orders POSTed; the tools wait
        assert kernel.run(PANEL_STOP).ok().stdout.split() == ["True"]
        gate.touch()  # the tool calls return; the forced stop cancels the ToolNode
        assert kernel.run("print(h.wait(60))").ok().stdout.split() == [Status.SUSPENDED]
        kernel.run("panel.resume_button.click(); h = panel.handle; print(h.wait(60))").ok()
        reply = kernel.run(
            "print(h.status, h.result['messages'][-1].content)\n"
            "store = kx.open_store()\n"
            "print(sorted((e['tool'], e['status'], e['step_key'].split('/')[-1]) for e in "
            "store.read_dicts(\"SELECT * FROM effects WHERE run_id = 'lg-kernel'\")))\n"
            "print([e['kind'] for e in h.events()])"
        ).ok()
    status, effects, kinds = reply.stdout.strip().splitlines()
    assert status == f"{Status.COMPLETED} done"
    applied = EffectStatus.APPLIED
    assert ast.literal_eval(effects) == [
        ("deliver", applied, "call_A"),
        ("deliver", applied, "call_B"),
    ]  # one ledger row per tool call, keyed by the model's tool call id
    assert ast.literal_eval(kinds)[-3:] == ["stop_forced", "resumed", Status.COMPLETED], kinds
    assert delivery_server.count(path="/orders/A") == 1
    assert delivery_server.count(path="/orders/B") == 1


SQLITE_RUN = """
import signal, sqlite3
from langgraph.checkpoint.sqlite import SqliteSaver
saver = SqliteSaver(sqlite3.connect({db!r}, check_same_thread=False))
graph = build_graph(URL, GATE, checkpointer=saver, record=False)
config = {{"configurable": {{"thread_id": "lg-sqlite"}}}}

def interrupted(signum, frame):  # the interrupt button; the tools may finish once it landed
    open(GATE, "w").close()
    raise KeyboardInterrupt
"""

SQLITE_INVOKE = """
signal.signal(signal.SIGINT, interrupted)  # for this cell (ipykernel restores its own after)
graph.invoke(orders_input("A", "B"), config, durability="sync")
"""


@pytest.mark.slow
def test_the_same_cut_with_langgraphs_sqlite_saver_delivers_again(
    tmp_path: Path, delivery_server: DeliveryServer, gate: Path
) -> None:
    """The contrast: LangGraph's own checkpointer keeps completed supersteps, but a node
    cut mid-way (the notebook's interrupt button here) runs again from its start, and its
    tool calls are made again."""
    with KernelSession() as kernel:
        kernel.run(kernel_setup(delivery_server, gate)).ok()
        kernel.run(SQLITE_RUN.format(db=str(tmp_path / "lg.sqlite"))).ok()
        request = kernel.send(SQLITE_INVOKE)
        delivery_server.wait_for(2, timeout=60)  # both orders POSTed; the tools wait
        kernel.interrupt()
        cut = kernel.collect(request, timeout=60)
        assert cut.status == "error" and cut.error is not None
        assert cut.error["ename"] == "KeyboardInterrupt"
        reply = kernel.run("print(graph.invoke(None, config)['messages'][-1].content)").ok()
    assert reply.stdout.strip() == "done"
    assert delivery_server.count(path="/orders/A") == 2  # delivered again
    assert delivery_server.count(path="/orders/B") == 2


# -- an optional extra -----------------------------------------------------------------------
def test_kernelext_imports_no_langgraph_and_a_missing_one_names_the_extra() -> None:
    script = (
        "import sys\n"
        "import kernelext, kernelext._adapters.langgraph as lg\n"
        "assert not any(m.split('.')[0] in ('langgraph', 'langchain_core') for m in sys.modules)\n"
        "sys.modules['langgraph'] = sys.modules['langchain_core'] = None  # not installed\n"
        "for use in (lambda: lg.KernelextSaver, lambda: lg.tool(len)):\n"
        "    try:\n"
        "        use()\n"
        "    except ImportError as exc:\n"
        "        print(exc)\n"
    )
    lines = printed_by_fresh_python(script).strip().splitlines()
    assert len(lines) == 2 and all("pip install 'kernelext[langgraph]'" in x for x in lines)


CRASH_RESUME = """
import kernelext as kx
from kernelext._adapters import langgraph as kx_langgraph
kx_langgraph.agent(build_graph(URL, GATE))  # a fresh kernel: register the graph again
h = kx.resume("lg-crash")
print(h.status)
for item in kx.reconcile("lg-crash"):  # each call was in flight when the kernel died
    item.mark_applied(result={"order": item.row["args"], "delivery": 0})
h = kx.resume("lg-crash")
print(h.wait(60), h.result["messages"][-1].content)
"""


@pytest.mark.slow
@pytest.mark.crash
def test_a_kernel_killed_mid_tool_node_resumes_in_a_fresh_kernel_through_reconciliation(
    store_path: Path, delivery_server: DeliveryServer, gate: Path
) -> None:
    with KernelSession() as kernel:
        kernel.run(kernel_setup(delivery_server, gate)).ok()
        kernel.run(
            "import kernelext as kx\n"
            "from kernelext._adapters import langgraph as kx_langgraph\n"
            "h = kx_langgraph.start(build_graph(URL, GATE), orders_input('A', 'B'), "
            "run_id='lg-crash')"
        ).ok()
        delivery_server.wait_for(2, timeout=60)  # both calls made, neither returned
        kernel.send("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
        wait_until(lambda: not kernel.km.is_alive(), "the kernel to die")
    gate.touch()
    with KernelSession() as fresh:
        fresh.run(kernel_setup(delivery_server, gate)).ok()
        lines = fresh.run(CRASH_RESUME).ok().stdout.split("\n")
    assert lines[0] == Status.NEEDS_DECISION  # unknown outcomes go to a person first
    assert lines[1] == f"{Status.COMPLETED} done"
    assert delivery_server.count(path="/orders/A") == 1
    assert delivery_server.count(path="/orders/B") == 1
